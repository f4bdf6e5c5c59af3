"""Turn what the caller gives (an ``EmailMessage`` or raw bytes) into the bytes to keep.

The bytes kept are the message as it will be sent: the ``Bcc``, ``Resent-Bcc`` and
``Return-Path`` headers removed, ``Message-ID`` and ``Date`` added when missing. A raw
message's body is kept byte for byte; only its header block is touched.

Everything here runs on the enqueue path of every ``send_mail()``, and on input an
attacker may shape: the size is checked before anything is parsed or copied, only the
header block is ever split into fields, and every refusal is a ``QueueError``.
"""

from __future__ import annotations

import dataclasses
import email.errors
import email.message
import email.policy
import email.utils
import io
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from email.generator import BytesGenerator
from email.parser import HeaderParser
from typing import Any

from django.core.mail import EmailMessage

from .addresses import check_mailbox, check_sender
from .errors import ErrorCode, QueueError
from .items import DEFAULT_CHANNEL, DEFAULT_PRIORITY, NewItem
from .plain_text import LINE_ENDS, plain_text_octets

# RFC 5322 §2.2: a field name is printable US-ASCII (33-126) except the colon.
_FIELD_NAME = re.compile(rb"[\x21-\x39\x3b-\x7e]+")
_FIELD_NAME_TEXT = re.compile(_FIELD_NAME.pattern.decode("ascii"))
# RFC 5322 §2.2: a field body is printable characters and WSP (RFC 6532: and UTF-8).
# Every other control breaks a line somewhere: Python's email package folds at
# VT, FF, the C1 NEL and U+2028/U+2029 (str.splitlines), and other mailers at CR or LF
# alone. TAB is WSP and stays.
_HEADER_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# The same in a raw header block, whose UTF-8 C1 and U+2028/U+2029 are byte pairs and
# triples; CR and LF, which end its lines, are checked line by line.
_HEADER_CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8\xa9]")
# Bcc and Resent-Bcc (RFC 5322 §3.6.3, §3.6.6) name recipients the others must not
# see: their addresses travel in the envelope only. Return-Path is written by the
# delivering server from the envelope sender (RFC 5321 §4.4); one the caller wrote
# would only contradict it.
_DROPPED_FIELDS = frozenset({b"bcc", b"resent-bcc", b"return-path"})
# RFC 5322 §2.1.1 (and RFC 5321 §4.5.3.1.6 on the wire): at most 998 octets a line.
# A long body line is re-encoded before it is sent; a header field is the caller's
# to fold, and a field with no space to fold at cannot be.
MAX_LINE = 998
# What the email package may raise on input it cannot take: Django's BadHeaderError
# (a header with CR/LF) is a ValueError, an undecodable header a HeaderParseError.
_BUILD_ERRORS = (ValueError, UnicodeError, TypeError, LookupError, email.errors.MessageError)
# What makes an address more than a bare addr-spec: a display name, a comment, a list.
_NEEDS_PARSING = re.compile(r'[\s<>()",;:\\\[\]]')
# user@[192.0.2.1] and user@[IPv6:...]: an addr-spec as it is, though the email
# package's stricter parser (Python 3.13) takes no domain literal apart.
_BARE_DOMAIN_LITERAL = re.compile(r'[^\s<>()",;:\\\[\]]+@\[[^\s\[\]\\]*\]')


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Prepared:
    """A message ready for the store: its envelope and its bytes."""

    sender: str
    recipients: list[str]
    data: bytes

    def new_item(
        self,
        *,
        now: datetime,
        next_attempt_at: datetime,
        key: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        channel: str = DEFAULT_CHANNEL,
    ) -> NewItem:
        """Return the item that queues this message, created ``now`` under a new id."""
        return NewItem(
            id=str(uuid.uuid4()),
            sender=self.sender,
            recipients=self.recipients,
            message=self.data,
            created_at=now,
            next_attempt_at=next_attempt_at,
            key=key,
            priority=priority,
            channel=channel,
        )


def _invalid(message: str) -> QueueError:
    return QueueError(ErrorCode.INVALID, message)


def check_size(size: int, max_size: int | None) -> None:
    """Raise ``QueueError(TOO_LARGE)`` when ``size`` bytes exceed ``max_size``."""
    if max_size is not None and size > max_size:
        raise QueueError(ErrorCode.TOO_LARGE, f"The message is {size} bytes; MAX_MESSAGE_SIZE is {max_size}.")


def _addr_spec(value: str, *, role: str) -> str:
    """Return the addr-spec of ``"Name <a@b>"`` or ``"a@b"``, not yet checked."""
    if not isinstance(value, str):
        raise _invalid(f"A {role} address must be a string, not {type(value).__name__}.")
    if any(ch in value for ch in "\r\n"):
        raise _invalid(f"The {role} address {value!r} cannot be queued: it holds a CR or LF.")
    if not _NEEDS_PARSING.search(value) or _BARE_DOMAIN_LITERAL.fullmatch(value):
        return value  # a bare addr-spec: nothing to take apart
    parsed = email.utils.getaddresses([value])
    if len(parsed) != 1 or not parsed[0][1]:
        raise _invalid(f"The {role} address {value!r} cannot be queued: it is not one email address.")
    return parsed[0][1]


def envelope_recipients(values: Sequence[str], *, limit: int | None = None) -> list[str]:
    """Return the checked addr-specs of ``values``, duplicates dropped, order kept.

    More than ``limit`` distinct addresses are refused before any is checked.
    """
    if isinstance(values, str):
        raise _invalid("Recipients must be a list of addresses, not one string.")
    addresses = list(dict.fromkeys(_addr_spec(v, role="recipient") for v in values if v))
    if not addresses:
        raise _invalid("The message has no recipient: give to, cc or bcc addresses.")
    if limit is not None and len(addresses) > limit:
        raise _invalid(
            f"The message has {len(addresses)} recipients; MAX_RECIPIENTS is {limit}. "
            "Send it as several messages, or raise MAX_RECIPIENTS."
        )
    for address in addresses:
        check_mailbox(address, role="recipient")
    return addresses


def envelope_sender(value: str | None) -> str:
    """Return the checked envelope sender; ``""`` (or ``"<>"``) is the null sender."""
    if value is None or value in ("", "<>"):
        return ""
    return check_sender(_addr_spec(value, role="sender"))


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

    def _write_lines(self, lines: str) -> None:
        # The whole text in one write, its line ends made the generator's, where the
        # email package writes each line and each line end apart: the same bytes, for
        # a tenth of the calls (a message's body is most of its lines).
        if lines:
            self.write(self._NL.join(LINE_ENDS.split(lines)))  # type: ignore[attr-defined]


def _flatten(message: Any) -> bytes:
    # One generator for Django 5.2's compat32 messages and 6.x's email.message.EmailMessage.
    buffer = io.BytesIO()
    _Generator(buffer, mangle_from_=False, policy=message.policy.clone(linesep="\r\n")).flatten(message)
    return buffer.getvalue()


def from_email_message(
    message: EmailMessage,
    *,
    sender: str | None,
    recipients: Sequence[str] | None,
    hostname: str,
    now: datetime,
    max_size: int | None = None,
    max_recipients: int | None = None,
) -> Prepared:
    """Prepare a Django ``EmailMessage`` (any subclass).

    A plain ASCII text message is written directly (``plain_text``), with the octets
    Django's ``message()`` would give; every other message is built by Django.

    ``max_size`` applies to the message as generated; a message whose text and
    attachments alone exceed it is refused before it is generated.
    """
    _check_given_headers(message)
    check_size(_least_generated_size(message), max_size)
    # The envelope first: its errors name the address, where Django's would name a codec.
    envelope_from = envelope_sender(message.from_email if sender is None else sender)
    envelope_to = envelope_recipients(message.recipients() if recipients is None else recipients, limit=max_recipients)
    finished = plain_text_octets(message)
    if finished is None:
        try:
            data = _flatten(message.message())
        except _BUILD_ERRORS as error:
            raise _invalid(f"The message cannot be queued: {error}") from error
        check_size(len(data), max_size)
        finished = finish_headers(data, hostname=hostname, now=now)
    check_size(len(finished), max_size)
    return Prepared(sender=envelope_from, recipients=envelope_to, data=finished)


def _check_given_headers(message: EmailMessage) -> None:
    """Refuse a header name or value the caller gave that the email package would mangle.

    Django checks header values for CR and LF only, and header names not at all: a
    name holding ``": x\r\nBcc"`` would write a field of the caller's choosing.
    """
    extra = message.extra_headers
    if not isinstance(extra, dict):
        raise _invalid(f"The message's headers must be a dict, not {type(extra).__name__}.")
    for name, value in extra.items():
        if not isinstance(name, str) or not _FIELD_NAME_TEXT.fullmatch(name):
            raise _invalid(
                f"The message cannot be queued: the header name {name!r} is not printable US-ASCII "
                "without a colon or space (RFC 5322 §2.2)."
            )
        _check_header_text(name, value)
    _check_header_text("Subject", message.subject)
    for name, values in (
        ("From", [message.from_email]),
        ("To", message.to),
        ("Cc", message.cc),
        ("Reply-To", message.reply_to),
    ):
        for value in values:
            _check_header_text(name, value)


def _check_header_text(name: str, value: object) -> None:
    if isinstance(value, str):
        found = _HEADER_CONTROL.search(value)
        if found:
            raise _invalid(
                f"The message cannot be queued: its {name} header holds the control character "
                f"U+{ord(found.group()):04X} (RFC 5322 §2.2)."
            )


def _least_generated_size(message: EmailMessage) -> int:
    """Return a lower bound of the generated message's size, without generating it.

    Every text comes out at least as long as its characters (encoding only adds), and
    every attachment at least as long as its content (base64 adds a third).
    """
    size = _content_size(message.body)
    for alternative in getattr(message, "alternatives", ()):
        if isinstance(alternative, tuple) and alternative:
            size += _content_size(alternative[0])
    for attachment in message.attachments:
        if isinstance(attachment, tuple) and len(attachment) > 1:
            size += _content_size(attachment[1])
    return size


def _content_size(content: object) -> int:
    return len(content) if isinstance(content, str | bytes | bytearray) else 0


def from_bytes(
    data: bytes,
    *,
    sender: str | None,
    recipients: Sequence[str] | None,
    hostname: str,
    now: datetime,
    max_size: int | None = None,
    max_recipients: int | None = None,
) -> Prepared:
    """Prepare raw RFC 5322 bytes; the envelope defaults to From and To/Cc/Bcc.

    ``max_size`` is checked before anything else: refusing a message costs no copy of it.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise _invalid(f"A message must be an EmailMessage or bytes, not {type(data).__name__}.")
    check_size(memoryview(data).nbytes, max_size)
    data = bytes(data)
    head = _Head.split(data)  # refuses a malformed header first
    finished = head.finish(data, hostname=hostname, now=now)
    check_size(len(finished), max_size)
    if sender is None or recipients is None:
        headers = _parse_headers(head.fields)
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
        recipients=envelope_recipients(recipients, limit=max_recipients),
        data=finished,
    )


def _parse_headers(fields: Sequence[bytes]) -> email.message.Message:
    # Header fields may hold raw UTF-8 (RFC 6532): decode them as such, so that an
    # address like jörg@bücher.example reaches the envelope as written.
    text = b"".join(fields).decode("utf-8", errors="replace")
    return HeaderParser(policy=email.policy.compat32).parsestr(text)


def finish_headers(data: bytes, *, hostname: str, now: datetime) -> bytes:
    """Drop ``Bcc``, ``Resent-Bcc`` and ``Return-Path``, add ``Message-ID`` and ``Date``
    when missing; keep the body as is."""
    return _Head.split(data).finish(data, hostname=hostname, now=now)


def with_new_message_id(data: bytes, *, hostname: str) -> bytes:
    """Return ``data`` with a new ``Message-ID`` (made as ``finish_headers`` makes one)
    in place of its own, at the same place; every other octet as it was."""
    head = _Head.split(data)
    new_field = b"Message-ID: " + email.utils.make_msgid(domain=hostname).encode("ascii") + head.eol
    fields: list[bytes] = []
    for name, field in zip(head.names, head.fields, strict=True):
        if name != b"message-id":
            fields.append(field)
        elif new_field not in fields:  # a second Message-ID goes: a message has one (RFC 5322 §3.6)
            fields.append(new_field)
    if new_field not in fields:
        fields.append(new_field)
    return b"".join([*fields, memoryview(data)[head.body_start :]])


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Head:
    """A message's header fields (each with its line end) and where its body starts."""

    eol: bytes
    names: list[bytes]  # each field's name, lowercased
    fields: list[bytes]
    body_start: int

    @classmethod
    def split(cls, data: bytes) -> _Head:
        """Split the header block off ``data``; the body is neither copied nor read."""
        first_end = data.find(b"\n")
        eol = b"\r\n" if first_end > 0 and data[first_end - 1 : first_end] == b"\r" else b"\n"
        if data.startswith(eol):
            return cls(eol=eol, names=[], fields=[], body_start=0)
        end = data.find(eol + eol)
        head_end = len(data) if end == -1 else end + len(eol)
        names, fields = _split_fields(data[:head_end], eol)
        return cls(eol=eol, names=names, fields=fields, body_start=head_end)

    def finish(self, data: bytes, *, hostname: str, now: datetime) -> bytes:
        """Return the message to keep: the fields kept and added, a blank line, the body."""
        eol = self.eol
        kept = [field for name, field in zip(self.names, self.fields, strict=True) if name not in _DROPPED_FIELDS]
        names = set(self.names)
        if b"message-id" not in names:
            kept.append(b"Message-ID: " + email.utils.make_msgid(domain=hostname).encode("ascii") + eol)
        if b"date" not in names:
            kept.append(b"Date: " + email.utils.format_datetime(now).encode("ascii") + eol)
        if data[self.body_start : self.body_start + len(eol)] != eol:
            kept.append(eol)
        # A view of the body: the message is copied once, into the bytes kept.
        return b"".join([*kept, memoryview(data)[self.body_start :]])


def _split_fields(head: bytes, eol: bytes) -> tuple[list[bytes], list[bytes]]:
    """Return the names (lowercased) and the fields of a header block, each checked."""
    control = _HEADER_CONTROL_BYTES.search(head)
    if control:
        if control.group() == b"\x00":
            raise _invalid("The message cannot be queued: a header holds a NUL character.")
        line = head[head.rfind(b"\n", 0, control.start()) + 1 :].partition(b"\n")[0]
        raise _invalid(
            f"The message cannot be queued: the header line {line[:40]!r} holds the control "
            f"character {control.group()!r} (RFC 5322 §2.2)."
        )
    names: list[bytes] = []
    fields: list[bytes] = []
    lines = head.split(eol)
    if lines and lines[-1] == b"":
        lines.pop()
    for line in lines:
        if b"\r" in line or b"\n" in line:
            raise _invalid("The message cannot be queued: a header holds a bare CR or LF.")
        if len(line) > MAX_LINE:
            raise _invalid(
                f"The message cannot be queued: the header line {line[:40]!r}... is {len(line)} octets long; "
                f"a line may have at most {MAX_LINE} (RFC 5322 §2.1.1). Fold the field at a space."
            )
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += line + eol
            continue
        name, colon, _ = line.partition(b":")
        if not colon or not _FIELD_NAME.fullmatch(name):
            raise _invalid(f"The message cannot be queued: {line[:40]!r} is not a header field (RFC 5322 §2.2).")
        names.append(name.lower())
        fields.append(line + eol)
    return names, fields
