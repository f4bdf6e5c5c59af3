"""One-click unsubscribe (RFC 8058, RFC 2369): the token, the URL and the header fields.

Mail of a channel named in ``UNSUBSCRIBE`` gets, for each recipient, a transaction of
its own whose message starts with two header fields::

    List-Unsubscribe: <https://www.example.com/mail/unsubscribe/TOKEN/>
    List-Unsubscribe-Post: List-Unsubscribe=One-Click

The token names the channel and the recipient's address, signed with ``SECRET_KEY``
through Django's ``signing`` (its own salt): ``<payload>:<signature>``, the payload
the URL-safe base64 of ``["newsletter", "ann@example.com"]`` and the signature 43
characters of an HMAC-SHA256. Reading it back needs no database, accepts the keys of
``SECRET_KEY_FALLBACKS`` (a key rotated breaks no link already mailed), and never
expires: a mailbox provider may post it days after the mail went. Nobody without the
key can make one that names an address, so a forged post unsubscribes nobody.

These are values and pure functions: the worker adds the fields (``worker.attempts``),
the view reads the token back (``feedback.unsubscribe``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

from django.core import signing

from bumail_queue.addresses import normal_address
from bumail_queue.items import CHANNEL_PATTERN

__all__ = ["ONE_CLICK", "Unsubscribing", "has_list_unsubscribe", "make_token", "read_token", "url_of", "with_fields"]

ONE_CLICK: Final = "List-Unsubscribe=One-Click"
"""RFC 8058 §3.1: the value of ``List-Unsubscribe-Post``, and the body a mailbox
provider posts to the URL."""

_SALT: Final = "bumail_queue.list_unsubscribe"
_HEADER_END = re.compile(rb"\r?\n\r?\n")
_LIST_UNSUBSCRIBE = re.compile(rb"^list-unsubscribe[ \t]*:", re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Unsubscribing:
    """What a token names: the channel the recipient leaves, and its address (normal form)."""

    channel: str
    address: str


def make_token(channel: str, address: str) -> str:
    """Return the token of ``address``'s mail of ``channel``, signed with ``SECRET_KEY``."""
    return _signer().sign_object([channel, normal_address(address)])


def read_token(token: str) -> Unsubscribing | None:
    """Return what ``token`` names, or ``None`` when it is not one of ours (forged,
    altered, cut short, or signed with a key that is neither ``SECRET_KEY`` nor one of
    its fallbacks)."""
    try:
        value = _signer().unsign_object(token)
    except (signing.BadSignature, ValueError, UnicodeError):
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(part, str) for part in value)):
        return None
    channel, address = value
    if not CHANNEL_PATTERN.fullmatch(channel) or "@" not in address:
        return None
    return Unsubscribing(channel=channel, address=address)


def url_of(base: str, channel: str, address: str) -> str:
    """Return the one-click URL of ``address``'s mail of ``channel``: ``base`` (the
    channel's ``URL``, ending in ``/``), the token, and a ``/``."""
    return f"{base}{make_token(channel, address)}/"


def has_list_unsubscribe(message: bytes) -> bool:
    """Return whether the header block of ``message`` has a ``List-Unsubscribe`` field."""
    end = _HEADER_END.search(message)
    return _LIST_UNSUBSCRIBE.search(message, 0, end.start() if end else len(message)) is not None


def with_fields(message: bytes, url: str) -> bytes:
    """Return ``message`` with ``List-Unsubscribe`` (``url``) and ``List-Unsubscribe-Post``
    before its header fields, in its own line ending; ``message`` itself when it has a
    ``List-Unsubscribe`` of its own (the application's, which it keeps)."""
    if has_list_unsubscribe(message):
        return message
    end = b"\r\n" if b"\r\n" in message[:4096] or b"\n" not in message[:4096] else b"\n"
    fields = b"List-Unsubscribe: <" + url.encode("ascii") + b">" + end
    return fields + b"List-Unsubscribe-Post: " + ONE_CLICK.encode("ascii") + end + message


def _signer() -> signing.Signer:
    # Signer's keys: SECRET_KEY to sign, and SECRET_KEY_FALLBACKS too to read back.
    return signing.Signer(salt=_SALT, algorithm="sha256")
