"""Server replies: their text made fit to keep, their enhanced status codes, their outcomes."""

from __future__ import annotations

import re
import smtplib

from bumail_queue.items import Outcome, RecipientStatus, Reply

#: The longest ``Reply.text`` kept, in characters.
MAX_REPLY_TEXT = 512
#: The longest reply line read, in octets without its CRLF: past it the session ends
#: (Postfix's ``line_length_limit``; RFC 5321 §4.5.3.1.5 asks for 512 at least).
MAX_REPLY_LINE = 2048
#: The most lines a reply may have: past it the session ends (Postfix bounds a reply too).
MAX_REPLY_LINES = 100

# RFC 3463 §2: class.subject.detail, read only at the start of the text.
_ENHANCED = re.compile(r"([245])\.([0-9]{1,3})\.([0-9]{1,3})(?=\s|$)")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BREAKS = re.compile(r"[\r\n]+")


def clean_reply_text(text: str) -> str:
    """Return ``text`` fit to keep: no NUL, no lone surrogate, one line, 512 characters at most."""
    text = _SURROGATE.sub("\ufffd", text.replace("\x00", ""))
    return _BREAKS.sub(" ", text).strip()[:MAX_REPLY_TEXT].rstrip()


def reply_from(code: int, raw: bytes | str) -> Reply:
    """Return the :class:`Reply` of a server's ``code`` and reply text (bytes as read)."""
    text = clean_reply_text(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
    match = _ENHANCED.match(text)
    if match and str(code)[:1] == match.group(1):
        status = match.group(0)
    else:
        status = f"{str(code)[:1]}.0.0" if 200 <= code < 600 else "4.5.0"
    return Reply(code=code, status=status, text=text)


def _status_of(code: int) -> RecipientStatus | None:
    """Return what a reply code decides for a recipient; ``None`` for no valid code."""
    if 200 <= code < 300:
        return RecipientStatus.DELIVERED
    if 400 <= code < 500:
        return RecipientStatus.DEFERRED
    if 500 <= code < 600:
        return RecipientStatus.FAILED
    return None


def _own(status: str, text: str) -> Reply:
    """Return a reply of ours (no server answered it)."""
    return Reply(code=None, status=status, text=clean_reply_text(text))


def _outcome(code: int, raw: bytes, *, names_recipient: bool = True) -> Outcome:
    """Return the outcome a reply decides (its code being a 2xx, 4xx or 5xx).

    ``names_recipient``: the reply answered one recipient's ``RCPT``, or ended a
    transaction of one recipient (``Outcome.names_recipient``).
    """
    status = _status_of(code)
    assert status is not None
    return Outcome(status=status, reply=reply_from(code, raw), names_recipient=names_recipient)


def _raw(error: smtplib.SMTPResponseException) -> bytes:
    """Return the reply text an smtplib exception carries, as the bytes read."""
    text = error.smtp_error
    return text if isinstance(text, bytes) else text.encode("utf-8", "replace")
