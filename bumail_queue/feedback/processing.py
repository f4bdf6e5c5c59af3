"""What a returned message changes: the suppression list, the delivery log, the signals.

``process_returned_mail()`` reads one message that came back (``parsing``), finds whose
it is, and acts:

- a **hard bounce** (failed for good) suppresses its recipient, reason ``bounced``,
  for ``SUPPRESSION_DURATION``; the ``bounced`` signal is sent, and the delivery log
  gets a ``bounced`` entry for the item it names;
- a **soft bounce** (failed with a ``4.x.x`` status: the remote's delivery time
  expired) counts as the queue's own expiries do: a first is noted, a second within
  ``SUPPRESSION_EXPIRY_WINDOW`` suppresses;
- a **complaint** suppresses its recipient, reason ``complained``, and sends
  ``complained``;
- a delay or a report of success changes nothing;
- anything **unrecognised** is kept in ``ReturnedMail`` for a person to read (the
  admin's *Unread returned mail*).

Whose is it: with ``RETURN_PATH`` (VERP), the address the mail came back to names the
item and, by its signature, the one recipient; the report's own words are then only
what it says happened. Without, each recipient the report names is taken as written,
and its item is the last one the delivery log has delivered to it.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from bumail_queue import signals
from bumail_queue.addresses import normal_address
from bumail_queue.conf import get_settings
from bumail_queue.items import Reply
from bumail_queue.models import DeliveryLog, ReturnedMail
from bumail_queue.service import QueueService, queue
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason
from bumail_queue.verp import ReturnedTo, read_return_path

from .parsing import Report, ReportedRecipient, ReportKind, parse_report

KEPT_MESSAGE_LIMIT = 1024 * 1024
"""The most octets of an unread returned message kept for a person: a bounce that
returns a whole large message is cut there (its start says what it is)."""

_REPLY_CODE = re.compile(r"\s*([245][0-9][0-9])\b")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """What came back of one recipient: ``hard`` (a bounce), ``soft``, ``complaint`` or
    ``unsubscribe`` (an ESP's event)."""

    kind: str
    recipient: str
    item_id: str | None
    reply: Reply


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Processed:
    """What processing one returned message did."""

    report: Report
    events: tuple[Event, ...] = ()
    kept: ReturnedMail | None = None

    @property
    def suppressed(self) -> tuple[str, ...]:
        return tuple(e.recipient for e in self.events if e.kind in ("hard", "complaint", "unsubscribe"))


def process_returned_mail(
    raw: bytes, *, recipients: Sequence[str] = (), service: QueueService | None = None
) -> Processed:
    """Read the returned message ``raw``, which came to ``recipients`` (its envelope
    recipients: a ``RETURN_PATH`` or ``FEEDBACK_ADDRESSES`` address), and act on it."""
    service = service or queue
    now = service.clock()
    report = parse_report(raw)
    if report.kind is ReportKind.UNRECOGNISED:
        return Processed(report=report, kept=_keep(raw, recipients, now))
    events = tuple(_events(report, recipients, service))
    record(events, service=service, source=report.source, feedback_type=report.feedback_type)
    return Processed(report=report, events=events)


def record(
    events: Sequence[Event],
    *,
    service: QueueService | None = None,
    source: str = "",
    feedback_type: str | None = None,
) -> None:
    """Act on ``events``, from returned mail or an ESP's webhook: the suppression list
    first, then the signals (the delivery log's among their receivers)."""
    service = service or queue
    _apply(events, service, service.clock())
    for event in events:
        if event.kind == "hard":
            signals.send(
                signals.bounced, item_id=event.item_id, recipient=event.recipient, reply=event.reply, source=source
            )
        elif event.kind == "complaint":
            signals.send(
                signals.complained, item_id=event.item_id, recipient=event.recipient, feedback_type=feedback_type
            )
        elif event.kind == "unsubscribe":
            signals.send(
                signals.unsubscribed, item_id=event.item_id, recipient=event.recipient, source=source, channel=None
            )


# -- whose is it ------------------------------------------------------------------------------


def _events(report: Report, recipients: Sequence[str], service: QueueService) -> Iterable[Event]:
    if report.kind is ReportKind.COMPLAINT:
        for named in report.recipients:
            item_id = last_delivered_item(named.address)
            yield Event(kind="complaint", recipient=named.address, item_id=item_id, reply=_reply_of(named))
        return
    if report.kind is not ReportKind.BOUNCE:
        return  # a delay, or a report of success: nothing to change
    returned = _returned(recipients, service)
    if returned:
        for to in returned:
            event = _attributed(to, report, service)
            if event is not None:
                yield event
        return
    for named in report.recipients:
        kind = "hard" if named.is_hard else "soft" if named.is_soft and named.action == "failed" else None
        if kind is not None:
            yield Event(
                kind=kind, recipient=named.address, item_id=last_delivered_item(named.address), reply=_reply_of(named)
            )


def _returned(recipients: Sequence[str], service: QueueService) -> list[ReturnedTo]:
    template = service.settings.return_path
    if template is None:
        return []
    found = (read_return_path(template, address) for address in recipients)
    return [to for to in found if to is not None]


def _attributed(to: ReturnedTo, report: Report, service: QueueService) -> Event | None:
    """The event of the one recipient a VERP address names: the report's verdict on it
    (its own block, else the worst the report gives), whatever address the report uses."""
    recipient = next((c for c in _candidates(to.item_id, report, service) if to.names(c)), None)
    if recipient is None:
        return None  # a token for nobody we know: forged, or its item and log are gone
    own = next((r for r in report.recipients if r.address == normal_address(recipient)), None)
    verdict = own or next(iter(report.hard_bounces or report.soft_bounces), None)
    if verdict is None or not (verdict.is_hard or (verdict.is_soft and verdict.action == "failed")):
        return None
    kind = "hard" if verdict.is_hard else "soft"
    return Event(kind=kind, recipient=normal_address(recipient), item_id=to.item_id, reply=_reply_of(verdict))


def _candidates(item_id: str, report: Report, service: QueueService) -> list[str]:
    """The recipients a return path may name: the report's, the item's while it is
    queued, and the delivery log's for the item."""
    found = [r.address for r in report.recipients]
    item = service.get(item_id)
    if item is not None:
        found += [r.address for r in item.recipients]
    if service.settings.delivery_log:
        logged = DeliveryLog.objects.using(service.settings.database).filter(item_id=item_id)
        found += list(logged.values_list("recipient", flat=True).distinct())
    return list(dict.fromkeys(found))


def last_delivered_item(address: str) -> str | None:
    settings = get_settings()
    if not settings.delivery_log:
        return None
    entries = DeliveryLog.objects.using(settings.database).filter(
        recipient=address, status=DeliveryLog.Status.DELIVERED
    )
    last = entries.order_by("-logged_at").values_list("item_id", flat=True).first()
    return None if last is None else str(last)


def _reply_of(named: ReportedRecipient) -> Reply:
    found = _REPLY_CODE.match(named.diagnostic)
    text = named.diagnostic or {"complained": "reported as spam"}.get(named.action, named.action)
    return Reply(code=int(found[1]) if found else None, status=named.status, text=text[:512])


# -- what it changes --------------------------------------------------------------------------


def _apply(events: Sequence[Event], service: QueueService, now: datetime) -> None:
    settings = service.settings
    if not settings.suppression or not events:
        return
    reasons = {
        "hard": SuppressionReason.BOUNCED,
        "complaint": SuppressionReason.COMPLAINED,
        "unsubscribe": SuppressionReason.UNSUBSCRIBED,
    }
    add = {  # one entry an address, the last word on it winning
        e.recipient: _entry(e, reasons[e.kind], now, settings.suppression_duration) for e in events if e.kind in reasons
    }
    window = settings.suppression_expiry_window
    expired = {
        e.recipient: _entry(e, SuppressionReason.EXPIRED, now, settings.suppression_duration)
        for e in events
        if e.kind == "soft" and window is not None and e.recipient not in add
    }
    change = SuppressionChange(
        add=tuple(add.values()), expired=tuple(expired.values()), note_until=None if window is None else now + window
    )
    if change:
        service.store.update_suppressions(change, now=now)


def _entry(event: Event, reason: SuppressionReason, now: datetime, duration: timedelta) -> Suppression:
    return Suppression(
        address=event.recipient, reason=reason, reply=event.reply, created_at=now, expires_at=now + duration
    )


def _keep(raw: bytes, recipients: Sequence[str], now: datetime) -> ReturnedMail:
    head = email.message_from_bytes(raw[:65536], policy=email.policy.compat32)
    kept = ReturnedMail(
        received_at=now,
        recipients=", ".join(recipients),
        sender=" ".join(str(head.get("From", "")).split())[:1000],
        subject=" ".join(str(head.get("Subject", "")).split())[:1000],
        message=raw[:KEPT_MESSAGE_LIMIT],
    )
    kept.save(using=get_settings().database, force_insert=True)
    return kept
