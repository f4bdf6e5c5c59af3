"""Delivery status notifications (RFC 3464): the report a sender gets about its message.

``build_dsn`` writes a ``multipart/report`` (``report-type=delivery-status``,
RFC 6522) of up to three parts:

1. ``text/plain`` for a person: which recipient failed or is delayed, and why;
2. ``message/delivery-status``, the fields a program reads: one block about the
   message (``Reporting-MTA``, ``Arrival-Date``), then one block per recipient
   (``Final-Recipient``, ``Action``, ``Status``, ``Remote-MTA``,
   ``Diagnostic-Code``, ``Last-Attempt-Date``, ``Will-Retry-Until``);
3. ``text/rfc822-headers``, the original's header block (``header_block``) — left
   out, as RFC 6522 §3 allows, when the message could not be read.

The report is sent from the null sender ``<>`` (the caller enqueues it), and says
``Auto-Submitted: auto-replied`` (RFC 3834), so that nothing answers it.

The delivery-status fields stay ASCII: a recipient whose address is not ASCII is
written with RFC 6533's ``utf-8`` address type, its other characters as
``\\x{HHHH}`` escapes (``utf-8; j\\x{F6}rg@example.de``), and so are the non-ASCII
characters of a server's reply. ``Diagnostic-Code`` is the reply as the server sent
it (RFC 3464 §2.3.6), never a text of ours. Every field is folded at whitespace to fit in 78
characters where it can, and no line is longer than 998.
"""

from __future__ import annotations

import dataclasses
import email.message
import email.policy
import email.utils
import re
import textwrap
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Final, Literal, TypeAlias

from bumail_queue.addresses import a_labels
from bumail_queue.items import QueueItem, Reply

__all__ = ["RETURNED_HEADERS_LIMIT", "DSNKind", "ReportedRecipient", "build_dsn", "header_block"]

DSNKind: TypeAlias = Literal["failed", "delayed"]
_Policy: TypeAlias = "email.policy.EmailPolicy[email.message.EmailMessage]"  # generic to type checkers only
_Part: TypeAlias = email.message.Message | str

#: SMTP's CRLF; header values are set pre-folded and written as they are
#: (``refold_source="none"``), so Python never turns a long word of a machine-read
#: field into an RFC 2047 encoded word. Headers set by name are folded as usual.
_POLICY: Final[_Policy] = email.policy.SMTP.clone(refold_source="none")
#: The same, for a sender whose address is not ASCII: its ``To`` is written as
#: UTF-8 (RFC 6532), as only an SMTPUTF8 server can take it anyway.
_POLICY_UTF8: Final[_Policy] = _POLICY.clone(utf8=True)

_SUBJECTS: Final[dict[str, str]] = {
    "failed": "Undelivered Mail Returned to Sender",
    "delayed": "Delayed Mail (still being retried)",
}
_ACTIONS: Final = ("failed", "delayed")
#: RFC 5322 §2.1.1: lines SHOULD fit in 78 characters and MUST fit in 998.
_FOLD_AT: Final = 78
_MAX_LINE: Final = 998
#: A word longer than this is cut into pieces (a space then appears between them
#: once the field is unfolded); anything shorter stays whole on a line of its own.
_LONGEST_WORD: Final = 900
_TEXT_WIDTH: Final = 76
_CONTROLS: Final = re.compile(r"[\x00-\x1f\x7f]+")
_STATUS: Final = re.compile(r"[245]\.[0-9]{1,3}\.[0-9]{1,3}")
#: RFC 6533 §3's xtext: what is written as itself in a ``utf-8`` address; every
#: other character (CTLs, SP, "\", "+", "=", non-ASCII) becomes ``\x{HHHH}``.
_QCHAR: Final = frozenset(chr(c) for c in range(0x21, 0x7F)) - {"\\", "+", "="}
#: The end of a header field: a line end not followed by a folding space (RFC 5322 §2.2.3).
_FIELD_END: Final = re.compile(rb"\r?\n(?![ \t])")

RETURNED_HEADERS_LIMIT: Final = 50_000
"""The most octets of the original's header block a DSN returns: Postfix's
``bounce_size_limit``. Past it the block is cut after the last whole field, so a
message made of headers alone never makes a report larger than the mail it is about."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReportedRecipient:
    """One recipient a DSN reports on.

    ``address`` is the recipient as it was given (it may be UTF-8); ``reply`` the
    answer that decided its state (``code`` is ``None`` when no server answered);
    ``remote_mta`` the host name of the server that answered, ``None`` if none did.
    ``status`` is the enhanced status code to report when it is not the reply's own
    (``4.4.7`` for a recipient whose delivery time expired, its ``reply`` the last
    one it had); ``reason`` says why in words for a person, before the reply.
    ``attempted`` is false for a recipient the queue gave up on without trying it (a
    suppressed address): the report then says so, and has no ``Last-Attempt-Date``.
    """

    address: str
    action: DSNKind
    reply: Reply
    remote_mta: str | None
    last_attempt_at: datetime
    status: str | None = None
    reason: str = ""
    attempted: bool = True


def build_dsn(
    *,
    kind: DSNKind,
    reporting_mta: str,
    original: QueueItem,
    original_message: bytes | None,
    recipients: Sequence[ReportedRecipient],
    now: datetime,
    will_retry_until: datetime | None = None,
) -> bytes:
    """Return the bytes (CRLF line ends) of a DSN about ``original``, to its sender.

    ``kind`` decides the subject and the opening text; each recipient's own
    ``action`` goes into its block. ``reporting_mta`` is this server's host name
    (``QueueSettings.hostname``). ``original_message`` is the original's bytes, or
    its header block alone, of which only the header block is returned (up to
    ``RETURNED_HEADERS_LIMIT``); ``None`` when the store lost it: the report then
    says so and has no third part. ``will_retry_until`` is when the queue gives
    up, for a delay (``Will-Retry-Until`` of every delayed recipient).

    The caller enqueues the result from the null sender ``<>`` to
    ``original.sender``. Raises ``ValueError`` for a message from ``<>`` (never
    report on a report), for no recipients, and for a ``kind`` or an ``action``
    that is neither ``"failed"`` nor ``"delayed"``.
    """
    if original.sender in ("", "<>"):
        raise ValueError(f"No DSN about item {original.id}: it was sent from the null sender <>.")
    if kind not in _ACTIONS:
        raise ValueError(f"A DSN's kind is 'failed' or 'delayed', not {kind!r}.")
    if not recipients:
        raise ValueError(f"A DSN about item {original.id} needs at least one recipient.")
    for recipient in recipients:
        if recipient.action not in _ACTIONS:
            raise ValueError(f"A reported recipient's action is 'failed' or 'delayed', not {recipient.action!r}.")
    mta = _host_name(reporting_mta)
    if not mta:
        raise ValueError(f"The reporting MTA must be a host name; got {reporting_mta!r}.")
    headers = None if original_message is None else header_block(original_message) or None

    policy = _POLICY if original.sender.isascii() else _POLICY_UTF8
    report = email.message.EmailMessage(policy=policy)
    report["From"] = f"Mail Delivery System <MAILER-DAEMON@{mta}>"
    report["To"] = original.sender
    report["Subject"] = _SUBJECTS[kind]
    report["Date"] = email.utils.format_datetime(now)
    report["Message-ID"] = email.utils.make_msgid(domain=mta)
    report["Auto-Submitted"] = "auto-replied"
    report["MIME-Version"] = "1.0"
    report["Content-Type"] = "multipart/report; report-type=delivery-status"

    text = email.message.MIMEPart(policy=policy)
    body = _human_text(
        kind=kind,
        mta=mta,
        original=original,
        lost=original_message is None,
        returned=headers is not None,
        recipients=recipients,
        will_retry_until=will_retry_until,
    )
    text.set_content(body, charset="utf-8", cte=_text_cte(body))
    parts: list[_Part] = [
        text,
        _status_part(policy, mta=mta, original=original, recipients=recipients, will_retry_until=will_retry_until),
    ]
    if headers is not None:
        parts.append(_headers_part(policy, headers))
    report.set_payload(parts)
    return report.as_bytes(policy=policy)


# --- the parts ----------------------------------------------------------------


def _human_text(
    *,
    kind: DSNKind,
    mta: str,
    original: QueueItem,
    lost: bool,
    returned: bool,
    recipients: Sequence[ReportedRecipient],
    will_retry_until: datetime | None,
) -> str:
    """Return part 1: what happened, to whom, and what comes next, for a person."""
    sent = email.utils.format_datetime(original.created_at)
    paragraphs = [f"This is the mail system at {mta}."]
    if kind == "failed":
        paragraphs.append(
            f"Your message of {sent} could not be delivered to the recipients below. "
            "The mail system has given up on them: it will not try again."
        )
    else:
        until = "" if will_retry_until is None else f" until {email.utils.format_datetime(will_retry_until)}"
        paragraphs.append(
            f"Your message of {sent} has not been delivered to the recipients below yet. "
            f"The mail system will keep trying{until}; you do not need to send it again. "
            "You will be told if it still cannot be delivered then."
        )
    if lost:
        paragraphs.append("The mail system could not read your message any more, so it is not attached to this report.")
    lines = [textwrap.fill(p, width=_TEXT_WIDTH, break_long_words=False, break_on_hyphens=False) for p in paragraphs]
    lines.append(f"Queue ID: {_printable(original.id)}")
    for recipient in recipients:
        lines.append(_human_recipient(recipient))
    ending = "The delivery status of each recipient follows, in the form programs read"
    ending += ", then the header of your message." if returned else "."
    lines.append(textwrap.fill(ending, width=_TEXT_WIDTH))
    return "\n\n".join(lines) + "\n"


def _human_recipient(recipient: ReportedRecipient) -> str:
    reply = recipient.reply
    state = "failed" if recipient.action == "failed" else "delayed, still being retried"
    if not recipient.attempted:
        said = _printable(reply.text) or "(no reason given)"
        why = f"Not sent (status {_status(recipient)}): {said}"
    elif reply.code is None:
        said = _printable(reply.text) or "(no reason given)"
        why = f"No server answered (status {_status(recipient)}): {said}"
    else:
        server = _printable(recipient.remote_mta or "")
        who = f"The server {server}" if server else "The server"
        why = f"{who} replied: {_smtp_reply(reply, keep_unicode=True)}"
    if recipient.reason:
        why = f"{_printable(recipient.reason)}. {why}"
    indent = " " * 4
    wrapped = textwrap.fill(
        why,
        width=_TEXT_WIDTH,
        initial_indent=indent,
        subsequent_indent=indent * 2,
        break_long_words=False,
        break_on_hyphens=False,
    )
    if not recipient.attempted:
        return f"<{_printable(recipient.address)}>: {state}\n{wrapped}"
    attempt = f"Last attempt: {email.utils.format_datetime(recipient.last_attempt_at)}"
    return f"<{_printable(recipient.address)}>: {state}\n{wrapped}\n{indent}{attempt}"


def _status_part(
    policy: _Policy,
    *,
    mta: str,
    original: QueueItem,
    recipients: Sequence[ReportedRecipient],
    will_retry_until: datetime | None,
) -> email.message.MIMEPart:
    """Return part 2, ``message/delivery-status``: the per-message block, then one per recipient.

    Python's email package keeps this type's body as a list of header-only
    messages and writes them separated by blank lines (as RFC 3464 §2.1 wants).
    """
    blocks: list[_Part] = [
        _block(
            policy,
            [
                ("Reporting-MTA", f"dns; {mta}"),
                ("X-Queue-ID", _ascii(original.id)),
                ("Arrival-Date", email.utils.format_datetime(original.created_at)),
            ],
        )
    ]
    for recipient in recipients:
        fields = [
            ("Final-Recipient", _address_field(recipient.address)),
            ("Action", recipient.action),
            ("Status", _status(recipient)),
        ]
        remote = _host_name(recipient.remote_mta or "")
        if remote:
            fields.append(("Remote-MTA", f"dns; {remote}"))
        if recipient.reply.code is not None:
            fields.append(("Diagnostic-Code", f"smtp; {_ascii(_smtp_reply(recipient.reply, keep_unicode=False))}"))
        if recipient.attempted:
            fields.append(("Last-Attempt-Date", email.utils.format_datetime(recipient.last_attempt_at)))
        if recipient.action == "delayed" and will_retry_until is not None:
            fields.append(("Will-Retry-Until", email.utils.format_datetime(will_retry_until)))
        blocks.append(_block(policy, fields))
    part = email.message.MIMEPart(policy=policy)
    part["Content-Type"] = "message/delivery-status"
    part.set_payload(blocks)
    return part


def _block(policy: _Policy, fields: Iterable[tuple[str, str]]) -> email.message.Message:
    block = email.message.Message(policy=policy)
    for name, value in fields:
        if value:
            block.set_raw(name, _fold(name, value))
    return block


def _headers_part(policy: _Policy, headers: bytes) -> email.message.MIMEPart:
    """Return part 3, ``text/rfc822-headers``: the original's header block.

    Kept as 7bit when it is ASCII with no line over 998 octets; otherwise (UTF-8
    header fields, RFC 6532) quoted-printable, so the report stays 7-bit.
    """
    part = email.message.MIMEPart(policy=policy)
    lines = headers.splitlines()
    if headers.isascii() and all(len(line) <= _MAX_LINE for line in lines):
        part.set_content(headers.decode("ascii"), subtype="rfc822-headers", charset="us-ascii", cte="7bit")
    else:
        text = headers.decode("utf-8", "replace")
        part.set_content(text, subtype="rfc822-headers", charset="utf-8", cte="quoted-printable")
    return part


def header_block(message: bytes, *, limit: int = RETURNED_HEADERS_LIMIT) -> bytes:
    """Return the header block of ``message``, what a DSN returns of it (RFC 6522 §3).

    That is everything before the first blank line (CRLF or LF line ends), as a copy
    that does not hold on to the message; cut after the last whole field within
    ``limit`` octets. Empty when there is no header at all (an empty message, or one
    that starts with a blank line).
    """
    if not message or message.startswith((b"\r\n", b"\n")):
        return b""
    blank = re.search(rb"\r?\n\r?\n", message)
    block = message if blank is None else message[: blank.start()]
    if len(block) <= limit:
        return bytes(block)
    ends = [end.start() for end in _FIELD_END.finditer(block, 0, limit + 1)]
    return bytes(block[: ends[-1]]) if ends else b""


# --- field values ---------------------------------------------------------------


def _status(recipient: ReportedRecipient) -> str:
    """Return the recipient's enhanced status code (RFC 3463); a generic one if it is not one."""
    status = (recipient.status or recipient.reply.status).strip()
    if _STATUS.fullmatch(status):
        return status
    return "5.0.0" if recipient.action == "failed" else "4.0.0"


def _smtp_reply(reply: Reply, *, keep_unicode: bool) -> str:
    """Return the reply as the server sent it, on one line: ``"550 5.1.1 text"``.

    RFC 3464 §2.3.6: the code and the text, the enhanced status code only if the
    server wrote one in its text; a status made up for a reply without one (``5.0.0``)
    or given by us (``4.4.7``) goes in ``Status`` alone.
    """
    text = _printable(reply.text) if keep_unicode else _one_line(reply.text)
    code = "" if reply.code is None else str(reply.code)
    return " ".join(word for word in (code, text) if word)


def _one_line(value: str) -> str:
    """Return ``value`` with every run of control characters (CR, LF, tab…) as one space."""
    return _CONTROLS.sub(" ", value).strip()


def _printable(value: str) -> str:
    """Return ``value`` on one line, for the text part (non-ASCII kept)."""
    return " ".join(_one_line(value).split())


def _ascii(value: str) -> str:
    """Return ``value`` on one line with every non-ASCII character as ``\\x{HHHH}``."""
    return "".join(c if c.isascii() else _escape(c) for c in _one_line(value))


def _escape(char: str) -> str:
    return f"\\x{{{ord(char):X}}}"


def _address_field(address: str) -> str:
    """Return a ``Final-Recipient`` value: ``rfc822; addr``, or RFC 6533's ``utf-8; addr``."""
    if all(" " <= c <= "~" for c in address):
        return f"rfc822; {address}"
    return "utf-8; " + "".join(c if c in _QCHAR else _escape(c) for c in address)


def _host_name(value: str) -> str:
    """Return a host name as an ASCII field value: A-labels for a Unicode name."""
    name = _one_line(value).strip().rstrip(".")
    if " " in name:
        return ""
    if not name.isascii():
        try:
            name = a_labels(name)
        except UnicodeError:
            name = _ascii(name)
    return name


def _fold(name: str, value: str) -> str:
    """Return ``value`` folded (RFC 5322 §2.2.3) so that ``name: value`` fits in 78 columns.

    A line is broken before a space only; a word too long for a line stays whole on
    one of its own (up to ``_LONGEST_WORD`` characters, cut beyond), so no line ever
    exceeds 998 octets. The lines are joined with CRLF and their folding space.
    """
    words = re.findall(r" *[^ ]+", value)
    pieces: list[str] = []
    for word in words:
        gap = len(word) - len(word.lstrip(" "))
        text = word[gap:]
        chunks = [text[i : i + _LONGEST_WORD] for i in range(0, len(text), _LONGEST_WORD)]
        pieces.append(word[:gap] + chunks[0])
        pieces.extend(f" {chunk}" for chunk in chunks[1:])
    lines: list[str] = []
    current = f"{name}:"
    for index, piece in enumerate(pieces):
        if index == 0:
            current += f" {piece}"
        elif len(current) + len(piece) <= _FOLD_AT or not piece.startswith(" "):
            current += piece
        else:
            lines.append(current)
            current = piece
    lines.append(current)
    lines[0] = lines[0][len(name) + 2 :]
    return "\r\n".join(lines)


def _text_cte(body: str) -> str:
    """Return ``7bit`` for an ASCII text whose lines fit, else ``quoted-printable``."""
    if body.isascii() and all(len(line) <= _MAX_LINE for line in body.splitlines()):
        return "7bit"
    return "quoted-printable"
