"""``INBOUND_MAILBOXES``: the mailboxes ``queue_inbound --imap``/``--pop3`` fetches returned mail from.

Each key is the mailbox's URL, as the command names it: ``imaps://bounces@mail.example.com/INBOX``
(IMAP over TLS, port 993), ``imap://...`` (IMAP with STARTTLS, 143), ``pop3s://bounces@mail.example.com``
(POP3 over TLS, 995), ``pop3://...`` (POP3 with STLS, 110). The user name is the URL's (percent-encoded
when it holds an ``@``); the password is never in the URL, only in the entry's ``PASSWORD``. There is
no way to log in without TLS. No message repeats a password.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

from .validator import Validator

CHECK_ID: Final = "bumail_queue.E033"

#: The scheme of each URL: (protocol, TLS from the first octet (else STARTTLS/STLS), default port).
SCHEMES: Final[Mapping[str, tuple[str, bool, int]]] = {
    "imaps": ("imap", True, 993),
    "imap": ("imap", False, 143),
    "pop3s": ("pop3", True, 995),
    "pop3": ("pop3", False, 110),
}
AFTER_CHOICES: Final = ("delete", "move")
MAILBOX_KEYS: Final = frozenset({"PASSWORD", "AFTER", "MOVE_TO", "CA_FILE"})
URL_LIMIT: Final = 500  # the column that records the messages in flight


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InboundMailbox:
    """One entry of ``INBOUND_MAILBOXES``, read."""

    url: str
    protocol: str  # "imap" or "pop3"
    implicit_tls: bool  # TLS from the first octet; else STARTTLS (IMAP) or STLS (POP3)
    host: str
    port: int
    username: str
    folder: str  # IMAP's mailbox ("INBOX" when the URL names none); "" for POP3
    password: str = dataclasses.field(repr=False)
    after: str  # "delete" or "move"
    move_to: str | None  # IMAP's folder, with AFTER = "move"
    ca_file: str | None  # None: TLS_CA_FILE, else the system's trust store


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot name a mailbox, or ``None``; never repeats a password."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "it is not a URL with a host and a valid port"
    if parts.password is not None:
        return "it holds a password: give it in the entry's 'PASSWORD', never in the URL"
    if parts.scheme not in SCHEMES:
        return f"its scheme must be one of {', '.join(SCHEMES)}"
    if not parts.hostname or not parts.username:
        return "it must name a user and a host, such as imaps://bounces@mail.example.com/INBOX"
    if port == 0:
        return "its port must be from 1 to 65535"
    if parts.query or parts.fragment:
        return "it must have no query and no fragment"
    folder = urllib.parse.unquote(parts.path.lstrip("/"))
    if SCHEMES[parts.scheme][0] == "pop3" and folder:
        return "a POP3 URL names no folder"
    if any(c in folder for c in '\r\n"\\') or any(ord(c) < 32 for c in folder):
        return "its folder must be a plain name"
    if len(url) > URL_LIMIT:
        return f"it must be at most {URL_LIMIT} characters"
    return None


def shown_url(url: Any) -> str:
    """The URL as messages may show it: without any password it holds."""
    if not isinstance(url, str):
        return repr(url)
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return repr(url)
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        return repr(urllib.parse.urlunsplit(parts._replace(netloc=netloc)))
    except ValueError:
        return "a URL that cannot be read"


def check_mailboxes(check: Validator, raw: Mapping[str, Any]) -> None:
    mailboxes = raw.get("INBOUND_MAILBOXES", {})
    key = "INBOUND_MAILBOXES"
    if not isinstance(mailboxes, Mapping):
        check.add(CHECK_ID, key, f"BUMAIL_QUEUE['{key}'] must be a dict of mailbox URL to its settings.")
        return
    for url, entry in mailboxes.items():
        where = f"BUMAIL_QUEUE['{key}'][{shown_url(url)}]"
        problem = url_problem(url) if isinstance(url, str) else "it is not a string"
        if problem:
            check.add(CHECK_ID, key, f"{where}: the key must be a mailbox URL; {problem}.")
            continue
        if not isinstance(entry, Mapping):
            check.add(CHECK_ID, key, f"{where} must be a dict with 'PASSWORD' (and 'AFTER', 'MOVE_TO', 'CA_FILE').")
            continue
        _check_entry(check, where, url, entry)


def _check_entry(check: Validator, where: str, url: str, entry: Mapping[str, Any]) -> None:
    key = "INBOUND_MAILBOXES"
    unknown = sorted(map(str, set(entry) - MAILBOX_KEYS))
    if unknown:
        known = ", ".join(sorted(MAILBOX_KEYS))
        check.add(CHECK_ID, key, f"{where} has unknown keys {', '.join(map(repr, unknown))}; the keys are {known}.")
    if not isinstance(entry.get("PASSWORD"), str) or not entry["PASSWORD"]:
        check.add(CHECK_ID, key, f"{where}['PASSWORD'] must be a non-empty string.")
    after = entry.get("AFTER", "delete")
    if after not in AFTER_CHOICES:
        check.add(CHECK_ID, key, f"{where}['AFTER'] must be 'delete' or 'move'; got {after!r}.")
    move_to = entry.get("MOVE_TO")
    protocol = SCHEMES[urllib.parse.urlsplit(url).scheme][0]
    if after == "move" and protocol == "pop3":
        check.add(CHECK_ID, key, f"{where}['AFTER'] cannot be 'move': POP3 has no folders.")
    elif after == "move" and (not isinstance(move_to, str) or not move_to.strip() or '"' in move_to):
        check.add(CHECK_ID, key, f"{where}['MOVE_TO'] must name the folder to move to, such as 'Processed'.")
    elif after == "delete" and move_to is not None:
        check.add(CHECK_ID, key, f"{where}['MOVE_TO'] goes with 'AFTER': 'move' only.")
    ca_file = entry.get("CA_FILE")
    if ca_file is not None and not isinstance(ca_file, str | os.PathLike):
        check.add(CHECK_ID, key, f"{where}['CA_FILE'] must be a path, or None; got {type(ca_file).__name__}.")


def mailboxes_from(values: Mapping[str, Any]) -> dict[str, InboundMailbox]:
    """The checked ``INBOUND_MAILBOXES``, typed."""
    return {url: mailbox_from(url, entry) for url, entry in values.get("INBOUND_MAILBOXES", {}).items()}


def mailbox_from(url: str, entry: Mapping[str, Any]) -> InboundMailbox:
    parts = urllib.parse.urlsplit(url)
    protocol, implicit_tls, default_port = SCHEMES[parts.scheme]
    folder = urllib.parse.unquote(parts.path.lstrip("/"))
    ca_file = entry.get("CA_FILE")
    return InboundMailbox(
        url=url,
        protocol=protocol,
        implicit_tls=implicit_tls,
        host=parts.hostname or "",
        port=parts.port or default_port,
        username=urllib.parse.unquote(parts.username or ""),
        folder=(folder or "INBOX") if protocol == "imap" else "",
        password=entry["PASSWORD"],
        after=entry.get("AFTER", "delete"),
        move_to=entry.get("MOVE_TO"),
        ca_file=None if ca_file is None else os.fspath(ca_file),
    )
