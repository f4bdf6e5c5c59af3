"""Turn what the caller gives (an ``EmailMessage`` or raw bytes) into the bytes to keep.

The bytes kept are the message as it will be sent: the ``Bcc`` header removed (its
addresses travel only in the envelope), ``Message-ID`` and ``Date`` added when
missing. A raw message's body is kept byte for byte; only its header block is touched.
"""

from __future__ import annotations

import dataclasses
import email.message
import email.policy
import email.utils
import io
import re
from collections.abc import Sequence
from datetime import datetime
from email.generator import BytesGenerator
from email.parser import HeaderParser
from typing import Any

from django.core.mail import EmailMessage

from .addresses import check_mailbox, check_sender
from .errors import ErrorCode, QueueError

_FIELD_NAME = re.compile(rb"[\x21-\x39\x3b-\x7e]+")
# What makes an address more than a bare addr-spec: a display name, a comment, a list.
_NEEDS_PARSING = re.compile(r'[\s<>()",;:\\\[\]]')


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Prepared:
    """A message ready for the store: its envelope and its bytes."""

    sender: str
    recipients: list[str]
    data: bytes


def _invalid(message: str) -> QueueError:
    return QueueError(ErrorCode.INVALID, message)


def _one_address(value: str, *, role: str) -> str:
    """Return the addr-spec of ``"Name <a@b>"`` or ``"a@b"``, checked as an SMTP mailbox."""
    if any(ch in value for ch in "\r\n"):
        raise _invalid(f"The {role} address {value!r} cannot be queued: it holds a CR or LF.")
    if not _NEEDS_PARSING.search(value):
        return check_mailbox(value, role=role)  # a bare addr-spec: nothing to take apart
    parsed = email.utils.getaddresses([value])
    if len(parsed) != 1 or not parsed[0][1]:
        raise _invalid(f"The {role} address {value!r} cannot be queued: it is not one email address.")
    return check_mailbox(parsed[0][1], role=role)


def envelope_recipients(values: Sequence[str]) -> list[str]:
    """Return the checked addr-specs of ``values``, duplicates dropped, order kept."""
    if isinstance(values, str):
        raise _invalid("Recipients must be a list of addresses, not one string.")
    addresses = [_one_address(v, role="recipient") for v in values if v]
    if not addresses:
        raise _invalid("The message has no recipient: give to, cc or bcc addresses.")
    return list(dict.fromkeys(addresses))


def envelope_sender(value: str | None) -> str:
    """Return the checked envelope sender; ``""`` (or ``"<>"``) is the null sender."""
    if value is None or value in ("", "<>"):
        return ""
    return check_sender(_one_address(value, role="sender"))


class _Generator(BytesGenerator):
    """Writes a short ASCII header field as it is, rather than folding it anew.

    Folding (``policy.fold_binary``) is most of the cost of flattening a message, and
    a field that fits on one line (RFC 5322 §2.1.1's 78 characters) comes out of it
    unchanged: Django has already encoded non-ASCII text (RFC 2047).
    """

    def _write_headers(self, msg: Any) -> None:
        out = self._fp  # type: ignore[attr-defined]  # BytesGenerator's own stream
        policy: Any = self.policy
        for name, value in msg.raw_items():
            if (
                isinstance(value, str)
                and value.isascii()
                and len(name) + len(value) <= 76
                and "\n" not in value
                and "\r" not in value
            ):
                out.write(f"{name}: {value}\r\n".encode("ascii"))
            else:
                out.write(policy.fold_binary(name, value))
        out.write(b"\r\n")


def _flatten(message: Any) -> bytes:
    # One generator for Django 5.2's compat32 messages and 6.x's email.message.EmailMessage.
    buffer = io.BytesIO()
    _Generator(buffer, mangle_from_=False, policy=message.policy.clone(linesep="\r\n")).flatten(message)
    return buffer.getvalue()


def from_email_message(
    message: EmailMessage, *, sender: str | None, recipients: Sequence[str] | None, hostname: str, now: datetime
) -> Prepared:
    """Prepare a Django ``EmailMessage`` (any subclass)."""
    try:
        built = message.message()
        data = _flatten(built)
    except (ValueError, UnicodeError, TypeError) as error:
        # Django's BadHeaderError (a header with CR/LF) is a ValueError.
        raise _invalid(f"The message cannot be queued: {error}") from error
    return Prepared(
        sender=envelope_sender(message.from_email if sender is None else sender),
        recipients=envelope_recipients(message.recipients() if recipients is None else recipients),
        data=finish_headers(data, hostname=hostname, now=now),
    )


def from_bytes(data: bytes, *, sender: str | None, recipients: Sequence[str] | None, hostname: str, now: datetime) -> Prepared:
    """Prepare raw RFC 5322 bytes; the envelope defaults to From and To/Cc/Bcc."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise _invalid(f"A message must be an EmailMessage or bytes, not {type(data).__name__}.")
    data = bytes(data)
    finished = finish_headers(data, hostname=hostname, now=now)  # refuses a malformed header first
    if sender is None or recipients is None:
        headers = _parse_headers(data)
        if sender is None:
            found = email.utils.getaddresses(headers.get_all("Sender", []) or headers.get_all("From", []))
            if not found or not found[0][1]:
                raise _invalid(
                    "The message has no Sender or From address to send it from: give sender=, "
                    "or sender='' for the null sender <>."
                )
            sender = found[0][1]
        if recipients is None:
            fields = [*headers.get_all("To", []), *headers.get_all("Cc", []), *headers.get_all("Bcc", [])]
            recipients = [addr for _, addr in email.utils.getaddresses(fields) if addr]
    return Prepared(
        sender=envelope_sender(sender),
        recipients=envelope_recipients(recipients),
        data=finished,
    )


def _parse_headers(data: bytes) -> email.message.Message:
    # Header fields may hold raw UTF-8 (RFC 6532): decode them as such, so that an
    # address like jörg@bücher.example reaches the envelope as written.
    text = data.decode("utf-8", errors="replace")
    return HeaderParser(policy=email.policy.compat32).parsestr(text)


def finish_headers(data: bytes, *, hostname: str, now: datetime) -> bytes:
    """Drop ``Bcc``, add ``Message-ID`` and ``Date`` when missing; keep the body as is."""
    eol = b"\r\n" if b"\r\n" in data.split(b"\n", 1)[0] + b"\n" else b"\n"
    end = data.find(eol + eol)
    if data.startswith(eol):
        head, body = b"", data
    elif end == -1:
        head, body = data, b""
    else:
        head, body = data[: end + len(eol)], data[end + len(eol) :]
    fields = _split_fields(head, eol)
    kept = [f for f in fields if _field_name(f) != b"bcc"]
    names = {_field_name(f) for f in kept}
    if b"message-id" not in names:
        kept.append(b"Message-ID: " + email.utils.make_msgid(domain=hostname).encode("ascii") + eol)
    if b"date" not in names:
        kept.append(b"Date: " + email.utils.format_datetime(now).encode("ascii") + eol)
    if not body.startswith(eol):
        body = eol + body
    return b"".join(kept) + body


def _split_fields(head: bytes, eol: bytes) -> list[bytes]:
    fields: list[bytes] = []
    lines = head.split(eol)
    if lines and lines[-1] == b"":
        lines.pop()
    for line in lines:
        if b"\r" in line or b"\n" in line:
            raise _invalid("The message cannot be queued: a header holds a bare CR or LF.")
        if b"\x00" in line:
            raise _invalid("The message cannot be queued: a header holds a NUL character.")
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += line + eol
            continue
        name, colon, _ = line.partition(b":")
        if not colon or not _FIELD_NAME.fullmatch(name):
            raise _invalid(f"The message cannot be queued: {line[:40]!r} is not a header field (RFC 5322 §2.2).")
        fields.append(line + eol)
    return fields


def _field_name(field: bytes) -> bytes:
    return field.partition(b":")[0].strip().lower()
