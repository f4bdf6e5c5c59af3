"""A store in this process's memory: for tests of code above the store, never durable."""

from __future__ import annotations

import builtins
import dataclasses
import itertools
import threading
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any

from bumail_queue.conf import QueueSettings
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import AttemptResult, NewItem, QueueItem, fair_order
from bumail_queue.queries import (
    HELD_AT,
    SEARCH_HEAD_BYTES,
    BulkPage,
    ChannelGauges,
    HoldResult,
    ItemQuery,
    QueueGauges,
    channel_gauges_of,
    gauges_of,
    headers_contain,
    is_held,
    lane_order,
)
from bumail_queue.shaping import Bucket, DestinationState, Permit, PermitRequest, WindowChange, seconds
from bumail_queue.sts import STSFailure, STSPolicy, TLSSessionCount
from bumail_queue.suppression import (
    DISPROVED_BY_DELIVERY,
    GLOBAL_SCOPE,
    Suppression,
    SuppressionChange,
    SuppressionReason,
    SuppressionUpdate,
    address_holds,
    lookup_keys,
    search_form,
)

from .base import MESSAGE_HEAD_BYTES, QueueStore


@dataclasses.dataclass(kw_only=True, slots=True)
class _Entry:
    seq: int
    item: QueueItem
    message: bytes | None


class MemoryStore(QueueStore):
    """Keeps the queue in a dict behind one lock; ``QueueItem`` is frozen, so nothing leaks."""

    durable = False
    claims_by_id = True
    supports_shaping = True

    def __init__(self, settings: QueueSettings) -> None:
        super().__init__(settings)
        self._lock = threading.Lock()
        self._buckets: dict[str, Bucket] = {}
        self._entries: dict[str, _Entry] = {}
        self._id_by_key: dict[str, str] = {}
        self._seq = itertools.count(1)
        self._last_channel = ""  # where the channels' round-robin stands
        self._sts_policies: dict[str, STSPolicy] = {}
        self._sts_failures: dict[str, STSFailure] = {}
        self._tls_counts: dict[tuple[Any, ...], TLSSessionCount] = {}
        # The suppression list by normal address and scope, and the notes of a first expiry (until when).
        self._suppressed: dict[tuple[str, str], Suppression] = {}
        self._expiry_notes: dict[str, datetime] = {}

    @staticmethod
    def _copy(item: QueueItem) -> QueueItem:
        # The dataclass is frozen, but its recipients list is not: hand out a copy.
        return dataclasses.replace(item, recipients=list(item.recipients))

    def _ordered(self) -> builtins.list[_Entry]:
        return sorted(self._entries.values(), key=lambda e: (e.item.next_attempt_at, e.seq))

    def add_many(self, items: Sequence[NewItem], *, max_items: int | None = None) -> builtins.list[QueueItem]:
        for new in items:
            self.validate_new(new)
        with self._lock:
            fresh_keys = {new.key for new in items if new.key is not None and new.key not in self._id_by_key}
            fresh = sum(1 for new in items if new.key is None) + len(fresh_keys)
            if max_items is not None and len(self._entries) + fresh > max_items:
                raise QueueError(
                    ErrorCode.FULL,
                    f"The queue is full: it holds {len(self._entries)} items and MAX_ITEMS is {max_items}.",
                )
            added = []
            for new in items:
                if new.key is not None and new.key in self._id_by_key:
                    added.append(self._copy(self._entries[self._id_by_key[new.key]].item))
                    continue
                item = new.to_queue_item()
                self._entries[new.id] = _Entry(seq=next(self._seq), item=item, message=bytes(new.message))
                if new.key is not None:
                    self._id_by_key[new.key] = new.id
                added.append(self._copy(item))
            return added

    def _drop(self, item_id: str) -> _Entry | None:
        entry = self._entries.pop(item_id, None)
        if entry is not None and entry.item.key is not None:
            del self._id_by_key[entry.item.key]
        return entry

    def get(self, item_id: str) -> QueueItem | None:
        with self._lock:
            entry = self._entries.get(item_id)
            return None if entry is None else self._copy(entry.item)

    def list(self, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        with self._lock:
            return [self._copy(e.item) for e in self._ordered()[offset : offset + limit]]

    def count(self) -> int:
        with self._lock:
            return len(self._entries)

    def gauges(self, *, now: datetime) -> QueueGauges:
        """Every item counted, under the lock: one pass, no copy, no sort."""
        with self._lock:
            return gauges_of((e.item for e in self._entries.values()), now=now)

    def channel_gauges(self, *, now: datetime) -> dict[str, ChannelGauges]:
        """Every item counted, under the lock, as ``gauges``."""
        with self._lock:
            return channel_gauges_of((e.item for e in self._entries.values()), now=now)

    def search(self, query: ItemQuery, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        """Match as ``ItemQuery`` says, and ``text`` in the message's header block too."""
        with self._lock:
            matched = [
                e.item
                for e in self._ordered()
                if query.matches(e.item)
                or (
                    query.text is not None
                    and query.item_id is None
                    and e.message is not None
                    and query.matches(e.item, text=False)
                    and headers_contain(e.message[:SEARCH_HEAD_BYTES], query.text)
                )
            ]
            return [self._copy(item) for item in matched[offset : offset + limit]]

    def lanes(self) -> builtins.list[tuple[str, int]]:
        with self._lock:
            held = {(e.item.channel, e.item.priority) for e in self._entries.values()}
        return sorted(held, key=lambda lane: lane_order(*lane))

    def read_message_heads(self, item_ids: Sequence[str], *, size: int = MESSAGE_HEAD_BYTES) -> dict[str, bytes]:
        with self._lock:
            return {
                item_id: bytes(entry.message[:size])
                for item_id in item_ids
                if (entry := self._entries.get(item_id)) is not None and entry.message is not None
            }

    def read_message(self, item_id: str) -> bytes | None:
        with self._lock:
            entry = self._entries.get(item_id)
            return None if entry is None or entry.message is None else bytes(entry.message)

    def lose_message(self, item_id: str) -> None:
        """Forget an item's message while keeping the item (for tests of that path)."""
        with self._lock:
            self._entries[item_id].message = None

    def claim(self, *, owner: str, now: datetime, lease_until: datetime, limit: int = 1) -> builtins.list[QueueItem]:
        """A pass over every item: the due ones, in ``fair_order``."""
        self.validate_owner(owner)
        with self._lock:
            due = [e for e in self._entries.values() if e.item.next_attempt_at <= now and not e.item.is_leased_at(now)]
            taken = fair_order(
                due,
                limit=limit,
                lane=lambda e: (e.item.channel, e.item.priority),
                place=lambda e: (e.item.next_attempt_at, e.seq),
                after=self._last_channel,
            )
            if taken:
                self._last_channel = taken[-1].item.channel
            claimed: builtins.list[QueueItem] = []
            for entry in taken:
                entry.item = dataclasses.replace(
                    entry.item, lease_owner=owner, lease_expires_at=lease_until, next_attempt_at=lease_until
                )
                claimed.append(self._copy(entry.item))
            return claimed

    def claim_items(
        self, item_ids: Sequence[str], *, owner: str, now: datetime, lease_until: datetime
    ) -> builtins.list[QueueItem]:
        self.validate_owner(owner)
        with self._lock:
            named = [entry for item_id in set(item_ids) if (entry := self._entries.get(item_id)) is not None]
            claimed: builtins.list[QueueItem] = []
            for entry in sorted(named, key=lambda e: e.seq):
                item = entry.item
                if item.next_attempt_at <= now and not item.is_leased_at(now):
                    entry.item = dataclasses.replace(
                        item, lease_owner=owner, lease_expires_at=lease_until, next_attempt_at=lease_until
                    )
                    claimed.append(self._copy(entry.item))
            return claimed

    def _held(self, item_id: str, owner: str) -> _Entry | None:
        entry = self._entries.get(item_id) if self.is_known_id(item_id) else None
        return entry if entry is not None and entry.item.lease_owner == owner else None

    def renew(self, item_id: str, *, owner: str, lease_until: datetime) -> bool:
        self.validate_owner(owner)
        with self._lock:
            entry = self._held(item_id, owner)
            if entry is None:
                return False
            entry.item = dataclasses.replace(entry.item, lease_expires_at=lease_until, next_attempt_at=lease_until)
            return True

    def complete(self, item_id: str, *, owner: str, result: AttemptResult) -> QueueItem | None:
        self.validate_owner(owner)
        self.validate_result(result)
        with self._lock:
            entry = self._entries.get(item_id) if self.is_known_id(item_id) else None
            if entry is None:
                return None
            if entry.item.lease_owner != owner:
                raise self.lease_lost(item_id, owner)
            entry.item = result.recorded_on(entry.item)
            if entry.item.is_finished:
                self._drop(item_id)
            return self._copy(entry.item)

    def reschedule(self, item_id: str, *, at: datetime, owner: str | None = None) -> bool:
        if owner is not None:
            self.validate_owner(owner)
        with self._lock:
            entry = self._entries.get(item_id) if self.is_known_id(item_id) else None
            if entry is None:
                return False
            if owner is None:
                entry.item = dataclasses.replace(entry.item, next_attempt_at=at)
                return True
            if entry.item.lease_owner != owner:
                return False
            entry.item = dataclasses.replace(entry.item, next_attempt_at=at, lease_owner=None, lease_expires_at=None)
            return True

    def retry_deferred(self, *, now: datetime, domain: str | None = None) -> int:
        """One pass under the lock; ``retry_items`` is the default's, a get and a move each."""
        with self._lock:
            moved = 0
            for entry in self._entries.values():
                if self.is_waiting(entry.item, now) and self.has_deferred_recipient(entry.item, domain):
                    entry.item = dataclasses.replace(entry.item, next_attempt_at=now)
                    moved += 1
            return moved

    def bulk_page(self, query: ItemQuery, *, cursor: str | None = None, limit: int = 1000) -> BulkPage:
        """By ``seq``, the order items were added in, which no write changes."""
        after = 0 if cursor is None else int(cursor)
        with self._lock:
            entries = sorted((e for e in self._entries.values() if e.seq > after), key=lambda e: e.seq)
            page = entries[:limit]
            found = tuple(self._copy(e.item) for e in page if query.matches(e.item))
            return BulkPage(items=found, cursor=str(page[-1].seq) if len(entries) > limit else None)

    def hold(self, item_ids: Sequence[str], *, now: datetime) -> HoldResult:
        """The batch under the lock."""
        changed, leased, unchanged = [], [], []
        with self._lock:
            for item_id in dict.fromkeys(item_ids):
                entry = self._entries.get(item_id) if self.is_known_id(item_id) else None
                if entry is not None and entry.item.is_leased_at(now):
                    leased.append(item_id)
                elif entry is not None and not is_held(entry.item.next_attempt_at):
                    entry.item = dataclasses.replace(
                        entry.item, next_attempt_at=HELD_AT, lease_owner=None, lease_expires_at=None
                    )
                    changed.append(item_id)
                else:
                    unchanged.append(item_id)
        return HoldResult(changed=tuple(changed), leased=tuple(leased), unchanged=tuple(unchanged))

    def release(self, item_ids: Sequence[str], *, now: datetime) -> HoldResult:
        """The batch under the lock."""
        changed, unchanged = [], []
        with self._lock:
            for item_id in dict.fromkeys(item_ids):
                entry = self._entries.get(item_id) if self.is_known_id(item_id) else None
                if entry is not None and is_held(entry.item.next_attempt_at):
                    entry.item = dataclasses.replace(entry.item, next_attempt_at=now)
                    changed.append(item_id)
                else:
                    unchanged.append(item_id)
        return HoldResult(changed=tuple(changed), unchanged=tuple(unchanged))

    def cancel(self, item_id: str) -> QueueItem | None:
        with self._lock:
            entry = self._drop(item_id) if self.is_known_id(item_id) else None
            return None if entry is None else self._copy(entry.item)

    def get_sts_policy(self, domain: str) -> STSPolicy | None:
        with self._lock:
            return self._sts_policies.get(domain)

    def put_sts_policy(self, policy: STSPolicy) -> None:
        self.validate_sts_policy(policy)
        with self._lock:
            self._sts_policies[policy.domain] = policy

    def get_sts_failure(self, domain: str, policy_id: str, *, now: datetime) -> STSFailure | None:
        with self._lock:
            failure = self._sts_failures.get(domain)
        if failure is None or failure.policy_id != policy_id or failure.until <= now:
            return None
        return failure

    def put_sts_failure(self, failure: STSFailure) -> None:
        self.validate_sts_failure(failure)
        with self._lock:
            self._sts_failures[failure.domain] = failure

    def purge_sts(self, *, now: datetime) -> int:
        with self._lock:
            policies = [d for d, p in self._sts_policies.items() if p.expires_at <= now]
            failures = [d for d, f in self._sts_failures.items() if f.until <= now]
            for domain in policies:
                del self._sts_policies[domain]
            for domain in failures:
                del self._sts_failures[domain]
        return len(policies) + len(failures)

    def count_tls_sessions(self, counts: Sequence[TLSSessionCount]) -> None:
        self.validate_tls_counts(counts)
        with self._lock:
            for count in counts:
                known = self._tls_counts.get(count.kind)
                self._tls_counts[count.kind] = (
                    count if known is None else dataclasses.replace(known, count=known.count + count.count)
                )

    def tls_session_counts(self, day: date) -> builtins.list[TLSSessionCount]:
        with self._lock:
            return [count for count in self._tls_counts.values() if count.day == day]

    def purge_tls_session_counts(self, *, before: date) -> int:
        with self._lock:
            old = [kind for kind, count in self._tls_counts.items() if count.day < before]
            for kind in old:
                del self._tls_counts[kind]
            return len(old)

    # -- the suppression list ---------------------------------------------------------

    def suppression_entries(
        self, addresses: Iterable[str], *, now: datetime, scopes: Sequence[str] | None = None
    ) -> dict[str, builtins.list[Suppression]]:
        with self._lock:
            found: dict[str, builtins.list[Suppression]] = {}
            for key, given in lookup_keys(addresses).items():
                if scopes is None:
                    kept = [entry for (at, _), entry in self._suppressed.items() if at == key]
                else:
                    kept = [entry for scope in scopes if (entry := self._suppressed.get((key, scope))) is not None]
                for entry in kept:
                    if entry.is_in_force(now):
                        for address in given:
                            found.setdefault(address, []).append(entry)
            return found

    def update_suppressions(self, change: SuppressionChange, *, now: datetime) -> SuppressionUpdate:
        self.validate_suppressions(change)
        with self._lock:
            written = list(change.add)
            for entry in change.expired:
                current = self._suppressed.get((entry.address, GLOBAL_SCOPE))
                if current is not None and current.is_in_force(now):
                    continue  # suppressed already: the expiry changes nothing
                noted = self._expiry_notes.pop(entry.address, None)
                if noted is not None and noted > now:
                    written.append(entry)
                elif change.note_until is not None:
                    self._expiry_notes[entry.address] = change.note_until
            for entry in written:
                self._suppressed[(entry.address, entry.scope)] = entry
                if entry.scope == GLOBAL_SCOPE:
                    self._expiry_notes.pop(entry.address, None)
            removed = []
            for address in change.clear:
                self._expiry_notes.pop(address, None)
                found = self._suppressed.get((address, GLOBAL_SCOPE))
                if found is not None and found.reason in DISPROVED_BY_DELIVERY:
                    del self._suppressed[(address, GLOBAL_SCOPE)]
                    if found.is_in_force(now):
                        removed.append(address)
            for address, scope in change.clear_scoped:
                if scope == GLOBAL_SCOPE:
                    self._expiry_notes.pop(address, None)
                dropped = self._suppressed.pop((address, scope), None)
                if dropped is not None and dropped.is_in_force(now):
                    removed.append(address)
            return SuppressionUpdate(suppressed=tuple(written), removed=tuple(removed))

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
        wanted = None if text is None else search_form(text)
        with self._lock:
            matched = [
                entry
                for entry in self._suppressed.values()
                if entry.is_in_force(now)
                and (wanted is None or address_holds(entry.address, wanted))
                and (scope is None or entry.scope == scope)
                and (reason is None or entry.reason == reason)
            ]
        matched.sort(key=lambda entry: (entry.created_at, entry.address, entry.scope), reverse=True)
        return matched[offset : offset + limit]

    def count_suppressions(self, *, now: datetime) -> int:
        with self._lock:
            return sum(1 for entry in self._suppressed.values() if entry.is_in_force(now))

    def purge_suppressions(self, *, now: datetime) -> int:
        with self._lock:
            gone = [key for key, entry in self._suppressed.items() if not entry.is_in_force(now)]
            for key in gone:
                del self._suppressed[key]
            for address in [a for a, until in self._expiry_notes.items() if until <= now]:
                del self._expiry_notes[address]
            return len(gone)

    # -- shaping: the buckets' arithmetic as ``shaping.Bucket`` does it, under the lock --

    def take_permit(self, request: PermitRequest) -> Permit:
        with self._lock:
            return self._buckets.setdefault(request.key, Bucket()).take(request)

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
        with self._lock:
            bucket = self._buckets.setdefault(key, Bucket())
            bucket.release(slot=slot, now=now, change=change, concurrency=concurrency, suspend_until=suspend_until)

    def renew_permit(self, key: str, *, slot: str, now: datetime, until: datetime) -> bool:
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None or bucket.slots.get(slot, 0.0) <= seconds(now):
                return False
            bucket.slots[slot] = seconds(until)
            return True

    def destination_states(self, *, now: datetime) -> builtins.list[DestinationState]:
        with self._lock:
            return [self._buckets[key].state(key, now) for key in sorted(self._buckets)]

    def forget_idle_destinations(self, *, before: datetime, now: datetime) -> int:
        with self._lock:
            idle = [key for key, b in self._buckets.items() if b.is_idle(seconds(before), seconds(now))]
            for key in idle:
                del self._buckets[key]
            return len(idle)
