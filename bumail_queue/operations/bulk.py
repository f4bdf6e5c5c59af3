"""Bulk actions by filter: ``queue_hold``, ``queue_release``, ``queue_cancel`` and
``queue_retry`` with a filter, through the service's ``hold``, ``release``,
``cancel_matching`` and ``retry_matching``.

A filter's items are read a page at a time (``QueueStore.bulk_page``, by a key no
write changes), and each page's items are acted on as one batch: one statement or
script per batch on the ORM and Redis stores, so that no lock is held for longer than
a batch and the workers' claims run between batches. A dry run reads the same pages
and changes nothing. Every run that is not a dry run leaves an audit entry
(``models.BulkAction``): who, which action, the filter, how many.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from bumail_queue.addresses import domain_of
from bumail_queue.errors import ErrorCode, QueueError, first_line
from bumail_queue.items import QueueItem, check_channel
from bumail_queue.models import BulkAction
from bumail_queue.preview import summarize_head
from bumail_queue.queries import HoldResult, ItemQuery, ItemState, state_of
from bumail_queue.stores import QueueStore
from bumail_queue.suppression_service import recipient_domain

logger = logging.getLogger(__name__)

#: How many items a page reads and a batch acts on.
BATCH = 1000
#: How many of the matching items a result shows.
SAMPLE = 10


class Action(enum.StrEnum):
    """What a bulk action does to each item it matches."""

    HOLD = "hold"
    RELEASE = "release"
    CANCEL = "cancel"
    RETRY = "retry"

    @property
    def past(self) -> str:
        return {"hold": "held", "release": "released", "cancel": "cancelled", "retry": "made due now"}[self.value]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BulkFilter:
    """Which items a bulk action is for: every field left ``None`` matches every item.

    ``domain`` matches an item with a recipient at that domain, ``channel`` exactly,
    ``state`` as ``queries.state_of`` judges it when the action starts, ``older_than``
    an item created longer ago than that, ``sender`` and ``recipient`` as address
    patterns (``*`` for any text: ``*@example.com``, ``ann*``; case ignored).
    """

    domain: str | None = None
    channel: str | None = None
    state: ItemState | None = None
    older_than: timedelta | None = None
    sender: str | None = None
    recipient: str | None = None

    def __post_init__(self) -> None:
        for name in ("domain", "channel", "sender", "recipient"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise QueueError(ErrorCode.INVALID, f"The filter's {name} is empty.")
        if self.domain is not None:
            recipient_domain(self.domain)  # raises INVALID for what is no domain
        if self.channel is not None:
            check_channel(self.channel)
        if self.older_than is not None and self.older_than <= timedelta(0):
            raise QueueError(ErrorCode.INVALID, "'older_than' must be longer than 0.")
        if self.state is not None:
            object.__setattr__(self, "state", ItemState(self.state))

    @property
    def is_empty(self) -> bool:
        """Return whether the filter matches every item."""
        return all(getattr(self, field.name) is None for field in dataclasses.fields(self))

    def query(self, now: datetime, *, state: ItemState | None = None) -> ItemQuery:
        """Return the store's query of this filter at ``now`` (``state`` in place of its own)."""
        return ItemQuery(
            now=now,
            state=state or self.state,
            domain=self.domain,
            channel=self.channel,
            sender=self.sender,
            recipient=self.recipient,
            older_than=self.older_than,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the fields given, as JSON keeps them (``older_than`` in seconds)."""
        data: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, timedelta):
                data[field.name] = int(value.total_seconds())
            elif value is not None:
                data[field.name] = str(value) if field.name != "domain" else domain_of("@" + value)
        return data


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Sampled:
    """One of the items a bulk action matched, as its result shows it."""

    id: str
    recipients: tuple[str, ...]
    subject: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BulkResult:
    """What a bulk action did, or with ``dry_run`` would do.

    ``count`` is how many items it changed (would change); ``skipped`` how many it
    matched and left alone: being delivered (a lease holds them), or changed by
    another meanwhile. ``sample`` shows the first ``SAMPLE`` items it was for;
    ``batches`` counts the pages read.
    """

    action: Action
    dry_run: bool
    count: int
    skipped: int
    sample: tuple[Sampled, ...]
    batches: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Batch:
    """What acting on one batch did: how many items it changed, how many it left alone."""

    changed: int
    skipped: int


#: Acts on one batch of ids; given by the service, which knows what each action sends.
Act = Callable[[Sequence[str]], Batch]


def is_candidate(action: Action, item: QueueItem, now: datetime) -> bool | None:
    """Return whether ``action`` changes ``item``: ``True``, or ``None`` to skip it (a
    lease holds it), or ``False`` when it is not the action's to change at all."""
    state = state_of(item, now)
    if action == Action.CANCEL:
        return True
    if action == Action.RELEASE:
        return state == ItemState.HELD
    if state == ItemState.HELD:  # a hold leaves it held; so does a retry by filter
        return False
    return None if state == ItemState.DELIVERING else True


def run(
    store: QueueStore,
    action: Action,
    wanted: BulkFilter,
    *,
    act: Act,
    clock: Callable[[], datetime],
    dry_run: bool = False,
    by: str = "",
    batch: int = BATCH,
) -> BulkResult:
    """Act on the items ``wanted`` matches, a batch at a time, and record it.

    A release is for held items whatever the filter's state; the others leave a held
    item alone. Stops at the first error, which is raised after the audit entry (with
    what was done so far) is written.
    """
    if action == Action.RELEASE and wanted.state not in (None, ItemState.HELD):
        raise QueueError(ErrorCode.INVALID, "A release is for held items: give no state, or 'held'.")
    if action in (Action.HOLD, Action.RETRY) and wanted.state == ItemState.HELD:
        raise QueueError(ErrorCode.INVALID, f"Held items are left held by a {action}: release them.")
    started = clock()
    query = wanted.query(started, state=ItemState.HELD if action == Action.RELEASE else None)
    count = skipped = batches = 0
    sample: list[Sampled] = []
    cursor: str | None = None
    stopped = ""
    try:
        while True:
            page = store.bulk_page(query, cursor=cursor, limit=batch)
            batches += 1
            now = clock()
            verdicts = [(item, is_candidate(action, item, now)) for item in page.items]
            chosen = [item for item, verdict in verdicts if verdict]
            left = sum(1 for _, verdict in verdicts if verdict is None)
            if len(sample) < SAMPLE and chosen:
                sample += _sampled(store, chosen[: SAMPLE - len(sample)])
            if dry_run:
                count, skipped = count + len(chosen), skipped + left
            elif chosen:
                done = act([item.id for item in chosen])
                count, skipped = count + done.changed, skipped + left + done.skipped
            else:
                skipped += left
            cursor = page.cursor
            if cursor is None:
                break
    except Exception as error:
        stopped = first_line(error)
        raise
    finally:
        if not dry_run:
            _record(action, wanted, by=by, at=started, count=count, skipped=skipped, stopped=stopped)
    return BulkResult(
        action=action, dry_run=dry_run, count=count, skipped=skipped, sample=tuple(sample), batches=batches
    )


class BulkService:
    """The bulk actions of ``QueueService`` (a base class of it), over its store, its
    clock, its ``cancel`` and its delivery tasks."""

    clock: Callable[[], datetime]

    @property
    def store(self) -> QueueStore:
        raise NotImplementedError

    def cancel(self, id: str) -> QueueItem | None:
        raise NotImplementedError

    def _send_tasks(self, store: QueueStore, ids: Sequence[str] | None, *, at: datetime | None = None) -> None:
        raise NotImplementedError

    def hold(self, wanted: BulkFilter, *, dry_run: bool = False, by: str = "", batch: int = BATCH) -> BulkResult:
        """Hold the items ``wanted`` matches: none is claimed until released. An item
        being delivered is left to its worker (``skipped``); one held already is not
        counted."""
        store = self.store

        def act(ids: Sequence[str]) -> Batch:
            done = store.hold(ids, now=self.clock())
            return Batch(changed=len(done.changed), skipped=len(done.leased) + len(done.unchanged))

        return run(store, Action.HOLD, wanted, act=act, clock=self.clock, dry_run=dry_run, by=by, batch=batch)

    def release(self, wanted: BulkFilter, *, dry_run: bool = False, by: str = "", batch: int = BATCH) -> BulkResult:
        """Make the held items ``wanted`` matches due now; idle workers are woken."""
        store = self.store

        def act(ids: Sequence[str]) -> Batch:
            done = store.release(ids, now=self.clock())
            if done.changed:
                self._send_tasks(store, done.changed)
            return Batch(changed=len(done.changed), skipped=len(done.unchanged))

        return run(store, Action.RELEASE, wanted, act=act, clock=self.clock, dry_run=dry_run, by=by, batch=batch)

    def cancel_matching(
        self, wanted: BulkFilter, *, dry_run: bool = False, by: str = "", batch: int = BATCH
    ) -> BulkResult:
        """Cancel the items ``wanted`` matches, each as ``cancel`` does (no DSN; the
        ``cancelled`` signal, so the delivery log records each recipient not final)."""

        def act(ids: Sequence[str]) -> Batch:
            changed = sum(1 for item_id in ids if self.cancel(item_id) is not None)
            return Batch(changed=changed, skipped=len(ids) - changed)

        return run(self.store, Action.CANCEL, wanted, act=act, clock=self.clock, dry_run=dry_run, by=by, batch=batch)

    def retry_matching(
        self, wanted: BulkFilter, *, dry_run: bool = False, by: str = "", batch: int = BATCH
    ) -> BulkResult:
        """Make the items ``wanted`` matches due now, by the admin's *Retry now* rules:
        an item being delivered is left to its worker, a held one stays held, no attempt
        is counted; idle workers are woken."""
        store = self.store

        def act(ids: Sequence[str]) -> Batch:
            done = store.retry_items(ids, now=self.clock())
            if done.due:
                self._send_tasks(store, [item_id for item_id in ids if item_id not in {*done.leased, *done.missing}])
            return Batch(changed=done.due, skipped=len(done.leased) + len(done.missing))

        return run(store, Action.RETRY, wanted, act=act, clock=self.clock, dry_run=dry_run, by=by, batch=batch)

    def hold_items(self, ids: Sequence[str]) -> HoldResult:
        """Hold the items ``ids`` names (the admin's selected rows), as ``hold`` does by
        filter: an item being delivered is left to its worker. No audit entry: the
        admin's actions on selected rows leave none."""
        return self.store.hold(ids, now=self.clock())

    def release_items(self, ids: Sequence[str]) -> HoldResult:
        """Make the held items among ``ids`` due now, as ``release`` does; idle workers
        are woken."""
        store = self.store
        done = store.release(ids, now=self.clock())
        if done.changed:
            self._send_tasks(store, done.changed)
        return done


def _sampled(store: QueueStore, items: Sequence[QueueItem]) -> list[Sampled]:
    heads = store.read_message_heads([item.id for item in items], size=4096)
    return [
        Sampled(
            id=item.id,
            recipients=tuple(r.address for r in item.recipients),
            subject=summarize_head(heads[item.id]).subject if item.id in heads else "",
        )
        for item in items
    ]


def _record(
    action: Action, wanted: BulkFilter, *, by: str, at: datetime, count: int, skipped: int, stopped: str
) -> None:
    """Write the audit entry; a failure to write it is logged, and does not undo the action."""
    try:
        BulkAction.objects.create(
            acted_at=at,
            by=by[:150] or "unknown",
            action=action.value,
            filter=wanted.to_dict(),
            matched=count + skipped,
            changed=count,
            skipped=skipped,
            stopped=stopped,
        )
    except Exception as error:  # the action is done: say so, without a traceback
        logger.warning("The audit entry of a bulk %s could not be written: %s", action, first_line(error))
    logger.info(
        "Bulk %s by %s, filter %s: %d %s, %d skipped%s.",
        action,
        by or "unknown",
        wanted.to_dict(),
        count,
        action.past,
        skipped,
        f", stopped: {stopped}" if stopped else "",
    )
