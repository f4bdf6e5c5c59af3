"""Shaping: how many sessions, and how many messages a second, one destination gets.

``SHAPING`` maps a destination pattern to ``Limits``; the limits hold across every
worker because each store keeps one bucket per destination (``QueueStore.take_permit``).
This module holds what does not depend on a store or on SMTP: parsing a rate, matching
a destination to its pattern (``Patterns``), telling a reply that says "slow down"
(``pushback_of``), the values a store takes and returns, and the bucket's arithmetic
(``Bucket``), which the memory store runs as it is and the other stores run in SQL
and Lua, held to the same contract tests.

A bucket has three parts, decided together in one step of the store:

- a token bucket for ``RATE``: it holds one second's worth of tokens (at least one)
  and refills at the rate; each message takes one;
- the slots for ``CONCURRENCY``: each session holds one, under a lease that the
  session's worker renews and that a crashed worker's slot outlives only until it
  ends; ``SLOW_START`` keeps a window below ``CONCURRENCY`` that grows by one per
  successful session and halves on a connection-limit reply;
- a suspension: until then nothing is granted;
- the bins of a ``QUOTA`` (``bumail_queue.quota``): what was sent in the rolling window.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from bumail_queue.items import Reply
from bumail_queue.quota import (
    COUNT_MESSAGES,
    COUNT_RECIPIENTS,
    UNIT_NAMES,
    Quota,
    QuotaAsk,
    fits,
    live_bins,
    room_at,
    window_end,
)

#: The ``SHAPING`` key of the limits every other destination gets, each for itself.
DEFAULT_PATTERN: Final = "*"
#: How long a "slow down" reply suspends its destination unless its pattern says ``SUSPEND``:
#: Postfix's ``minimal_backoff_time``, and what ``UNREACHABLE_HOST_MEMORY`` defaults to.
DEFAULT_SUSPEND: Final = timedelta(minutes=5)
#: The window ``SLOW_START: True`` starts at: Postfix's ``initial_destination_concurrency``.
SLOW_START_INITIAL: Final = 5
#: A destination with no session for this long starts its slow start again (seconds).
SLOW_START_RESET_SECONDS: Final = 600.0

RATE_UNITS: Final[Mapping[str, float]] = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"\s*([0-9]{1,9})\s*/\s*([smh])\s*")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Rate:
    """``RATE``: ``count`` messages each ``period`` seconds."""

    count: int
    period: float

    @property
    def per_second(self) -> float:
        return self.count / self.period

    @property
    def capacity(self) -> float:
        """How many tokens the bucket holds: one second's worth, at least one.

        ``"10/s"`` lets a burst of 10 go at once, then 10 a second; ``"100/h"`` never
        sends two messages closer than 36 s apart, as an hourly limit wants.
        """
        return max(1.0, min(float(self.count), self.per_second))

    def __str__(self) -> str:
        unit = next(u for u, seconds in RATE_UNITS.items() if seconds == self.period)
        return f"{self.count}/{unit}"


def parse_rate(value: object) -> Rate | None:
    """Return the ``Rate`` of ``"N/s"``, ``"N/m"`` or ``"N/h"`` (N at least 1), or ``None``."""
    if not isinstance(value, str):
        return None
    found = _RATE.fullmatch(value)
    if found is None or int(found[1]) < 1:
        return None
    return Rate(count=int(found[1]), period=RATE_UNITS[found[2]])


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """One ``SHAPING`` entry: what its destinations get across all workers."""

    concurrency: int | None = None
    rate: Rate | None = None
    slow_start: int | None = None  # the window a destination starts at; None: no slow start
    suspend: timedelta = DEFAULT_SUSPEND
    quota: Quota | None = None

    @property
    def uses_slots(self) -> bool:
        """Whether a session needs a slot (``CONCURRENCY``, and ``SLOW_START`` under it)."""
        return self.concurrency is not None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """A destination matched to its limits: ``key`` names its bucket in the store.

    ``pattern`` is the ``SHAPING`` key that matched. A domain or an MX suffix is its
    own key, shared by every destination it matches; ``"*"`` gives each destination a
    bucket of its own, keyed by its name.
    """

    key: str
    pattern: str
    limits: Limits


class Patterns:
    """Finds the ``SHAPING`` entry of a destination, the most specific first.

    ``name`` is the recipient domain of an MX route, or the smarthost's host name;
    ``hosts`` are the names of the hosts its mail goes to (the MX hosts, or the
    smarthost). The order: the exact name, then the longest MX suffix that every one
    of the hosts ends with, then ``"*"``; ``None`` when nothing matches.

    Every host, not one: a suffix's bucket is shared by all the domains it matches,
    and a domain whose owner adds one of a provider's hosts to its own MX records must
    not join that provider's bucket, where its own server's "slow down" would
    suspend, and its tarpits hold, every other domain's mail (KumoMTA likewise names
    a site by the whole MX set).
    """

    def __init__(self, shaping: Mapping[str, Limits]) -> None:
        self.exact = {key: limits for key, limits in shaping.items() if not key.startswith(".") and key != "*"}
        self.suffixes = sorted(
            ((key, limits) for key, limits in shaping.items() if key.startswith(".")),
            key=lambda pair: len(pair[0]),
            reverse=True,
        )
        self.default = shaping.get(DEFAULT_PATTERN)
        self._by_suffix = dict(self.suffixes)

    def __bool__(self) -> bool:
        return bool(self.exact or self.suffixes or self.default)

    def limits_of(self, key: str) -> Limits | None:
        """The limits of the bucket ``key``: its pattern's, else ``"*"``'s (a bucket of its own)."""
        return self.exact.get(key) or self._by_suffix.get(key) or self.default

    def match(self, name: str, hosts: Sequence[str] = ()) -> Shape | None:
        name = name.rstrip(".").lower()
        limits = self.exact.get(name)
        if limits is not None:
            return Shape(key=name, pattern=name, limits=limits)
        if self.suffixes and hosts:
            names = [host.rstrip(".").lower() for host in hosts]
            for suffix, limits in self.suffixes:  # the longest first
                if all(host.endswith(suffix) for host in names):
                    return Shape(key=suffix, pattern=suffix, limits=limits)
        if self.default is not None:
            return Shape(key=name, pattern=DEFAULT_PATTERN, limits=self.default)
        return None


class Pushback(enum.Enum):
    """What a reply says about how fast to send."""

    NONE = "none"
    CONNECTIONS = "connections"  # too many sessions at once
    SLOW_DOWN = "slow_down"  # too much mail: come back later


# The words of the big receivers' replies (Gmail, Outlook, Yahoo, iCloud, GMX, Orange,
# QQ, 163), as KumoMTA's shaping rules match them; docs/shaping.md lists them.
CONNECTION_LIMIT_WORDS: Final = re.compile(
    r"too many (?:[\w-]+ ){0,2}(?:connections|sessions)"
    r"|(?:connection|session) (?:count |rate )?limit"
    r"|max(?:imum)? (?:number of )?(?:concurrent |simultaneous )?connections"
    r"|exceed\w* (?:the )?max(?:imum)? (?:number of )?(?:concurrent )?connections"
    r"|trop de connexions",
    re.IGNORECASE,
)
SLOW_DOWN_WORDS: Final = re.compile(
    r"rate.?limit|too (?:many|much|fast)|slow(?:ing)? down|throttl|(?:try|retry|come back) (?:again )?later"
    r"|temporar(?:il)?y (?:deferred|rate.?limited|blocked|suspended)|deferred due to|unusual (?:rate|traffic|volume)"
    r"|unexpected volume|excessive|exceed|server busy|frequency limit|\[(?:TSS?0\d|IPTS0\d|HCM\d)\]",
    re.IGNORECASE,
)


def pushback_of(reply: Reply | None) -> Pushback:
    """Say whether a server's reply asks for fewer sessions or less mail.

    Only transient replies of a server count (a reply code, 4xx). A connection-limit
    reply is any of them naming too many connections; a "slow down" reply is a 421 or
    an enhanced status 4.7.x whose text has one of ``SLOW_DOWN_WORDS``.
    """
    if reply is None or reply.code is None or not 400 <= reply.code < 500:
        return Pushback.NONE
    if CONNECTION_LIMIT_WORDS.search(reply.text):
        return Pushback.CONNECTIONS
    if (reply.code == 421 or reply.status.startswith("4.7.")) and SLOW_DOWN_WORDS.search(reply.text):
        return Pushback.SLOW_DOWN
    return Pushback.NONE


# -- what a store takes and returns ------------------------------------------------------


class WindowChange(enum.Enum):
    """What a session's end does to its destination's slow-start window."""

    KEEP = "keep"
    GROW = "grow"  # a successful session: one more, up to CONCURRENCY
    HALVE = "halve"  # a connection-limit or "slow down" reply: half, at least one


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PermitRequest:
    """A worker asks for room to start a session to ``key``.

    ``slot`` names the slot it would hold (``limits.uses_slots``), leased until
    ``slot_until``. ``held`` items were held back by this worker, without asking, since
    its last request for ``key``, the last due at ``held_until``: the store counts them
    for the operators' view.
    """

    key: str
    limits: Limits
    now: datetime
    slot: str | None = None
    slot_until: datetime | None = None
    held: int = 0
    held_until: datetime | None = None
    cost: int = 1  # what the session's message counts against a QUOTA

    @property
    def quota_ask(self) -> QuotaAsk | None:
        """What the request asks of the destination's quota, ``None`` without one in force."""
        quota = self.limits.quota
        allowed = None if quota is None else quota.allowed_at(self.now)
        if quota is None or allowed is None:
            return None
        return QuotaAsk(allowed=allowed, period=quota.period, cost=self.cost)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Permit:
    """The store's answer: room or not, and if not, why and when to ask again.

    ``reason`` is ``"suspended"``, ``"quota"``, ``"rate"`` or ``"concurrency"`` when
    refused. ``retry_at`` is when there will be room: the suspension's end, the quota's
    room (the oldest of its window's bins leaving it) or the next token;
    ``None`` for a full set of slots, which frees when a session ends. ``sessions`` is
    how many slots are held once the request is decided; ``limit`` the concurrency
    that applied (the slow-start window, or ``CONCURRENCY``), ``None`` without one.
    """

    granted: bool
    reason: str | None = None
    retry_at: datetime | None = None
    sessions: int = 0
    limit: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DestinationState:
    """A destination's bucket as the admin and ``queue_status`` show it.

    ``sessions``: slots held now; ``window``: the slow-start window, ``None`` without
    one; ``suspended_until``: set while suspended; ``held``: items held back since
    the destination last had none waiting, the last one due at ``held_until``;
    ``quota_used``: what its ``QUOTA`` counted in the rolling window of
    ``quota_period`` seconds (``None`` when it has no quota's count yet); ``quota``: the
    quota in force now, from the settings (``with_quota``), and ``quota_counts`` what it
    counts (``"recipients"`` or ``"messages"``).
    """

    key: str
    sessions: int
    window: float | None
    suspended_until: datetime | None
    held: int
    held_until: datetime | None
    quota_used: int = 0
    quota_period: float | None = None
    quota: int | None = None
    quota_counts: str | None = None

    def with_quota(self, limits: Limits | None, now: datetime) -> DestinationState:
        """This state with the quota in force at ``now`` under ``limits``, for people to read."""
        quota = None if limits is None else limits.quota
        allowed = None if quota is None else quota.allowed_at(now)
        if quota is None or allowed is None:
            return self
        counts = COUNT_RECIPIENTS if quota.counts_recipients else COUNT_MESSAGES
        return dataclasses.replace(self, quota=allowed, quota_counts=counts, quota_period=quota.period)

    @property
    def quota_text(self) -> str | None:
        """``"30 of 50 recipients in 24 hours"``, or ``None`` without a quota in force."""
        if self.quota is None or self.quota_period is None:
            return None
        return f"{self.quota_used:,} of {self.quota:,} {self.quota_counts} in {UNIT_NAMES[self.quota_period]}"

    def is_throttled(self, now: datetime) -> bool:
        """Whether the destination holds mail back at ``now``: suspended, or items held."""
        return (self.suspended_until is not None and self.suspended_until > now) or (
            self.held_until is not None and self.held_until > now
        )

    def to_dict(self) -> dict[str, object]:
        """Return the JSON form ``queue_status --json`` prints."""
        return {
            "destination": self.key,
            "sessions": self.sessions,
            "window": self.window,
            "suspended_until": None if self.suspended_until is None else self.suspended_until.isoformat(),
            "held": self.held,
            "held_until": None if self.held_until is None else self.held_until.isoformat(),
            "quota_used": self.quota_used if self.quota_period is not None else None,
            "quota": self.quota,
            "quota_counts": self.quota_counts,
        }


# -- the bucket's arithmetic, as every store does it -------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def seconds(value: datetime) -> float:
    """Return a time as seconds since the epoch, the unit buckets keep (a naive time is UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH).total_seconds()


def moment(value: float) -> datetime:
    """Return seconds since the epoch as an aware time."""
    return _EPOCH + timedelta(seconds=value)


def moment_or_none(value: float | None, *, after: float) -> datetime | None:
    """Return ``value`` as a time when it is later than ``after``, else ``None``."""
    return moment(value) if value is not None and value > after else None


@dataclasses.dataclass(kw_only=True, slots=True)
class Bucket:
    """One destination's state, in seconds since the epoch (what the stores keep).

    ``take`` and ``release`` are the two steps a store runs atomically; the ORM store
    runs the same arithmetic in one SQL statement, the Redis store in a Lua script.
    """

    tokens: float | None = None  # None: full (or no RATE)
    tokens_at: float = 0.0
    window: float | None = None
    slots: dict[str, float] = dataclasses.field(default_factory=dict)  # slot -> lease end
    suspended_until: float = 0.0
    active_at: float = 0.0
    held: int = 0
    held_until: float = 0.0
    quota_bins: dict[float, float] = dataclasses.field(default_factory=dict)  # bin start -> count
    quota_period: float = 0.0  # the window the bins were counted for; 0: no quota yet

    def live_slots(self, now: float) -> dict[str, float]:
        return {slot: until for slot, until in self.slots.items() if until > now}

    def take(self, request: PermitRequest) -> Permit:
        """Decide ``request`` and apply it; see ``QueueStore.take_permit``."""
        now, limits = seconds(request.now), request.limits
        self.slots = self.live_slots(now)
        if request.held:
            self.held = request.held + (self.held if self.held_until > now else 0)
            self.held_until = max(self.held_until, seconds(request.held_until or request.now))
        window = self._window(limits, now)
        limit = limit_of(limits.concurrency, window)
        refill = self._refill(limits, now)
        ask = request.quota_ask
        if ask is not None:
            self.quota_bins, self.quota_period = live_bins(self.quota_bins, now=now, period=ask.period), ask.period
        reason = retry = None
        if self.suspended_until > now:
            reason, retry = "suspended", self.suspended_until
        elif ask is not None and not fits(sum(self.quota_bins.values()), ask):
            reason, retry = "quota", room_at(self.quota_bins, ask, now=now)
        elif refill is not None and refill < 1:
            assert limits.rate is not None
            reason, retry = "rate", now + (1 - refill) / limits.rate.per_second
        elif limit is not None and len(self.slots) >= limit:
            reason = "concurrency"
        granted = reason is None
        if refill is not None:
            self.tokens = refill - 1 if granted else refill
            self.tokens_at = max(now, self.tokens_at)
        self.window = window
        if granted:
            self.active_at = now
            if request.slot is not None and request.slot_until is not None:
                self.slots[request.slot] = seconds(request.slot_until)
            if ask is not None:
                start = ask.bin_at(now)
                self.quota_bins[start] = self.quota_bins.get(start, 0.0) + ask.cost
        return Permit(
            granted=granted,
            reason=reason,
            retry_at=None if retry is None else moment(retry),
            sessions=len(self.slots),
            limit=limit,
        )

    def _window(self, limits: Limits, now: float) -> float | None:
        if limits.slow_start is None:
            return None
        idle = not self.slots and now - self.active_at > SLOW_START_RESET_SECONDS
        return float(limits.slow_start) if self.window is None or idle else self.window

    def _refill(self, limits: Limits, now: float) -> float | None:
        if limits.rate is None:
            return None
        capacity = limits.rate.capacity
        if self.tokens is None:
            return capacity
        return min(capacity, self.tokens + max(0.0, now - self.tokens_at) * limits.rate.per_second)

    def release(
        self,
        *,
        slot: str | None,
        now: datetime,
        change: WindowChange,
        concurrency: int | None,
        suspend_until: datetime | None,
    ) -> None:
        """Let go of ``slot``, change the window, suspend; see ``QueueStore.release_permit``."""
        at = seconds(now)
        self.slots = self.live_slots(at)
        if slot is not None:
            self.slots.pop(slot, None)
        self.window = change_window(self.window, change, concurrency)
        if suspend_until is not None:
            self.suspended_until = max(self.suspended_until, seconds(suspend_until))
        self.active_at = max(self.active_at, at)

    def quota_used(self, now: float) -> int:
        """What the quota counts at ``now``: the bins still within the window."""
        if not self.quota_period:
            return 0
        return round(sum(live_bins(self.quota_bins, now=now, period=self.quota_period).values()))

    def state(self, key: str, now: datetime) -> DestinationState:
        at = seconds(now)
        return DestinationState(
            key=key,
            sessions=len(self.live_slots(at)),
            window=self.window,
            suspended_until=moment_or_none(self.suspended_until, after=at),
            held=self.held if self.held_until > at else 0,
            held_until=moment_or_none(self.held_until, after=at),
            quota_used=self.quota_used(at),
            quota_period=self.quota_period or None,
        )

    def is_idle(self, before: float, now: float) -> bool:
        """Whether nothing is left to remember: no activity since ``before``, nothing
        pending, no quota's count still in its window."""
        return (
            self.active_at < before
            and self.suspended_until <= now
            and self.held_until <= now
            and window_end(self.quota_bins, self.quota_period) <= now
        )


def limit_of(concurrency: int | None, window: float | None) -> int | None:
    if concurrency is None:
        return None
    return concurrency if window is None else max(1, min(concurrency, math.floor(window)))


def change_window(window: float | None, change: WindowChange, concurrency: int | None) -> float | None:
    """Return the slow-start window after a session's end (``None`` stays ``None``)."""
    if window is None or change is WindowChange.KEEP:
        return window
    if change is WindowChange.GROW:
        return window + 1 if concurrency is None else min(float(concurrency), window + 1)
    return max(1.0, window / 2)
