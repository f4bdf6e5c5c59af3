"""What a returned message reports: a bounce, a delay, a complaint, or nothing we know.

Mail that comes back to a sender is of three families, read in this order:

1. **Delivery status notifications** (RFC 3464): ``multipart/report`` with
   ``report-type=delivery-status``, the form Postfix, Exim 4, Sendmail, Microsoft
   Exchange and the queue itself send. Each recipient's block says its ``Action``
   (``failed``, ``delayed``, ``delivered``...), its enhanced ``Status`` (RFC 3463) and
   the server's ``Diagnostic-Code``; nothing is guessed.
2. **Feedback reports** (ARF, RFC 5965): ``multipart/report`` with
   ``report-type=feedback-report``, what a mailbox provider's feedback loop sends when
   a recipient marks the mail as spam. The complaining recipient is the report's
   ``Original-Rcpt-To``, else the ``To`` of the returned message.
3. **Everything else**: the bounce formats of older and odder MTAs (qmail, Exim 3,
   Yahoo's, Microsoft's, Novell's...), read by ``flufl.bounce``, GNU Mailman's bounce
   detectors, which say only which recipients failed for good and which for now.
   Without ``flufl.bounce`` installed (the ``feedback`` extra) this step is skipped.

A message none of them recognises is ``UNRECOGNISED``: never dropped, it is kept for
a person to read.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import enum
import importlib.util
from collections.abc import Iterable, Sequence
from email.message import Message
from email.parser import HeaderParser
from email.utils import getaddresses

from bumail_queue.addresses import normal_address


class ReportKind(enum.StrEnum):
    """What a returned message is, as a whole."""

    BOUNCE = "bounce"  # a recipient failed: not delivered, and never will be by that send
    DELAY = "delay"  # a recipient is still being tried
    COMPLAINT = "complaint"  # a recipient marked the mail as spam (or another abuse report)
    DELIVERED = "delivered"  # a report of success (delivered, relayed, expanded): nothing to do
    UNRECOGNISED = "unrecognised"


class Source(enum.StrEnum):
    """How the report was read."""

    DSN = "rfc3464"
    ARF = "rfc5965"
    HEURISTIC = "flufl.bounce"
    NONE = ""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReportedRecipient:
    """One recipient a returned message reports on.

    ``address`` is in its normal form (``addresses.normal_address``); ``action`` is the
    DSN's (``failed``, ``delayed``, ``delivered``, ``relayed``, ``expanded``), or for
    a complaint ``complained``; ``status`` the enhanced status code, ``""`` when none
    was given; ``diagnostic`` what the remote server said, if the report quotes it.
    """

    address: str
    action: str
    status: str = ""
    diagnostic: str = ""

    @property
    def is_hard(self) -> bool:
        """A permanent failure: failed, with a 5.x.x status (or no status at all, as the
        heuristic formats say only "failed for good")."""
        return self.action == "failed" and not self.status.startswith("4")

    @property
    def is_soft(self) -> bool:
        """A failure or delay that says "for now": delayed, or failed with a 4.x.x status
        (a delivery time that expired, a full mailbox that stayed full)."""
        return self.action == "delayed" or (self.action == "failed" and self.status.startswith("4"))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    """What one returned message reports.

    ``recipients`` are those it names (for a bounce, every recipient with a block, the
    failed and the others); ``original_message_id`` is the ``Message-ID`` of the message
    it is about, when it returns its headers; ``reporting_mta`` the host that wrote it
    (a DSN's ``Reporting-MTA``, an ARF's ``Reporting-MTA`` or ``Source-IP``'s host);
    ``feedback_type`` an ARF's (``abuse``, ``fraud``, ``virus``...).
    """

    kind: ReportKind
    source: Source
    recipients: tuple[ReportedRecipient, ...] = ()
    original_message_id: str | None = None
    reporting_mta: str | None = None
    feedback_type: str | None = None

    @property
    def hard_bounces(self) -> tuple[ReportedRecipient, ...]:
        return tuple(r for r in self.recipients if r.is_hard)

    @property
    def soft_bounces(self) -> tuple[ReportedRecipient, ...]:
        return tuple(r for r in self.recipients if r.is_soft)


UNRECOGNISED = Report(kind=ReportKind.UNRECOGNISED, source=Source.NONE)


def parse_report(raw: bytes) -> Report:
    """Read the returned message ``raw`` (its bytes as received)."""
    message = email.message_from_bytes(raw, policy=email.policy.compat32)
    report_type = message.get_param("report-type", header="content-type")
    if message.get_content_type() == "multipart/report" and isinstance(report_type, str):
        if report_type.lower() == "delivery-status":
            found = _delivery_status(message)
            if found is not None:
                return found
        elif report_type.lower() == "feedback-report":
            found = _feedback_report(message)
            if found is not None:
                return found
    return _heuristic(message)


# -- RFC 3464 -------------------------------------------------------------------------------


def _delivery_status(message: Message) -> Report | None:
    part = _first_part(message, ("message/delivery-status", "message/global-delivery-status"))
    if part is None:
        return None
    blocks = _status_blocks(part)
    if not blocks:
        return None
    per_message, per_recipient = blocks[0], blocks[1:]
    recipients = tuple(r for r in (_recipient_of(block) for block in per_recipient) if r is not None)
    if not recipients:
        return None
    actions = {r.action for r in recipients}
    if "failed" in actions:
        kind = ReportKind.BOUNCE
    elif "delayed" in actions:
        kind = ReportKind.DELAY
    else:
        kind = ReportKind.DELIVERED
    return Report(
        kind=kind,
        source=Source.DSN,
        recipients=recipients,
        original_message_id=_original_message_id(message),
        reporting_mta=_typed_value(per_message.get("Reporting-MTA")),
    )


def _status_blocks(part: Message) -> list[Message]:
    """The DSN's blocks of fields: the email package parses ``message/delivery-status``
    into a list of them; a part it could not parse so is read as text."""
    payload = part.get_payload()
    if isinstance(payload, list) and all(isinstance(block, Message) for block in payload):
        return list(payload)
    text = payload if isinstance(payload, str) else ""
    if isinstance(payload, str) and part.get("Content-Transfer-Encoding", "").lower() in ("base64", "quoted-printable"):
        decoded = part.get_payload(decode=True)
        text = decoded.decode("utf-8", "replace") if isinstance(decoded, bytes) else text
    chunks = [chunk for chunk in text.replace("\r\n", "\n").split("\n\n") if chunk.strip()]
    return [HeaderParser().parsestr(chunk.strip() + "\n") for chunk in chunks]


def _recipient_of(block: Message) -> ReportedRecipient | None:
    address = _typed_value(block.get("Final-Recipient")) or _typed_value(block.get("Original-Recipient"))
    action = (block.get("Action") or "").strip().lower()
    if not address or not action:
        return None
    status = (block.get("Status") or "").strip().split(" ")[0]
    diagnostic = " ".join((_typed_value(block.get("Diagnostic-Code")) or "").split())
    return ReportedRecipient(address=normal_address(address), action=action, status=status, diagnostic=diagnostic)


def _typed_value(value: str | None) -> str | None:
    """A ``type; value`` field's value (``rfc822; bob@example.org``), unfolded."""
    if value is None:
        return None
    kind, separator, rest = str(value).partition(";")
    found = rest if separator else kind
    return " ".join(found.split()) or None


# -- RFC 5965 -------------------------------------------------------------------------------


def _feedback_report(message: Message) -> Report | None:
    part = _first_part(message, ("message/feedback-report",))
    if part is None:
        return None
    blocks = _status_blocks(part)
    if not blocks:
        return None
    fields = blocks[0]
    addresses = [a for _, a in getaddresses(fields.get_all("Original-Rcpt-To") or []) if a]
    original = _original_headers(message)
    if not addresses and original is not None:
        addresses = [a for _, a in getaddresses(original.get_all("To") or []) if a]
    recipients = tuple(
        ReportedRecipient(address=normal_address(a), action="complained") for a in dict.fromkeys(addresses)
    )
    return Report(
        kind=ReportKind.COMPLAINT,
        source=Source.ARF,
        recipients=recipients,
        original_message_id=_original_message_id(message),
        reporting_mta=_typed_value(fields.get("Reporting-MTA")),
        feedback_type=(fields.get("Feedback-Type") or "").strip().lower() or None,
    )


# -- the rest: flufl.bounce -----------------------------------------------------------------


def _heuristic(message: Message) -> Report:
    if importlib.util.find_spec("flufl.bounce") is None:
        return UNRECOGNISED
    from flufl.bounce import all_failures

    try:
        temporary, permanent = all_failures(message)
    except Exception:  # its detectors fail on some odd messages (one without a From): no verdict
        return UNRECOGNISED
    recipients = [
        *(_guessed(address, "failed") for address in sorted(permanent)),
        *(_guessed(address, "delayed") for address in sorted(temporary - permanent)),
    ]
    named = tuple(r for r in recipients if r is not None)
    if not named:
        return UNRECOGNISED
    kind = ReportKind.BOUNCE if any(r.action == "failed" for r in named) else ReportKind.DELAY
    return Report(kind=kind, source=Source.HEURISTIC, recipients=named, original_message_id=None)


def _guessed(address: bytes | str, action: str) -> ReportedRecipient | None:
    text = address.decode("utf-8", "replace") if isinstance(address, bytes) else address
    if "@" not in text:
        return None  # a detector's guess of a local part alone names nobody we sent to
    return ReportedRecipient(address=normal_address(text.strip("<> ")), action=action)


# -- the returned message ---------------------------------------------------------------------


def _first_part(message: Message, types: Sequence[str]) -> Message | None:
    return next((part for part in message.walk() if part.get_content_type() in types), None)


def _original_headers(message: Message) -> Message | None:
    """The header fields of the message a report returns: its ``message/rfc822`` part, or
    its ``text/rfc822-headers``."""
    for part in _parts_after_the_first_two(message.get_payload()):
        kind = part.get_content_type()
        if kind in ("message/rfc822", "message/global"):
            inner = part.get_payload()
            if isinstance(inner, list) and inner and isinstance(inner[0], Message):
                return inner[0]
        if kind in ("text/rfc822-headers", "message/global-headers"):
            body = part.get_payload(decode=True)
            text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(part.get_payload())
            return HeaderParser().parsestr(text.replace("\r\n", "\n"))
    return None


def _parts_after_the_first_two(payload: object) -> Iterable[Message]:
    if isinstance(payload, list):
        yield from (part for part in payload[2:] if isinstance(part, Message))


def _original_message_id(message: Message) -> str | None:
    original = _original_headers(message)
    found = None if original is None else original.get("Message-ID")
    return " ".join(str(found).split()) or None if found else None
