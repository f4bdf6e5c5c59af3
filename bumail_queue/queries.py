"""What an operator asks of the queue: a filtered listing, a summary of its shape, a retry.

The admin and ``manage.py queue_status`` ask every store the same questions through
``QueueStore.search`` and ``QueueStore.summary`` (``queue_retry``, through
``retry_deferred`` and ``retry_items``; the metrics, through ``QueueStore.gauges``);
the values here are what they exchange. The
functions are the plain-Python answers, which a store without a faster way (the
memory store, a store of your own) uses as they are.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from .addresses import domain_of
from .items import QueueItem, RecipientStatus

#: How much of each message a text search reads for its header block, in every store.
SEARCH_HEAD_BYTES = 8192

#: The age buckets of the queue's shape, as Postfix's ``qshape`` draws them: an item
#: younger than the first bound is in the first bucket, one older than the last in
#: the last ("1280+ minutes").
AGE_BUCKETS: tuple[timedelta, ...] = tuple(timedelta(minutes=m) for m in (5, 10, 20, 40, 80, 160, 320, 640, 1280))

#: A held item's ``next_attempt_at``: out of every claim's reach, so that a claim's
#: index scan never meets a held row, and back to the time of its release after. Any
#: ``next_attempt_at`` at or past it is a hold (a store's times stop before it).
HELD_AT = datetime(9000, 1, 1, tzinfo=UTC)


class ItemState(enum.StrEnum):
    """Where an item stands as a whole, at a given time."""

    QUEUED = "queued"
    """Not tried yet: waiting for its first attempt (due now, or scheduled for later)."""
    DEFERRED = "deferred"
    """Tried at least once; waiting for its next attempt."""
    DELIVERING = "delivering"
    """A worker holds its lease: an attempt is under way."""
    HELD = "held"
    """An operator held it (``queue_hold``): never claimed until released."""

    @property
    def label(self) -> str:
        return {"queued": "Queued", "deferred": "Deferred", "delivering": "Being delivered", "held": "Held"}[self.value]


def is_held(next_attempt_at: datetime) -> bool:
    """Return whether an item due at ``next_attempt_at`` is held (``HELD_AT``)."""
    return next_attempt_at >= HELD_AT


def state_of(item: QueueItem, now: datetime) -> ItemState:
    """Return the state of ``item`` at ``now``."""
    if item.is_leased_at(now):
        return ItemState.DELIVERING
    if is_held(item.next_attempt_at):
        return ItemState.HELD
    return ItemState.DEFERRED if item.attempts > 0 else ItemState.QUEUED


def address_pattern(pattern: str) -> re.Pattern[str]:
    """Return the regular expression of an address pattern: ``*`` stands for any text
    (``*@example.com``, ``ann*``), the rest is literal, the whole address is matched,
    and case is ignored."""
    literal = (re.escape(part) for part in pattern.strip().split("*"))
    return re.compile(".*".join(literal), re.IGNORECASE | re.DOTALL)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ItemQuery:
    """What to list: every field left ``None`` matches every item.

    ``text`` matches an item whose sender or one of whose recipients' addresses
    contains ``text``, ignoring case; a ``text`` that is an item id (a UUID) matches
    that item only, so that a store can find it by its key. A store may match more:
    the ORM and memory stores also look in the message's header block (its subject,
    its ``Message-ID``). ``domain`` matches an item with a recipient at that domain
    (exactly, ignoring case). ``channel`` and ``priority`` match exactly. ``state``
    is judged at ``now``.

    The bulk actions' filters (``operations.bulk``): ``sender`` and ``recipient`` are
    address patterns (``address_pattern``: ``*`` for any text, the whole address
    matched, case ignored), ``recipient`` matching an item with one recipient that
    matches; ``older_than`` matches an item created before ``now - older_than``.
    """

    now: datetime
    state: ItemState | None = None
    domain: str | None = None
    text: str | None = None
    channel: str | None = None
    priority: int | None = None
    sender: str | None = None
    recipient: str | None = None
    older_than: timedelta | None = None

    def __post_init__(self) -> None:
        # Blank input is no filter; a domain is compared without case or trailing dot.
        text = (self.text or "").strip() or None
        domain = domain_of("@" + self.domain.strip()) if self.domain and self.domain.strip() else None
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "domain", domain or None)
        object.__setattr__(self, "sender", (self.sender or "").strip() or None)
        object.__setattr__(self, "recipient", (self.recipient or "").strip() or None)

    @property
    def created_before(self) -> datetime | None:
        """Return the time ``older_than`` puts items' creation before, or ``None``."""
        return None if self.older_than is None else self.now - self.older_than

    def matches_addresses(self, item: QueueItem) -> bool:
        """Return whether ``item`` matches ``sender``, ``recipient`` and ``older_than``."""
        if self.older_than is not None and not item.created_at < self.now - self.older_than:
            return False
        if self.sender is not None and not address_pattern(self.sender).fullmatch(item.sender):
            return False
        if self.recipient is not None:
            pattern = address_pattern(self.recipient)
            if not any(pattern.fullmatch(r.address) for r in item.recipients):
                return False
        return True

    def matches(self, item: QueueItem, *, text: bool = True) -> bool:
        """Return whether ``item`` matches on the fields every store must look at.

        With ``text=False``, ``text`` is left out: for a store that looks for it
        elsewhere too (in the message's headers).
        """
        if self.state is not None and state_of(item, self.now) != self.state:
            return False
        if self.domain is not None and not any(domain_of(r.address) == self.domain for r in item.recipients):
            return False
        if self.channel is not None and item.channel != self.channel:
            return False
        if self.priority is not None and item.priority != self.priority:
            return False
        if not self.matches_addresses(item):
            return False
        if self.item_id is not None:
            return item.id == self.item_id
        if text and self.text is not None:
            needle = self.text.casefold()
            if needle not in item.sender.casefold() and not any(
                needle in r.address.casefold() for r in item.recipients
            ):
                return False
        return True

    @property
    def item_id(self) -> str | None:
        """Return the item id ``text`` is, in its canonical form, or ``None``."""
        if self.text is None:
            return None
        try:
            return str(uuid.UUID(self.text))
        except ValueError:
            return None


class ItemCount(int):
    """A count of items that says whether it is exact or a store's estimate.

    It is an ``int`` wherever one is expected, and prints as one: ``str()``, a template
    and an f-string show the number; only ``repr()`` names the class. ``exact`` is what
    the admin reads to say "about" before an estimate, and only before one.
    """

    exact: bool

    def __new__(cls, value: int, *, exact: bool) -> ItemCount:
        count = super().__new__(cls, value)
        count.exact = exact
        return count

    def __repr__(self) -> str:
        return f"ItemCount({int(self)}, exact={self.exact})"

    # int has no __str__ of its own: without this one, str() (and so a template or an
    # f-string, which format through it) would print the repr above.
    def __str__(self) -> str:
        return int.__repr__(self)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BulkPage:
    """A page of the items a filter matches (``QueueStore.bulk_page``), and where the
    next page starts: ``None`` when none is left."""

    items: tuple[QueueItem, ...]
    cursor: str | None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HoldResult:
    """What a hold or a release of a batch did (``QueueStore.hold``, ``release``): the
    ids of the items it changed, and of those it left: to the lease that holds them,
    or, for a hold already held and for a release not held, or gone."""

    changed: tuple[str, ...] = ()
    leased: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RetryResult:
    """What a retry did (``queue.retry_deferred``, ``QueueStore.retry_items``): how many
    items it made due now, and which of the ids it was given it left to the lease
    that holds them, or found no item for, as they were given."""

    due: int
    leased: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


def is_estimate(count: int) -> bool:
    """Return whether ``count`` is an estimate: a plain ``int`` is taken as exact."""
    return isinstance(count, ItemCount) and not count.exact


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DomainShape:
    """The pending recipients of one destination domain, by age bucket (``AGE_BUCKETS``)."""

    domain: str
    buckets: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.buckets)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LaneCount:
    """The items of one lane (a channel's items of one priority): all, and those due."""

    channel: str
    priority: int
    total: int
    due: int


def lane_order(channel: str, priority: int) -> tuple[str, int]:
    """The order lanes are listed in: by channel, the higher priority first."""
    return (channel, -priority)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class QueueSummary:
    """Counts by state, the oldest item, and the queue's shape at ``now``.

    ``shape`` has one entry per destination domain with a recipient not final yet
    (pending or deferred), the most such recipients first; each counts them by the
    age of their item, in the buckets ``age_buckets`` bound (one more bucket than
    bounds: the last holds everything older than the last bound). ``lanes`` counts
    the items of each lane that holds one, in ``lane_order``; ``due`` there counts
    those due and not being delivered, as ``due`` does for the whole queue.
    """

    now: datetime
    total: int
    by_state: Mapping[ItemState, int]
    oldest_created_at: datetime | None
    due: int
    pending_recipients: int
    age_buckets: tuple[timedelta, ...]
    shape: tuple[DomainShape, ...]
    lanes: tuple[LaneCount, ...] = ()

    @property
    def bucket_totals(self) -> tuple[int, ...]:
        """Return the pending recipients of every domain, by age bucket."""
        return tuple(sum(d.buckets[i] for d in self.shape) for i in range(len(self.age_buckets) + 1))

    def to_dict(self, *, top: int | None = None) -> dict[str, Any]:
        """Return the summary as JSON-ready values (``queue_status --json``)."""
        shape = self.shape if top is None else self.shape[:top]
        return {
            "now": self.now.isoformat(),
            "total": self.total,
            "by_state": {state.value: self.by_state.get(state, 0) for state in ItemState},
            "due": self.due,
            "oldest_created_at": None if self.oldest_created_at is None else self.oldest_created_at.isoformat(),
            "pending_recipients": self.pending_recipients,
            "age_buckets": bucket_labels(self.age_buckets),
            "bucket_totals": list(self.bucket_totals),
            "domains": [{"domain": d.domain, "total": d.total, "buckets": list(d.buckets)} for d in shape],
            "domains_left_out": len(self.shape) - len(shape),
            "lanes": [
                {"channel": lane.channel, "priority": lane.priority, "total": lane.total, "due": lane.due}
                for lane in self.lanes
            ],
        }


def bucket_index(age: timedelta, bounds: Sequence[timedelta]) -> int:
    """Return the bucket of an item of age ``age``: the first bound it is younger than."""
    for index, bound in enumerate(bounds):
        if age < bound:
            return index
    return len(bounds)


def bucket_labels(bounds: Sequence[timedelta]) -> list[str]:
    """Return a label per bucket, in minutes: ``"<5m"``, ``"5-10m"``, ..., ``"1280m+"``."""
    if not bounds:
        return ["all"]
    minutes = [_minutes(b) for b in bounds]
    return [f"<{minutes[0]}m", *(f"{low}-{high}m" for low, high in itertools.pairwise(minutes)), f"{minutes[-1]}m+"]


def _minutes(span: timedelta) -> str:
    value = span.total_seconds() / 60
    return f"{value:g}"


def shape_from_counts(counts: Mapping[tuple[str, int], int], buckets: int) -> tuple[DomainShape, ...]:
    """Return the shape from pending recipients counted by (domain, bucket index)."""
    by_domain: dict[str, list[int]] = {}
    for (domain, index), count in counts.items():
        row = by_domain.setdefault(domain_of("@" + (domain or "")), [0] * buckets)
        row[min(index, buckets - 1)] += count
    shapes = [DomainShape(domain=domain, buckets=tuple(row)) for domain, row in by_domain.items()]
    shapes.sort(key=lambda d: (-d.total, d.domain))
    return tuple(shapes)


def summarize(
    items: Iterable[QueueItem], *, now: datetime, age_buckets: Sequence[timedelta] = AGE_BUCKETS
) -> QueueSummary:
    """Return the summary of ``items`` (the whole queue) at ``now``, in plain Python."""
    bounds = tuple(age_buckets)
    by_state = dict.fromkeys(ItemState, 0)
    counts: dict[tuple[str, int], int] = {}
    lanes: dict[tuple[str, int], list[int]] = {}
    total = due = pending = 0
    oldest: datetime | None = None
    for item in items:
        total += 1
        state = state_of(item, now)
        by_state[state] += 1
        lane = lanes.setdefault((item.channel, item.priority), [0, 0])
        lane[0] += 1
        if state != ItemState.DELIVERING and item.next_attempt_at <= now:
            due += 1
            lane[1] += 1
        if oldest is None or item.created_at < oldest:
            oldest = item.created_at
        index = bucket_index(now - item.created_at, bounds)
        for recipient in item.pending_recipients:
            pending += 1
            key = (domain_of(recipient.address), index)
            counts[key] = counts.get(key, 0) + 1
    return QueueSummary(
        now=now,
        total=total,
        by_state=by_state,
        oldest_created_at=oldest,
        due=due,
        pending_recipients=pending,
        age_buckets=bounds,
        shape=shape_from_counts(counts, len(bounds) + 1),
        lanes=lane_counts((channel, priority, n, d) for (channel, priority), (n, d) in lanes.items()),
    )


def lane_counts(rows: Iterable[tuple[str, int, int, int]]) -> tuple[LaneCount, ...]:
    """Return the ``LaneCount`` of each ``(channel, priority, total, due)``, in ``lane_order``."""
    counted = [LaneCount(channel=c, priority=p, total=n, due=d) for c, p, n, d in rows]
    counted.sort(key=lambda lane: lane_order(lane.channel, lane.priority))
    return tuple(counted)


#: The recipients ``QueueGauges`` counts: those not final yet.
GAUGED_RECIPIENTS: tuple[RecipientStatus, ...] = (RecipientStatus.PENDING, RecipientStatus.DEFERRED)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class QueueGauges:
    """What the queue holds at ``now``, as a monitor reads it at every scrape.

    ``items`` counts the items in each state (``delivering``: a lease holds them);
    ``recipients`` the recipients not final yet, pending (never tried) or deferred;
    ``oldest`` is the ``created_at`` of the oldest item in each state (``None``: no
    item in it); ``due`` counts the items due at ``now`` that no lease holds, and
    ``first_due_at`` is the ``next_attempt_at`` of the one due the longest.

    ``exact`` is false when the counts are estimates from a sample of a large queue
    (``QueueStore.gauges`` says which stores sample); an oldest time read from a
    sample may then be younger than the oldest item of its state.
    """

    now: datetime
    items: Mapping[ItemState, int]
    recipients: Mapping[RecipientStatus, int]
    oldest: Mapping[ItemState, datetime | None]
    due: int
    first_due_at: datetime | None
    exact: bool = True

    @property
    def total(self) -> int:
        """Return how many items the queue holds (an estimate unless ``exact``)."""
        return sum(self.items.values())


class GaugeTally:
    """Counts items into ``QueueGauges`` one by one: the plain-Python answer, for a
    whole queue (``exact``) or a sample of one (``scale`` is then the inverse of the
    share of items sampled)."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.items = dict.fromkeys(ItemState, 0)
        self.recipients = dict.fromkeys(GAUGED_RECIPIENTS, 0)
        self.oldest: dict[ItemState, datetime | None] = dict.fromkeys(ItemState)
        self.due = 0
        self.first_due_at: datetime | None = None

    def add(self, item: QueueItem) -> None:
        """Count ``item``."""
        self.count(
            state=state_of(item, self.now),
            created_at=item.created_at,
            next_attempt_at=item.next_attempt_at,
            statuses=(recipient.status for recipient in item.recipients),
        )

    def count(
        self, *, state: ItemState, created_at: datetime, next_attempt_at: datetime, statuses: Iterable[str]
    ) -> None:
        """Count an item from its parts, for a store that reads only those."""
        if state != ItemState.DELIVERING and is_held(next_attempt_at):
            state = ItemState.HELD
        self.items[state] += 1
        oldest = self.oldest[state]
        if oldest is None or created_at < oldest:
            self.oldest[state] = created_at
        for status in statuses:
            if status in self.recipients:
                self.recipients[RecipientStatus(status)] += 1
        if state != ItemState.DELIVERING and next_attempt_at <= self.now:
            self.due += 1
            if self.first_due_at is None or next_attempt_at < self.first_due_at:
                self.first_due_at = next_attempt_at

    def gauges(self, *, scale: float | None = None) -> QueueGauges:
        """Return what was counted; with a ``scale``, what was counted was a sample, and
        the counts are estimates of the whole queue (each multiplied by it, rounded)."""
        return QueueGauges(
            now=self.now,
            items={state: scaled(n, scale) for state, n in self.items.items()},
            recipients={status: scaled(n, scale) for status, n in self.recipients.items()},
            oldest=dict(self.oldest),
            due=scaled(self.due, scale),
            first_due_at=self.first_due_at,
            exact=scale is None,
        )


def gauges_of(items: Iterable[QueueItem], *, now: datetime) -> QueueGauges:
    """Return the gauges of ``items`` (the whole queue) at ``now``, in plain Python."""
    tally = GaugeTally(now)
    for item in items:
        tally.add(item)
    return tally.gauges()


def scaled(count: int, scale: float | None) -> int:
    """Return ``count`` of a sample as an estimate of the whole: ``count * scale``,
    rounded; ``count`` itself when nothing was sampled (``scale`` is ``None``)."""
    return count if scale is None else round(count * scale)


def header_block(head: bytes) -> bytes:
    """Return the header block at the start of a message (up to its first empty line)."""
    ends = [i for i in (head.find(b"\r\n\r\n"), head.find(b"\n\n")) if i >= 0]
    return head[: min(ends)] if ends else head


def headers_contain(head: bytes, text: str) -> bool:
    """Return whether the header block of ``head`` contains ``text``, ignoring case.

    The block is read as it is written: an RFC 2047 encoded word is matched by its
    encoded form, so a plain ASCII subject is found by any of its words.
    """
    return text.casefold() in header_block(head).decode("utf-8", "replace").casefold()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ChannelGauges:
    """One channel's items at a time, as ``QueueStore.channel_gauges`` reads them:
    ``items`` counts them in each state, ``oldest`` is the ``created_at`` of the oldest
    in each state (``None``: no item in it). ``exact`` as ``QueueGauges`` says."""

    items: Mapping[ItemState, int]
    oldest: Mapping[ItemState, datetime | None]
    exact: bool = True

    @property
    def total(self) -> int:
        """Return how many items the channel holds (an estimate unless ``exact``)."""
        return sum(self.items.values())


def channel_gauges_of(items: Iterable[QueueItem], *, now: datetime) -> dict[str, ChannelGauges]:
    """Return the gauges of each channel of ``items`` (the whole queue) at ``now``, in
    plain Python; a channel with no item is left out."""
    tallies: dict[str, GaugeTally] = {}
    for item in items:
        tally = tallies.get(item.channel)
        if tally is None:
            tally = tallies[item.channel] = GaugeTally(now)
        tally.add(item)
    return {channel: channel_gauges_from(tally) for channel, tally in tallies.items()}


def channel_gauges_from(tally: GaugeTally, *, scale: float | None = None) -> ChannelGauges:
    """Return what ``tally`` counted of one channel; with a ``scale``, from a sample."""
    gauges = tally.gauges(scale=scale)
    return ChannelGauges(items=gauges.items, oldest=gauges.oldest, exact=gauges.exact)
