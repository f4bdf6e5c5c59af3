"""A queued message made a Django ``EmailMessage`` again, for an email backend.

The queue keeps a message as the RFC 5322 bytes it will send. A backend that sends
MIME itself (Django's SMTP backend, a backend of your own) gets those bytes unchanged
from ``message()``. A backend that calls an ESP's API (anymail's, django-ses's v2
``send_email`` with fields) reads the fields of an ``EmailMessage`` instead: the
subject, the text body, the HTML alternative, the attachments and the other header
fields, all read back from the bytes here with the standard library's ``email``.
"""

from __future__ import annotations

import email
import email.policy
import functools
import re
from collections.abc import Sequence
from email import encoders
from email.headerregistry import AddressHeader
from email.message import EmailMessage as MIMEMessage
from email.message import MIMEPart
from email.mime.base import MIMEBase
from email.utils import formataddr, getaddresses
from typing import Any, cast

import django
from django.core.mail import EmailMultiAlternatives

from bumail_queue.addresses import normal_address

# Header fields an EmailMessage writes from its own fields; every other one is kept
# as an extra header (Message-ID, Date, List-Unsubscribe, In-Reply-To, X-*...).
_LINE_ENDS = re.compile(rb"\r\n|\r|\n")
_FOLDS = re.compile(r"\r?\n(?=[ \t])")
_FROM_FIELDS = frozenset(
    {"from", "to", "cc", "bcc", "reply-to", "subject", "mime-version", "content-type", "content-transfer-encoding"}
)


@functools.lru_cache(maxsize=512)
def _parsed_header(name: str, value: str) -> Any:
    return email.policy.default.header_fetch_parse(name, value)


class _ReadingPolicy(email.policy.EmailPolicy):
    """``email.policy.default``, each header field parsed once.

    The default policy parses a field again at every read, and reading a message
    back reads its ``Content-Type`` a dozen times (finding the body, its charset, the
    attachments) and each address field twice: half the worker's time on a backend
    route went there. A parsed field depends on its name and text alone, so one
    parse serves every read; the fields are immutable values, shared safely.
    """

    def header_fetch_parse(self, name: str, value: str) -> Any:
        if hasattr(value, "name"):  # already a parsed field (one the program set)
            return value
        return _parsed_header(name, value)


_READING = _ReadingPolicy()


class QueuedMessage(EmailMultiAlternatives):
    """The queued message ``raw``, for ``recipients`` only, from ``sender``.

    ``to`` and ``cc`` are the message's own ``To`` and ``Cc`` addresses that are among
    ``recipients`` (an ESP writes both the header and the envelope from them); the
    other recipients go as ``bcc``. ``envelope_sender`` is the queue's sender (the
    return path) where it is not the ``From`` address, which anymail passes to the
    ESPs that take one.
    """

    def __init__(self, raw: bytes, *, sender: str, recipients: Sequence[str]) -> None:
        parsed = cast(MIMEMessage, email.message_from_bytes(raw, _class=MIMEMessage, policy=_READING))
        fields = _Fields(parsed)
        wanted = {normal_address(r): r for r in recipients}
        to = _listed(fields.addresses("To"), wanted)
        cc = _listed(fields.addresses("Cc"), wanted)
        listed = {key for key, _ in (*to, *cc)}
        bcc = [r for key, r in wanted.items() if key not in listed]
        super().__init__(
            subject=fields.text("Subject"),
            body=_text_of(parsed, "plain") or "",
            from_email=fields.text("From", sender),
            to=[shown for _, shown in to],
            cc=[shown for _, shown in cc],
            bcc=bcc,
            reply_to=[shown for _, shown in fields.addresses("Reply-To")],
            headers={name: fields.text(name) for name in fields.others()},
        )
        html = _text_of(parsed, "html")
        if html is not None:
            self.attach_alternative(html, "text/html")
        for part in parsed.iter_attachments():
            self._attach_part(part)
        # Only where it differs from From: several ESPs take no other (anymail then
        # refuses the message as asking a feature they lack).
        if sender and normal_address(sender) not in {normal_address(a) for a, _ in fields.addresses("From")}:
            self.envelope_sender = sender
        self._queued = _Queued(raw, parsed)

    def _attach_part(self, part: MIMEPart) -> None:
        if part.get("Content-ID"):
            # Inline, referred to by its Content-ID: the part itself keeps it (Django 6
            # takes a MIMEPart; Django 5.2 only the older MIMEBase).
            self.attach(part if django.VERSION >= (6,) else _mime_base(part))
        else:
            content = part.get_content()
            if isinstance(content, str):
                content = content.replace("\r\n", "\n")  # as it was given: CRLF is the wire's
            self.attach(part.get_filename(), content, part.get_content_type())

    def message(self, *args: Any, **kwargs: Any) -> Any:
        """The queued message itself: ``as_bytes()`` gives the bytes it was queued as."""
        return self._queued


class _Queued:
    """The queued message as a backend that sends MIME reads it (``message()``): its
    header fields as the parsed message has them, and its bytes unchanged but for
    line endings made CRLF, as SMTP wants them (Django's SMTP backend hands them to
    ``smtplib`` as they are)."""

    def __init__(self, raw: bytes, parsed: MIMEMessage) -> None:
        self._raw = raw
        self._parsed = parsed

    def as_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        text = _LINE_ENDS.sub(b"\r\n", self._raw)
        return text if text.endswith(b"\r\n") else text + b"\r\n"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parsed, name)

    def __getitem__(self, name: str) -> Any:
        return self._parsed[name]


class _Fields:
    """The message's header fields as text, each parsed only where its text needs it.

    A field of plain ASCII (most Subjects, Date, Message-ID, ``Name <a@example.com>``)
    is taken as written, unfolded, and an address list split with
    ``email.utils.getaddresses``: parsing them with the header registry would give the
    same text at many times the cost, and an address field was most of a message's.
    A field with encoded words or raw 8-bit text, or an address list with a group or a
    comment, is parsed, which decodes it. The first of a repeated field counts.
    """

    def __init__(self, parsed: MIMEMessage) -> None:
        self._parsed = parsed
        self._raw: dict[str, tuple[str, str]] = {}
        for name, value in parsed.raw_items():
            self._raw.setdefault(name.lower(), (name, str(value)))

    def text(self, name: str, default: str = "") -> str:
        found = self._raw.get(name.lower())
        if found is None:
            return default
        written, raw = found
        return str(self._parsed.policy.header_fetch_parse(written, raw)) if _needs_decoding(raw) else _unfold(raw)

    def addresses(self, name: str) -> list[tuple[str, str]]:
        """Each address of field ``name``: its address proper, and as written (with its
        display name)."""
        found = self._raw.get(name.lower())
        if found is None:
            return []
        written, raw = found
        if _needs_decoding(raw) or any(c in raw for c in ":;()"):
            header = self._parsed.policy.header_fetch_parse(written, raw)
            if not isinstance(header, AddressHeader):
                return []
            return [(a.addr_spec, str(a)) for a in header.addresses if a.addr_spec]
        return [(addr, formataddr((display, addr))) for display, addr in getaddresses([_unfold(raw)]) if addr]

    def others(self) -> list[str]:
        """The fields an ``EmailMessage`` does not write from its own fields."""
        return [written for key, (written, _) in self._raw.items() if key not in _FROM_FIELDS]


def _needs_decoding(text: str) -> bool:
    return "=?" in text or not text.isascii()


def _unfold(text: str) -> str:
    return _FOLDS.sub("", text).strip()


def _mime_base(part: MIMEPart) -> MIMEBase:
    copy = MIMEBase(part.get_content_maintype(), part.get_content_subtype())
    copy.set_payload(part.get_payload(decode=True))
    encoders.encode_base64(copy)
    for name in ("Content-ID", "Content-Disposition"):
        if part.get(name):
            copy[name] = str(part[name])
    return copy


def _listed(addresses: list[tuple[str, str]], wanted: dict[str, str]) -> list[tuple[str, str]]:
    """Those of ``addresses`` that are among the recipients: each one's normal form, and
    the address as written (with its display name)."""
    found = []
    for address, shown in addresses:
        key = normal_address(address)
        if key in wanted:
            found.append((key, shown))
    return found


def _text_of(parsed: MIMEMessage, subtype: str) -> str | None:
    body = parsed.get_body(preferencelist=(subtype,))
    if body is None or body.get_content_subtype() != subtype:
        return None
    content = body.get_content()
    # As it was given: CRLF is the wire's line ending, not the text's.
    return content.replace("\r\n", "\n") if isinstance(content, str) else None
