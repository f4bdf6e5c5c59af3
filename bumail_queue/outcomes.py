"""What an attempt decided, and the recorder that writes it down and tells of it.

``decide_attempt()`` turns the replies of one attempt at an item into what the store
records: a deferral past ``MAX_AGE`` becomes a failure (``4.4.7``), the next attempt
is scheduled, a delay DSN falls due. The ``Attempt`` keeps the header block of the
message the attempt read, as the DSNs return it: recording the last recipient drops
the message from the store. The ``Recorder`` then records a batch of attempts in
one step of the store, writes what they change on the suppression list in one more,
and tells each one on its own: the worker's counts, a log line per recipient, the
signals, the delivery log (gathered into one write per batch) and the DSNs, which it
queues through the enqueue callable it is given. The worker owns one recorder and
calls it from its recorder thread.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from django.db import connections

from bumail_queue import archive, delivery_log, signals
from bumail_queue.archive import HeadFields, head_fields
from bumail_queue.conf import QueueSettings
from bumail_queue.delivery.dsn import DSNKind, ReportedRecipient, build_dsn, header_block
from bumail_queue.delivery.retry import has_expired, is_delay_due, retry_delay
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import (
    AttemptResult,
    Outcome,
    QueueItem,
    RecipientStatus,
    Reply,
    reply_line,
)
from bumail_queue.screening import screen
from bumail_queue.stores import QueueStore
from bumail_queue.suppression import change_from

__all__ = [
    "EXPIRED_STATUS",
    "RECORD_RETRY_DELAYS",
    "Attempt",
    "Enqueue",
    "Meter",
    "Recorder",
    "Stats",
    "close_broken_connections",
    "decide_attempt",
    "report_error",
    "store_enqueue",
]

# The worker's log lines, whichever of its modules writes them: operators filter on
# this name (docs/worker.md).
logger = logging.getLogger("bumail_queue.worker")

RECORD_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Seconds between the tries of a record the store refused as unavailable."""

EXPIRED_STATUS = "4.4.7"
"""The enhanced status of a recipient still deferred at ``MAX_AGE``: RFC 3463 §3.5's
X.4.7, "delivery time expired", which it calls "useful only as a persistent transient
error", hence class 4 although the queue gives up (``Action: failed`` says that,
RFC 3464 §2.3.3). The reply code stays the last one the remote sent."""

Clock = Callable[[], datetime]


class Enqueue(Protocol):
    """Queues a message the worker wrote itself (a DSN); ``QueueService.enqueue`` is one."""

    def __call__(
        self, message: bytes, *, sender: str, recipients: Sequence[str], priority: int, channel: str
    ) -> QueueItem: ...


@dataclasses.dataclass(kw_only=True, slots=True)
class Attempt:
    """What one attempt at an item decided, before it is recorded.

    ``headers`` is the header block of the message the attempt read (``None`` when
    the store had lost it: ``lost_message``), kept for the DSNs without the body, so
    a batch of attempts holds little memory. ``expired`` gives each recipient that
    failed at ``MAX_AGE`` the last reply it had before; ``suppressed`` names those
    that failed without a session because the suppression list holds them.
    """

    item: QueueItem
    result: AttemptResult
    remote_hosts: dict[str, str | None]
    headers: bytes | None
    tls: dict[str, bool] = dataclasses.field(default_factory=dict)
    expired: dict[str, Reply] = dataclasses.field(default_factory=dict)
    suppressed: frozenset[str] = frozenset()
    #: The ESP's message id of each recipient a backend route gave one to.
    message_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)
    delay_due: bool = False
    #: Shaping held every recipient back: no attempt, no signal, due when there is room.
    held: bool = False
    #: The message's Subject and Message-ID, for the delivery log and the archive.
    fields: HeadFields = dataclasses.field(default_factory=HeadFields)
    #: The whole message, kept only for a channel that archives its delivered mail
    #: (``ARCHIVE``): the attempt that finishes the item archives it.
    message: bytes | None = None

    @property
    def lost_message(self) -> bool:
        """Whether the store held the item but no longer its message."""
        return self.headers is None


class Meter(Protocol):
    """What a worker tells a monitor as it works (``bumail_queue.metrics.WorkerMetrics``).

    Given to a ``Worker`` only when metrics are on: without one, the worker pays
    one ``is None`` test per event and nothing more. Each call must be quick and
    thread-safe (the delivery, recorder and claim threads all call it), and must
    not raise.
    """

    def claimed(self, count: int) -> None:
        """A claim returned ``count`` items (0 when nothing was due)."""

    def session_ended(self, seconds: float) -> None:
        """A delivery thread spent ``seconds`` on one item's attempt."""

    def attempted(self, item: QueueItem, outcomes: Mapping[str, Outcome], now: datetime) -> None:
        """The outcomes of an attempt at ``item`` were recorded at ``now``."""

    def dsn_sent(self, kind: DSNKind) -> None:
        """A DSN of ``kind`` was queued."""

    def lease_lost(self) -> None:
        """An attempt's outcomes were refused: the lease was no longer this worker's."""

    def store_failed(self) -> None:
        """The store refused a claim, or a batch of outcomes."""


@dataclasses.dataclass(kw_only=True, slots=True)
class Stats:
    """What a worker did: items attempted, recipients by outcome, and store failures."""

    items: int = 0
    delivered: int = 0
    deferred: int = 0
    failed: int = 0
    #: Items held back by ``SHAPING``: given back to the queue, no attempt counted.
    held: int = 0
    #: Claims the store refused, and batches whose outcomes it could not record.
    store_errors: int = 0


def decide_attempt(
    item: QueueItem,
    outcomes: dict[str, Outcome],
    remote_hosts: dict[str, str | None],
    *,
    message: bytes | None,
    settings: QueueSettings,
    now: datetime,
    rng: random.Random,
    tls: dict[str, bool] | None = None,
    suppressed: frozenset[str] = frozenset(),
    not_before: datetime | None = None,
    message_ids: Mapping[str, str] | None = None,
) -> Attempt:
    """Return what recording the replies of one attempt at ``item`` must write.

    ``message`` is the message the attempt read, ``None`` when the store had lost it;
    ``suppressed``, the recipients failed because the suppression list holds them;
    ``not_before``, the soonest the next attempt may be (an ESP's ``Retry-After``).
    """
    expired: dict[str, Reply] = {}
    if has_expired(item.created_at, now, settings):
        expired = {a: o.reply for a, o in outcomes.items() if o.status == RecipientStatus.DEFERRED}
        outcomes = {address: _expired(outcome, settings.max_age) for address, outcome in outcomes.items()}
    still_deferred = any(o.status == RecipientStatus.DEFERRED for o in outcomes.values())
    delay_due = (
        bool(item.sender)
        and still_deferred
        and not item.delay_notified
        and is_delay_due(item.created_at, now, settings)
    )
    result = AttemptResult(
        outcomes=outcomes,
        next_attempt_at=max(now + retry_delay(item.attempts + 1, settings, rng), not_before or now),
        delay_notified=True if delay_due else None,
    )
    headers = None if message is None else header_block(message)
    return Attempt(
        item=item,
        result=result,
        remote_hosts=remote_hosts,
        headers=headers,
        fields=head_fields(headers),
        message=message if archive.is_archived(item, settings) else None,
        tls=tls or {},
        expired=expired,
        suppressed=suppressed,
        message_ids=message_ids or {},
        delay_due=delay_due,
    )


def close_broken_connections() -> None:
    """Close this thread's database connections that broke, so the next query reopens them.

    Not ``close_old_connections()``: under ``CONN_MAX_AGE = 0`` that closes every
    connection each time, and a worker would reconnect for every claim.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and connection.errors_occurred and not connection.is_usable():
            connection.close()


def report_error(error: BaseException, item_id: str | None) -> None:
    """Log an error the worker met and send the ``error`` signal about it."""
    logger.warning("error item=%s %s", item_id, error, extra={"action": "error", "item_id": item_id})
    signals.send(signals.error, error=error, item_id=item_id)


def store_enqueue(store: QueueStore, settings: QueueSettings, clock: Clock) -> Enqueue:
    """Return an ``Enqueue`` that adds to ``store`` what ``QueueService.enqueue`` would.

    The message is checked and completed as any other (size, recipients, a
    ``Message-ID`` and ``Date`` when missing), and due at once; the staging firewall
    holds or redirects it as any other.
    """

    def enqueue(message: bytes, *, sender: str, recipients: Sequence[str], priority: int, channel: str) -> QueueItem:
        from bumail_queue import mime  # here: a worker that sends no DSN never loads it

        now = clock()
        prepared = mime.from_bytes(
            message,
            sender=sender,
            recipients=recipients,
            hostname=settings.hostname,
            now=now,
            max_size=settings.max_message_size,
            max_recipients=settings.max_recipients,
        )
        new = prepared.new_item(now=now, next_attempt_at=now, priority=priority, channel=channel)
        screened = screen([new], settings.firewall)
        return screened.given(screened.add_to(store, settings.max_items))[0]

    return enqueue


class Recorder:
    """Records attempts in the store, then tells each one: counts, log, signals, DSNs.

    ``lease_until`` says until when the worker holds an item's lease (``None`` once it
    no longer does): an item gone from the store while the lease held was cancelled,
    one gone after it was lost to another worker.
    """

    def __init__(
        self,
        *,
        store: QueueStore,
        settings: QueueSettings,
        owner: str,
        clock: Clock,
        enqueue: Enqueue,
        stats: Stats,
        lease_until: Callable[[str], datetime | None],
        meter: Meter | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.owner = owner
        self.clock = clock
        self.enqueue = enqueue
        self.stats = stats
        self.meter = meter
        self._lease_until = lease_until
        self._counting = threading.Lock()

    def complete_many(self, attempts: Sequence[Attempt]) -> list[QueueItem | None]:
        """Complete attempts in one step of the store (``QueueStore.complete_many``), then tell each one.

        A store that is briefly unavailable (a restart, a failover) is tried again a
        few times: the mail has gone out, and an outcome not recorded means sending
        it again once the lease expires.
        """
        results = [(a.item.id, a.result) for a in attempts]
        delays = iter(RECORD_RETRY_DELAYS)
        while True:
            try:
                done = self.store.complete_many(results, owner=self.owner)
                break
            except QueueError as error:
                delay = next(delays, None) if error.code == ErrorCode.STORE_UNAVAILABLE else None
                if delay is None:
                    with self._counting:
                        self.stats.store_errors += 1
                    if self.meter is not None:
                        self.meter.store_failed()
                    for attempt in attempts:
                        report_error(error, attempt.item.id)
                    return [None] * len(attempts)
                logger.warning(
                    "recording again in %gs items=%d: %s", delay, len(attempts), error, extra={"action": "error"}
                )
                time.sleep(delay)
                close_broken_connections()
        self._update_suppressions(attempts, done)
        with delivery_log.gathered():  # the batch's log entries in one INSERT
            told = [self._told_alone(attempt, recorded) for attempt, recorded in zip(attempts, done, strict=True)]
        self._archive(attempts, done)
        return told

    def _archive(self, attempts: Sequence[Attempt], done: Sequence[QueueItem | QueueError | None]) -> None:
        """Archive the messages of the items that left the queue delivered, in one
        statement (``ARCHIVE``); from the message each attempt read, not the store,
        which dropped it with the item's last recipient."""
        now = self.clock()
        rows = []
        for attempt, recorded in zip(attempts, done, strict=True):
            if attempt.message is None or not isinstance(recorded, QueueItem):
                continue
            row = archive.archived_message(
                recorded, attempt.message, settings=self.settings, now=now, fields=attempt.fields
            )
            if row is not None:
                rows.append(row)
        archive.write(rows)

    def _update_suppressions(self, attempts: Sequence[Attempt], done: Sequence[QueueItem | QueueError | None]) -> None:
        """Write what the recorded outcomes change on the suppression list, in one step of the store.

        Before the signals, so that a receiver of ``failed`` finds the address on the
        list. Only recorded outcomes count: an attempt whose lease was lost is made
        again, and its expiry would count twice. The list is the queue's care, never
        the mail's: a store that refuses the write is reported, and the batch goes on.
        """
        settings = self.settings
        if not settings.suppression:
            return
        outcomes = [
            (address, outcome, address in attempt.expired)
            for attempt, recorded in zip(attempts, done, strict=True)
            if isinstance(recorded, QueueItem)
            for address, outcome in attempt.result.outcomes.items()
            if address not in attempt.suppressed
        ]
        now = self.clock()
        change = change_from(
            outcomes,
            now=now,
            duration=settings.suppression_duration,
            expiry_window=settings.suppression_expiry_window,
        )
        if not change:
            return
        try:
            update = self.store.update_suppressions(change, now=now)
        except QueueError as error:
            report_error(error, None)
            return
        for entry in update.suppressed:
            logger.info(
                "suppressed address=%s reason=%s until=%s reply=%s",
                entry.address, entry.reason.value, entry.expires_at.isoformat(), reply_line(entry.reply),
                extra={"action": "suppressed"},
            )  # fmt: skip
        for address in update.removed:
            logger.info("unsuppressed address=%s after a delivery", address, extra={"action": "unsuppressed"})

    def _told_alone(self, attempt: Attempt, recorded: QueueItem | QueueError | None) -> QueueItem | None:
        """Tell one attempt; what goes wrong there is that item's alone, never the batch's.

        The outcomes are recorded by now: an exception here must not cost the other
        items of the batch their signals, log entries and DSNs.
        """
        try:
            return self._told(attempt, recorded)
        except Exception as error:  # a bug: reported for this item, the batch goes on
            logger.exception(
                "telling an outcome failed item=%s",
                attempt.item.id,
                extra={"action": "error", "item_id": attempt.item.id},
            )
            report_error(error, attempt.item.id)
            return recorded if isinstance(recorded, QueueItem) else None

    def _told(self, attempt: Attempt, recorded: QueueItem | QueueError | None) -> QueueItem | None:
        """Send what one recorded attempt calls for: its signals, its DSNs, its errors."""
        item = attempt.item
        if isinstance(recorded, QueueError):
            if self.meter is not None and recorded.code == ErrorCode.LEASE_LOST:
                self.meter.lease_lost()
            report_error(recorded, item.id)
            return None
        if recorded is None:
            lease_until = self._lease_until(item.id)
            if lease_until is not None and self.clock() < lease_until and not attempt.lost_message:
                # Cancelled while we held the lease: say what the session did, no DSN.
                self._tell_outcomes(attempt, None)
            elif not attempt.lost_message:
                if self.meter is not None:
                    self.meter.lease_lost()
                report_error(
                    QueueError(
                        ErrorCode.LEASE_LOST,
                        f"Item {item.id} left the queue after its lease expired: lost to another worker or cancelled; nothing was recorded.",
                        item_id=item.id,
                    ),
                    item.id,
                )
            return None
        if attempt.lost_message:
            report_error(
                QueueError(
                    ErrorCode.MESSAGE_UNREADABLE,
                    f"The message of {item.id} is unreadable: the store holds the item but not its message, so every pending recipient failed.",
                    item_id=item.id,
                ),
                item.id,
            )
        self._tell_outcomes(attempt, recorded)
        self._send_dsns(attempt)
        return recorded

    def _tell_outcomes(self, attempt: Attempt, recorded: QueueItem | None) -> None:
        item = attempt.item
        if attempt.held:
            with self._counting:
                self.stats.held += 1
            return
        with self._counting:
            self.stats.items += 1
            for outcome in attempt.result.outcomes.values():
                name = outcome.status.value
                setattr(self.stats, name, getattr(self.stats, name) + 1)
        if self.meter is not None:
            self.meter.attempted(item, attempt.result.outcomes, self.clock())
        for address, outcome in attempt.result.outcomes.items():
            reply = outcome.reply
            logger.info(
                "outcome item=%s recipient=%s status=%s reply=%s",
                item.id, address, outcome.status.value, reply_line(reply),
                extra={"action": outcome.status.value, "item_id": item.id},
            )  # fmt: skip
            # The delivery log keeps the sender and the host that gave the reply.
            told = {
                "item_id": item.id,
                "recipient": address,
                "reply": reply,
                "envelope_sender": item.sender,
                "remote_host": attempt.remote_hosts.get(address),
                "tls": attempt.tls.get(address, False),
                "provider_message_id": attempt.message_ids.get(address),
                "subject": attempt.fields.subject,
                "message_id": attempt.fields.message_id,
            }
            if outcome.status == RecipientStatus.DELIVERED:
                signals.send(signals.delivered, **told)
            elif outcome.status == RecipientStatus.FAILED:
                signals.send(signals.failed, **told)
            else:
                next_at = recorded.next_attempt_at if recorded is not None else attempt.result.next_attempt_at
                signals.send(signals.deferred, **told, next_attempt_at=next_at)

    def _send_dsns(self, attempt: Attempt) -> None:
        item = attempt.item
        if not item.sender:
            return  # never a DSN about a message from <> (RFC 5321 §4.5.5)
        now = self.clock()
        # A suppressed recipient is reported as any failure, unless SUPPRESSION_DSN is off.
        told_of_suppressed = self.settings.suppression_dsn
        failed = [
            a
            for a, o in attempt.result.outcomes.items()
            if o.status == RecipientStatus.FAILED and (told_of_suppressed or a not in attempt.suppressed)
        ]
        if failed:
            self._send_dsn("failed", attempt, failed, now)
        if attempt.delay_due:
            delayed = [a for a, o in attempt.result.outcomes.items() if o.status == RecipientStatus.DEFERRED]
            self._send_dsn("delayed", attempt, delayed, now)

    def _send_dsn(self, kind: DSNKind, attempt: Attempt, addresses: list[str], now: datetime) -> None:
        item = attempt.item
        reported = [self._reported(attempt, address, kind, now) for address in addresses]
        try:
            data = build_dsn(
                kind=kind,
                reporting_mta=self.settings.hostname,
                original=item,
                # Read before the outcomes were recorded: the store drops the message
                # with the item's last pending recipient.
                original_message=attempt.headers,
                recipients=reported,
                now=now,
                will_retry_until=item.created_at + self.settings.max_age if kind == "delayed" else None,
            )
            # A report goes in the channel of the mail it reports on, so a bulk
            # channel's bounces wait their turn there, at DSN_PRIORITY.
            dsn_item = self.enqueue(
                data, sender="", recipients=[item.sender], priority=self.settings.dsn_priority, channel=item.channel
            )
            if self.meter is not None:
                self.meter.dsn_sent(kind)
        except QueueError as error:
            report_error(error, item.id)
            return
        except Exception as error:  # a DSN that cannot be built: this item's alone
            logger.exception(
                "a %s DSN could not be built item=%s", kind, item.id, extra={"action": "error", "item_id": item.id}
            )
            report_error(error, item.id)
            return
        signals.send(signals.dsn, kind=kind, dsn_id=dsn_item.id, of=item.id, to=item.sender, recipients=addresses)

    def _reported(self, attempt: Attempt, address: str, kind: DSNKind, now: datetime) -> ReportedRecipient:
        """Return how a DSN reports ``address``: its reply, or for one that expired, the
        last reply the remote sent (RFC 3464 §2.3.6's ``Diagnostic-Code``) under ``4.4.7``."""
        reply = attempt.result.outcomes[address].reply
        last = attempt.expired.get(address)
        return ReportedRecipient(
            address=address,
            action=kind,
            reply=reply if last is None else last,
            remote_mta=attempt.remote_hosts.get(address),
            last_attempt_at=now,
            status=None if last is None else EXPIRED_STATUS,
            reason="" if last is None else _expiry_reason(self.settings.max_age),
            attempted=address not in attempt.suppressed,
        )


def _expired(outcome: Outcome, max_age: timedelta) -> Outcome:
    """Turn a deferral past ``MAX_AGE`` into a final failure (4.4.7), keeping the last reply."""
    if outcome.status != RecipientStatus.DEFERRED:
        return outcome
    reply = outcome.reply
    text = f"{_expiry_reason(max_age)}; last reply: {reply_line(reply)}"
    return Outcome(status=RecipientStatus.FAILED, reply=Reply(code=reply.code, status=EXPIRED_STATUS, text=text[:512]))


def _expiry_reason(max_age: timedelta) -> str:
    return f"Delivery time expired after {_days(max_age)}"


def _days(span: timedelta) -> str:
    days = span.total_seconds() / 86400
    if days == 1:
        return "1 day"
    return f"{days:g} days" if days > 1 else f"{span.total_seconds():g} seconds"
