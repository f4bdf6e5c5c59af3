"""The store contract: what every queue store promises, whatever keeps the items.

Every store runs the same contract suite (``bumail_queue.testing.StoreContract``). Its promises:

- ``claim`` is atomic: two claimers, in any process, never get the same item; an item
  whose lease expired is claimable again. A claimed item's ``next_attempt_at`` becomes
  its lease's expiry, so leased items leave the due range and a crashed worker's items
  fall due by themselves.
- ``complete``, ``renew`` and ``reschedule`` with an owner act only for the lease's
  owner. ``complete`` applies the outcomes, the schedule and the count, and lets go of
  the lease in one step; a final recipient status never changes; an item whose every
  recipient is final is dropped with its message.
- ``add`` never makes an item claimable before its message is readable.
- ``read_message`` returns ``None`` for a message the store lost, never raises for it.
- Times come from the caller: a store keeps no clock.
- Nothing returned is shared with what the store keeps.
- Text kept holds no NUL and no lone surrogate: such input is ``INVALID``, and an id
  holding one is an id no item has.
- ``retry_deferred`` and ``retry_items`` leave an item a lease holds alone, count no
  attempt, and never make an item due later than it was; ``retry_deferred`` leaves a
  held item held (``retry_items``, given its id, releases it).
- A held item (``hold``: its ``next_attempt_at`` is ``queries.HELD_AT``) is never
  claimed, whatever the claim's ``now``, until ``release`` makes it due at its
  ``now``. ``hold`` leaves an item a lease holds alone. ``bulk_page`` pages through
  a filter's items by a key that changes with no write: an item present throughout
  is on some page however the items change meanwhile.
- ``claim_items`` (where ``claims_by_id``) is ``claim`` restricted to the items named:
  as atomic, and it takes only those due and free, so two claimers of one id never
  both get it.
- ``gauges`` is exact on a queue of up to ``gauge_sample_rows`` items; beyond, a store
  may estimate from a sample, and says so (``exact`` false).
- MTA-STS policies are kept one per domain, the last put replacing the one before,
  expired or not (the caller compares ``expires_at`` with its own time) until
  ``purge_sts`` deletes those expired; so are failed fetches, each for its policy id
  until its ``until``; TLS session
  counts of one kind add up, in one step per call, and a day's are read back whole.
- The suppression list is keyed by ``addresses.normal_address``: an address is found
  however its domain is written, and so are an erased address's entries, kept under
  its ``suppression.forgotten_key`` (``suppression.lookup_keys`` names both, for the
  same round trip). An entry is in force until its ``expires_at``; one past it is
  never returned, whether or not it was purged yet. ``suppressions_of`` answers a
  batch in one round trip; ``update_suppressions`` is one atomic step, so
  two workers noting an address's expiries at once suppress it once they are two.
- A store that ``supports_shaping`` decides each ``take_permit`` in one step across
  every process: no more slots are granted than the limit, no more tokens than the
  rate refills, nothing while suspended; a slot whose lease ended is free again.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterable, Iterator, Sequence
from datetime import date, datetime, timedelta
from typing import Any, ClassVar

from django.core.checks import CheckMessage

from bumail_queue.addresses import domain_of, u_labels
from bumail_queue.conf import QueueSettings, normalise_domain
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import AttemptResult, NewItem, QueueItem, RecipientStatus, check_channel, check_priority
from bumail_queue.queries import (
    AGE_BUCKETS,
    HELD_AT,
    BulkPage,
    ChannelGauges,
    HoldResult,
    ItemCount,
    ItemQuery,
    QueueGauges,
    QueueSummary,
    RetryResult,
    channel_gauges_of,
    gauges_of,
    is_held,
    lane_order,
    summarize,
)
from bumail_queue.shaping import DestinationState, Permit, PermitRequest, WindowChange
from bumail_queue.sts import STSFailure, STSPolicy, TLSSessionCount
from bumail_queue.suppression import (
    GLOBAL_SCOPE,
    Suppression,
    SuppressionChange,
    SuppressionReason,
    SuppressionUpdate,
    entry_in,
    require_scope,
)
from bumail_queue.text import is_keepable, require_keepable

#: How many bytes of each message ``read_message_heads`` returns unless told.
MESSAGE_HEAD_BYTES = 8192
#: How often ``complete`` reads an item again when another write changed it between
#: its read and its write, before it gives up with ``LEASE_LOST``.
COMPLETE_TRIES = 8


class WorkListener(abc.ABC):
    """Wakes an idle worker when work is announced (PostgreSQL's LISTEN/NOTIFY)."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block until work is announced (``True``) or ``timeout`` seconds pass (``False``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop listening and let go of the connection."""


class QueueStore(abc.ABC):
    """Keeps the queue: items, their messages, and the leases of the workers."""

    supports_transactional_enqueue: ClassVar[bool] = False
    """Whether ``add`` joins the caller's database transaction (the ORM store does)."""

    durable: ClassVar[bool] = True
    """Whether what is added survives the process (the memory store's does not)."""

    counts_are_estimates: ClassVar[bool] = False
    """Whether ``estimated_count`` may answer with an estimate (``exact=False``) rather
    than a count: the ORM store on a large PostgreSQL table does; Redis counts exactly."""

    claims_by_id: ClassVar[bool] = False
    """Whether ``claim_items`` is implemented (every built-in store's is). Without it, a
    delivery task given item ids runs a bounded pass over everything due instead."""
    gauge_sample_rows: int = 10_000
    """Up to about this many items ``gauges`` reads them all; a store that samples a
    larger queue (the ORM store on PostgreSQL, Redis) reads about this many, so a
    scrape costs the same whatever the queue's size."""

    supports_shaping: ClassVar[bool] = False
    """Whether the store keeps the buckets of ``SHAPING`` (``take_permit`` and the rest),
    shared by every worker; every store bumail_queue ships does (E029 otherwise)."""

    def __init__(self, settings: QueueSettings) -> None:
        self.settings = settings

    @abc.abstractmethod
    def add_many(self, items: Sequence[NewItem], *, max_items: int | None = None) -> builtins.list[QueueItem]:
        """Add items and their messages in one step: all of them, or none.

        An item whose ``key`` is already in the queue is not added; the item holding
        that key is returned in its place. Raise ``QueueError(FULL)`` when the new
        items would take the queue beyond ``max_items``.
        """

    def add(self, item: NewItem, *, max_items: int | None = None) -> QueueItem:
        """Add one item and its message; see ``add_many``."""
        return self.add_many([item], max_items=max_items)[0]

    @abc.abstractmethod
    def get(self, item_id: str) -> QueueItem | None:
        """Return the item, or ``None``."""

    @abc.abstractmethod
    def list(self, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        """Return a page of items, earliest due first, then oldest first."""

    @abc.abstractmethod
    def count(self) -> int:
        """Return how many items the queue holds."""

    @abc.abstractmethod
    def read_message(self, item_id: str) -> bytes | None:
        """Return the message's bytes as enqueued, or ``None`` when there are none."""

    def read_messages(self, item_ids: Iterable[str]) -> dict[str, bytes]:
        """Return the messages of several items by id; an item without one is left out."""
        found = {}
        for item_id in item_ids:
            message = self.read_message(item_id)
            if message is not None:
                found[item_id] = message
        return found

    @abc.abstractmethod
    def claim(self, *, owner: str, now: datetime, lease_until: datetime, limit: int = 1) -> builtins.list[QueueItem]:
        """Lease up to ``limit`` items due at ``now`` to ``owner`` until ``lease_until``.

        An item is due when its ``next_attempt_at`` has passed and no unexpired lease
        holds it. The due items are taken, and returned, in ``items.fair_order``:
        channels in turn, and in each channel the higher priority first, then the
        earliest due, then the oldest. A claim costs what the queue's size does to an
        index lookup, whatever the number of items due or waiting: it reads the front
        of each lane (a channel's items of one priority), never a whole lane.
        """

    def claim_items(
        self, item_ids: Sequence[str], *, owner: str, now: datetime, lease_until: datetime
    ) -> builtins.list[QueueItem]:
        """Lease to ``owner`` until ``lease_until`` those of ``item_ids`` due at ``now``, as
        ``claim`` does; return them, oldest first.

        An id of no item, of an item not due yet, or of one an unexpired lease holds is
        passed over: of two claimers naming the same item, one gets it. For the delivery
        tasks, whose arguments are the ids of the mail they were sent for. A store
        that implements it sets ``claims_by_id``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not claim items by id (claims_by_id is False).")

    @abc.abstractmethod
    def renew(self, item_id: str, *, owner: str, lease_until: datetime) -> bool:
        """Extend ``owner``'s lease; ``False`` when the owner no longer holds it."""

    @abc.abstractmethod
    def complete(self, item_id: str, *, owner: str, result: AttemptResult) -> QueueItem | None:
        """Record an attempt's outcome and let go of the lease, in one step.

        Return the item as recorded (dropped, with its message, when every recipient is
        final), or ``None`` when the item is no longer in the queue. Raise
        ``QueueError(LEASE_LOST)`` when ``owner`` does not hold the lease: then nothing
        is recorded.
        """

    def complete_many(
        self, results: Sequence[tuple[str, AttemptResult]], *, owner: str
    ) -> builtins.list[QueueItem | QueueError | None]:
        """Record several attempts of one owner, as ``complete`` does each.

        Return, in the order given, what ``complete`` returns for each item, or the
        ``QueueError`` it would raise (``LEASE_LOST``): one item's refusal never keeps
        the others from being recorded. A store may record them all in one commit.
        """
        done: builtins.list[QueueItem | QueueError | None] = []
        for item_id, result in results:
            try:
                done.append(self.complete(item_id, owner=owner, result=result))
            except QueueError as error:
                if error.code != ErrorCode.LEASE_LOST:
                    raise
                done.append(error)
        return done

    @abc.abstractmethod
    def reschedule(self, item_id: str, *, at: datetime, owner: str | None = None) -> bool:
        """Make the item due at ``at``; ``True`` when it moved.

        With an ``owner``, only while that owner holds the lease, which it lets go of
        (how a stopping worker gives back what it claimed); without one, a lease stays.
        """

    @abc.abstractmethod
    def cancel(self, item_id: str) -> QueueItem | None:
        """Drop the item and its message; return it as it stood, or ``None``."""

    # -- reading for operators: the admin and queue_status ------------------------------
    # Each has a plain-Python default built on ``list`` and ``read_message``, right for
    # any store but reading the whole queue; a store with indexes should do better.

    def search(self, query: ItemQuery, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        """Return a page of the items ``query`` matches, in ``list``'s order.

        Every store matches ``query.state``, ``query.domain`` and ``query.text`` as
        ``ItemQuery`` documents; ``offset`` and ``limit`` count matching items only.
        """
        if query.item_id is not None:  # an id: one get, no scan
            found = self.get(query.item_id)
            return [found] if found is not None and query.matches(found) and offset == 0 and limit > 0 else []
        matched: builtins.list[QueueItem] = []
        for item in self._scan():
            if query.matches(item):
                matched.append(item)
                if len(matched) >= offset + limit:
                    break
        return matched[offset:]

    def read_message_heads(self, item_ids: Sequence[str], *, size: int = MESSAGE_HEAD_BYTES) -> dict[str, bytes]:
        """Return the first ``size`` bytes of each item's message, by item id.

        An id without a message (unknown, gone, lost) is left out. For the admin's
        list, which shows each item's subject without reading whole messages.
        """
        return {item_id: data[:size] for item_id, data in self.read_messages(item_ids).items()}

    def summary(self, *, now: datetime, age_buckets: Sequence[timedelta] = AGE_BUCKETS) -> QueueSummary:
        """Return the counts by state, the oldest item and the queue's shape at ``now``."""
        return summarize(self._scan(), now=now, age_buckets=age_buckets)

    def lanes(self) -> builtins.list[tuple[str, int]]:
        """Return the lanes that hold an item, ``(channel, priority)`` each, in
        ``queries.lane_order`` (the admin's filters offer them)."""
        held = {(item.channel, item.priority) for item in self._scan()}
        return sorted(held, key=lambda lane: lane_order(*lane))

    def gauges(self, *, now: datetime) -> QueueGauges:
        """Return what a monitor reads of the queue at ``now`` (``bumail_queue.metrics``).

        Read at every scrape, so it must stay cheap on a large queue: a store may
        answer from a sample beyond ``gauge_sample_rows`` items (``exact`` false). The
        default reads the whole queue through ``list`` and is exact.
        """
        return gauges_of(self._scan(), now=now)

    def channel_gauges(self, *, now: datetime) -> dict[str, ChannelGauges]:
        """Return each channel's items by state and the oldest of each state at ``now``
        (``bumail_queue.metrics``' ``channel`` label); a channel with no item is left out.

        As cheap as ``gauges`` and read with it at every scrape: exact up to
        ``gauge_sample_rows`` items, beyond which a store may estimate from a sample
        (``exact`` false). The default reads the whole queue through ``list``.
        """
        return channel_gauges_of(self._scan(), now=now)

    def estimated_count(self) -> ItemCount:
        """Return how many items the queue holds, an estimate where counting is costly.

        The admin shows it above its list, with "about" only when ``exact`` is false.
        The default is ``count()``, exact; a store that estimates says so with
        ``counts_are_estimates``.
        """
        return ItemCount(self.count(), exact=True)

    # -- retrying for operators: queue_retry --------------------------------------------
    # Defaults built on ``list``, ``get`` and ``reschedule``: right for any store, but
    # the first reads the whole queue and moves items one by one.

    def retry_deferred(self, *, now: datetime, domain: str | None = None) -> int:
        """Make every item with a deferred recipient due at ``now``; return how many moved.

        Only items not due yet and free of any lease at ``now`` move, as the admin's
        *Retry now* leaves an item being delivered to its worker; no attempt is
        counted. With ``domain`` (in ``conf.normalise_domain``'s form), only items with
        a deferred recipient at that domain, each recipient's domain compared in that
        form. Idle workers are woken when an item moved.
        """
        # Every id first: an item moved while the pages are read would shift them.
        waiting = [
            item.id for item in self._scan() if self.is_waiting(item, now) and self.has_deferred_recipient(item, domain)
        ]
        return sum(self.reschedule(item_id, at=now) for item_id in waiting)

    def retry_items(self, item_ids: Sequence[str], *, now: datetime) -> RetryResult:
        """Make the items named due at ``now``, whatever their recipients' state.

        As the admin's *Retry now*: an item a lease holds at ``now`` is left alone
        (``leased``), an id no item has is ``missing``; ``due`` counts the others,
        each due now (one due earlier keeps its time). No attempt is counted; idle
        workers are woken when an item was made due.
        """
        due, leased, missing = 0, [], []
        for item_id in dict.fromkeys(item_ids):
            item = self.get(item_id)
            if item is not None and item.is_leased_at(now):
                leased.append(item_id)
            elif item is not None and (item.next_attempt_at <= now or self.reschedule(item_id, at=now)):
                due += 1
            else:
                missing.append(item_id)
        return RetryResult(due=due, leased=tuple(leased), missing=tuple(missing))

    # -- bulk actions for operators: queue_hold, queue_release (operations/bulk) --------
    # Defaults built on ``list``, ``get`` and ``reschedule``: right for any store, but
    # each page reads the whole queue and each item moves on its own.

    def bulk_page(self, query: ItemQuery, *, cursor: str | None = None, limit: int = 1000) -> BulkPage:
        """Return the items ``query`` matches among the next ``limit`` items by a key no
        write changes, from ``cursor`` (``None``: the first), and the next cursor. A
        store may read about ``limit`` rather than exactly (Redis reads a step of
        ``ZSCAN``, a small queue at once).

        A page may hold fewer matches than ``limit``, even none, with a cursor to go on
        from; the cursor is ``None`` once every item was read. An item present from the
        first page to the last is returned at least once, whatever is held, released,
        added or dropped meanwhile. ``text`` is matched as ``ItemQuery.matches`` says.
        """
        ids = sorted(item.id for item in self._scan())
        start = 0 if cursor is None else next((i for i, item_id in enumerate(ids) if item_id > cursor), len(ids))
        chunk = ids[start : start + limit]
        found = [item for item_id in chunk if (item := self.get(item_id)) is not None and query.matches(item)]
        return BulkPage(items=tuple(found), cursor=chunk[-1] if start + limit < len(ids) else None)

    def hold(self, item_ids: Sequence[str], *, now: datetime) -> HoldResult:
        """Hold the items named: none is claimed until ``release``d.

        An item a lease holds at ``now`` is left alone (``leased``); one already held, or
        no item, is ``unchanged``. The ORM and Redis stores hold a batch in one step.
        """
        changed, leased, unchanged = [], [], []
        for item_id in dict.fromkeys(item_ids):
            item = self.get(item_id)
            if item is not None and item.is_leased_at(now):
                leased.append(item_id)
            elif item is not None and not is_held(item.next_attempt_at) and self.reschedule(item_id, at=HELD_AT):
                changed.append(item_id)
            else:
                unchanged.append(item_id)
        return HoldResult(changed=tuple(changed), leased=tuple(leased), unchanged=tuple(unchanged))

    def release(self, item_ids: Sequence[str], *, now: datetime) -> HoldResult:
        """Make the held items named due at ``now``; an item not held, or no item, is
        ``unchanged``. Idle workers are woken when one was released."""
        changed, unchanged = [], []
        for item_id in dict.fromkeys(item_ids):
            item = self.get(item_id)
            if item is not None and is_held(item.next_attempt_at) and self.reschedule(item_id, at=now):
                changed.append(item_id)
            else:
                unchanged.append(item_id)
        return HoldResult(changed=tuple(changed), unchanged=tuple(unchanged))

    # -- MTA-STS policies and TLS report counts (docs/mta-sts.md) ---------------------------

    @abc.abstractmethod
    def get_sts_policy(self, domain: str) -> STSPolicy | None:
        """Return the MTA-STS policy kept for ``domain``, expired or not, or ``None``."""

    @abc.abstractmethod
    def put_sts_policy(self, policy: STSPolicy) -> None:
        """Keep ``policy`` for its domain, in place of the one kept before."""

    @abc.abstractmethod
    def get_sts_failure(self, domain: str, policy_id: str, *, now: datetime) -> STSFailure | None:
        """Return the failed fetch of ``domain``'s policy ``policy_id`` kept until after ``now``, or ``None``."""

    @abc.abstractmethod
    def put_sts_failure(self, failure: STSFailure) -> None:
        """Keep ``failure`` for its domain, in place of the one kept before."""

    @abc.abstractmethod
    def purge_sts(self, *, now: datetime) -> int:
        """Delete the policies expired at ``now`` and the failures kept until ``now`` or
        before; return how many went. Cheap: an index finds them, however many are kept."""

    @abc.abstractmethod
    def count_tls_sessions(self, counts: Sequence[TLSSessionCount]) -> None:
        """Add ``counts`` to those kept, all in one step.

        Counts of one kind (``TLSSessionCount.kind``) add up; the policy and the reason
        kept for a kind are those of its first count.
        """

    @abc.abstractmethod
    def tls_session_counts(self, day: date) -> builtins.list[TLSSessionCount]:
        """Return the counts of ``day``, one per kind, in no particular order."""

    @abc.abstractmethod
    def purge_tls_session_counts(self, *, before: date) -> int:
        """Delete the counts of every day before ``before``; return how many kinds went."""

    # -- the suppression list ---------------------------------------------------------

    def suppressions_of(
        self, addresses: Iterable[str], *, now: datetime, scopes: Sequence[str] = (GLOBAL_SCOPE,)
    ) -> dict[str, Suppression]:
        """Return the entry in force at ``now`` for each of ``addresses`` on the list in
        one of ``scopes`` (the first of them, where it has entries in several).

        Keyed by each address as given; an address not on the list (or whose entry
        expired) is left out. One round trip for the whole batch.
        """
        found = self.suppression_entries(addresses, now=now, scopes=scopes)
        return {address: entry for address, entries in found.items() if (entry := entry_in(entries, scopes))}

    @abc.abstractmethod
    def suppression_entries(
        self, addresses: Iterable[str], *, now: datetime, scopes: Sequence[str] | None = None
    ) -> dict[str, builtins.list[Suppression]]:
        """Return the entries in force at ``now`` of each of ``addresses`` in ``scopes``
        (``None``: in every scope), keyed by each address as given.

        One round trip for the whole batch: the worker asks once per claim, with the
        scopes of its items' channels.
        """

    @abc.abstractmethod
    def update_suppressions(self, change: SuppressionChange, *, now: datetime) -> SuppressionUpdate:
        """Apply ``change`` in one atomic step; return what it did (see ``SuppressionChange``).

        An address of ``change.expired`` with a note of an earlier expiry still
        lasting at ``now`` gets its entry from there; one without gets a note until
        ``change.note_until`` (an address whose entry is in force keeps it). The
        entries written and the entries in force taken off are returned.
        """

    @abc.abstractmethod
    def search_suppressions(
        self,
        *,
        now: datetime,
        text: str | None = None,
        scope: str | None = None,
        reason: SuppressionReason | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> builtins.list[Suppression]:
        """Return a page of the entries in force at ``now``, the newest first.

        With ``text``, only those whose address holds it (``suppression.search_form``,
        ASCII letters compared without case); with ``scope`` or ``reason``, only those
        of it. ``offset`` and ``limit`` count those alone.
        """

    @abc.abstractmethod
    def count_suppressions(self, *, now: datetime) -> int:
        """Return how many entries are in force at ``now``."""

    @abc.abstractmethod
    def purge_suppressions(self, *, now: datetime) -> int:
        """Drop the entries and notes that expired by ``now``; return how many entries."""

    @staticmethod
    def validate_suppressions(change: SuppressionChange) -> None:
        """Refuse entries holding text no store can keep (``INVALID``)."""
        for entry in (*change.add, *change.expired):
            require_keepable(entry.address, "suppressed address")
            require_keepable(entry.reply.text, "reply text")
            require_keepable(entry.reply.status, "reply status")
            require_scope(entry.scope)
        for entry in change.expired:
            if entry.scope != GLOBAL_SCOPE:
                raise QueueError(ErrorCode.INVALID, "An expiry is noted in the global scope alone.")
        for address in (*change.clear, *(address for address, _ in change.clear_scoped)):
            require_keepable(address, "suppressed address")
        for _, scope in change.clear_scoped:
            require_scope(scope)

    def _scan(self, chunk: int = 1000) -> Iterator[QueueItem]:
        offset = 0
        while page := self.list(offset=offset, limit=chunk):
            yield from page
            offset += len(page)

    # -- shaping: one bucket per destination, shared by every worker (docs/shaping.md) ----
    # Times come from the caller, as everywhere; buckets keep them as seconds since the epoch.

    def take_permit(self, request: PermitRequest) -> Permit:
        """Decide in one step whether a session to ``request.key`` may start now.

        Granted when the destination is not suspended, its token bucket holds a token
        (``RATE``) and fewer slots than its limit are held (``CONCURRENCY``, or the
        slow-start window under it): then the token is taken and ``request.slot`` held
        until ``request.slot_until``. Refused, nothing is taken. Either way the items
        ``request.held`` are counted for ``destination_states``.
        """
        raise self._no_shaping()

    def release_permit(
        self,
        key: str,
        *,
        slot: str | None,
        now: datetime,
        change: WindowChange = WindowChange.KEEP,
        concurrency: int | None = None,
        suspend_until: datetime | None = None,
    ) -> None:
        """End a session in one step: let go of ``slot``, apply ``change`` to the
        slow-start window (grown at most to ``concurrency``), and suspend the destination
        until ``suspend_until`` (a later suspension already set stays)."""
        raise self._no_shaping()

    def renew_permit(self, key: str, *, slot: str, now: datetime, until: datetime) -> bool:
        """Extend the lease of a slot held at ``now``; ``False`` when it is not (its
        session ended, or its lease did and the slot went to another)."""
        raise self._no_shaping()

    def destination_states(self, *, now: datetime) -> builtins.list[DestinationState]:
        """Return the destinations the store keeps a bucket for, by key: sessions,
        window, suspension and items held back, as of ``now``."""
        return []

    def forget_idle_destinations(self, *, before: datetime, now: datetime) -> int:
        """Drop the buckets no session used since ``before`` and that hold nothing back at
        ``now`` (no suspension, no held items); return how many. A bucket dropped is full
        again, which is what an idle one is anyway."""
        return 0

    def _no_shaping(self) -> QueueError:
        return QueueError(
            ErrorCode.INVALID_OPTION,
            f"{type(self).__name__} keeps no shaping state: BUMAIL_QUEUE['SHAPING'] needs a store that supports it.",
        )

    def listener(self) -> WorkListener | None:
        """Return a way to sleep until new work is announced, or ``None`` to poll."""
        return None

    def check(self, **kwargs: Any) -> Iterable[CheckMessage]:
        """Return the system check messages about this store's set-up."""
        return []

    # Helpers every store uses to hold the text promises, and compare domains, the same way.

    @staticmethod
    def validate_new(item: NewItem) -> None:
        """Refuse an item holding text no store can keep (``INVALID``)."""
        require_keepable(item.id, "item id")
        require_keepable(item.sender, "sender")
        for address in item.recipients:
            require_keepable(address, "recipient")
        if item.key is not None:
            require_keepable(item.key, "idempotency key")
        if not item.recipients:
            raise QueueError(ErrorCode.INVALID, "An item needs at least one recipient.")
        check_priority(item.priority, "An item's priority")
        check_channel(item.channel, "An item's channel")

    @staticmethod
    def validate_owner(owner: str) -> str:
        """Refuse an empty owner, or one holding text no store can keep (``INVALID``)."""
        if not owner:
            raise QueueError(ErrorCode.INVALID, "A lease owner must be a non-empty name.")
        return require_keepable(owner, "lease owner")

    @staticmethod
    def validate_result(result: AttemptResult) -> None:
        """Refuse outcomes holding text no store can keep (``INVALID``)."""
        for address, outcome in result.outcomes.items():
            require_keepable(address, "recipient")
            require_keepable(outcome.reply.text, "reply text")
            require_keepable(outcome.reply.status, "reply status")

    @staticmethod
    def validate_sts_policy(policy: STSPolicy) -> None:
        """Refuse a policy holding text no store can keep (``INVALID``)."""
        for text in (policy.domain, policy.id, *policy.mx):
            require_keepable(text, "MTA-STS policy")

    @staticmethod
    def validate_sts_failure(failure: STSFailure) -> None:
        """Refuse a failure holding text no store can keep (``INVALID``)."""
        for text in (failure.domain, failure.policy_id, failure.reason):
            require_keepable(text, "MTA-STS fetch failure")

    @staticmethod
    def validate_tls_counts(counts: Sequence[TLSSessionCount]) -> None:
        """Refuse counts holding text no store can keep (``INVALID``)."""
        for count in counts:
            for text in (count.domain, count.policy_id, *count.policy, count.mx_host, count.address, count.reason):
                require_keepable(text, "TLS report count")

    @staticmethod
    def lease_lost(item_id: str, owner: str) -> QueueError:
        """The error ``complete`` raises when ``owner`` no longer holds the lease."""
        return QueueError(
            ErrorCode.LEASE_LOST,
            f"The lease on item {item_id} is no longer held by {owner!r}; nothing was recorded.",
            item_id=item_id,
        )

    @staticmethod
    def is_known_id(item_id: str) -> bool:
        """Return whether ``item_id`` could be an item's: ids holding a NUL are none."""
        return isinstance(item_id, str) and bool(item_id) and is_keepable(item_id)

    @staticmethod
    def is_waiting(item: QueueItem, now: datetime) -> bool:
        """Return whether ``item`` waits for a later attempt at ``now``: not due yet, no
        lease on it, not held."""
        return now < item.next_attempt_at < HELD_AT and not item.is_leased_at(now)

    @staticmethod
    def has_deferred_recipient(item: QueueItem, domain: str | None = None) -> bool:
        """Return whether ``item`` has a deferred recipient, at ``domain`` if one is given.

        ``domain`` is in ``conf.normalise_domain``'s form, and each recipient's domain is
        compared in it: ``ann@Bücher.example`` is at ``xn--bcher-kva.example``.
        """
        return any(
            recipient.status == RecipientStatus.DEFERRED
            and (domain is None or normalise_domain(domain_of(recipient.address)) == domain)
            for recipient in item.recipients
        )

    @staticmethod
    def domain_spellings(domain: str) -> tuple[str, ...]:
        """Return how a recipient's domain is written, lowercase, when it is ``domain`` (in
        ``conf.normalise_domain``'s form): as it is, and in U-labels for an IDN.

        For a store that matches the domain in its own query, lowercasing ASCII only. It
        must still compare every other non-ASCII domain with ``normalise_domain``:
        ``BÜCHER.example``, or a mix of A-labels and U-labels, is the same domain too.
        """
        try:
            unicode = u_labels(domain)
        except UnicodeError:
            return (domain,)
        return tuple(dict.fromkeys((domain, unicode)))
