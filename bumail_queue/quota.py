"""Quotas: how many recipients (or messages) a destination gets in a rolling day or hour.

A provider counts what it was sent over a rolling window: Amazon SES's "sending quota"
is recipients per 24 hours, and a new sending account or address is warmed up from a
few dozen a day to its full volume over weeks. ``SHAPING``'s ``QUOTA`` and ``WARMUP``
keep to both, shared by every worker through the store, in the same bucket and the
same step as the entry's ``RATE`` and ``CONCURRENCY``.

The window is counted in 24 bins of a 24th of it (an hour of a day, 150 seconds of an
hour), each bin the recipients sent while it was the newest. A bin leaves the count
once all of it is older than the window, so the count never misses anything sent in
the last ``period`` seconds: no rolling window ever holds more than the quota, and room
comes back at most one bin late. Twenty-four numbers per destination, whatever the
volume, where an exact log of every send would grow with it.

This module holds what needs neither a store nor a worker: the ``Quota`` of an entry,
the quota in force on a day of a warm-up, and the bins' arithmetic, which the memory
store runs as it is and the other stores run in SQL and Lua, held to the same contract
tests.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Final

QUOTA_UNITS: Final[Mapping[str, float]] = {"h": 3600.0, "d": 86400.0}
UNIT_NAMES: Final[Mapping[float, str]] = {3600.0: "hour", 86400.0: "24 hours"}
BINS: Final = 24
"""How many bins a window is counted in: room comes back at most a 24th of it late."""

COUNT_RECIPIENTS: Final = "recipients"
COUNT_MESSAGES: Final = "messages"

_QUOTA = re.compile(r"\s*([0-9]{1,10})\s*/\s*([hd])\s*")
_DAY: Final = 86400.0


def parse_quota(value: object) -> tuple[int, float] | None:
    """Return ``(count, period)`` of ``"N/d"`` or ``"N/h"`` (N at least 1), or ``None``."""
    if not isinstance(value, str):
        return None
    found = _QUOTA.fullmatch(value)
    if found is None or int(found[1]) < 1:
        return None
    return int(found[1]), QUOTA_UNITS[found[2]]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Quota:
    """``QUOTA`` and ``WARMUP`` of one ``SHAPING`` entry.

    ``count`` per ``period`` seconds once warmed up (``None``: no limit after the
    warm-up). ``warmup`` is the schedule, ``(days, count)`` steps in order from
    ``warmup_start`` (midnight UTC of its date): ``count`` each ``period`` for
    ``days`` days, then the next step; before the start, the first step's.
    """

    count: int | None
    period: float = _DAY
    counts_recipients: bool = True
    warmup: tuple[tuple[int, int], ...] = ()
    warmup_start: datetime | None = None

    @property
    def width(self) -> float:
        """The length of one bin, in seconds."""
        return self.period / BINS

    def allowed_at(self, now: datetime) -> int | None:
        """The quota in force at ``now``: the warm-up's step of the day, then ``count``."""
        if not self.warmup or self.warmup_start is None:
            return self.count
        day = math.floor((now - self.warmup_start).total_seconds() / _DAY)
        for days, count in self.warmup:
            if day < days:
                return count if self.count is None else min(count, self.count)
            day -= days
        return self.count

    def next_rise(self, now: datetime) -> datetime | None:
        """When the quota in force next rises (a warm-up's next step, or its end), if it does.

        Mail held for the quota is due again then at the latest: the room a day's
        higher quota makes comes at its start, not when the day before's sends leave
        the window.
        """
        if not self.warmup or self.warmup_start is None:
            return None
        current = self.allowed_at(now)
        boundary = self.warmup_start
        for days, _ in self.warmup:
            boundary += timedelta(days=days)
            if boundary > now:
                later = self.allowed_at(boundary)
                if later is None or (current is not None and later > current):
                    return boundary
        return None

    def cost(self, recipients: int) -> int:
        """What a message to ``recipients`` of the destination counts against the quota."""
        return max(1, recipients) if self.counts_recipients else 1

    def describe(self, now: datetime) -> str | None:
        """The quota in force at ``now`` as people read it: ``"50 recipients a day"``."""
        allowed = self.allowed_at(now)
        if allowed is None:
            return None
        what = COUNT_RECIPIENTS if self.counts_recipients else COUNT_MESSAGES
        return f"{allowed:,} {what} in {UNIT_NAMES[self.period]}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class QuotaAsk:
    """What a request asks of a destination's bins: ``cost`` more within ``allowed``."""

    allowed: int
    period: float
    cost: int

    @property
    def width(self) -> float:
        return self.period / BINS

    def bin_at(self, now: float) -> float:
        """The start of the bin that ``now`` falls in (seconds since the epoch)."""
        return math.floor(now / self.width) * self.width


def live_bins(bins: Mapping[float, float], *, now: float, period: float) -> dict[float, float]:
    """The bins of which some part is still within the ``period`` before ``now``."""
    width = period / BINS
    return {start: count for start, count in bins.items() if start + width > now - period}


def fits(used: float, ask: QuotaAsk) -> bool:
    """Whether ``ask.cost`` more fits beside ``used``; a message larger than the whole
    quota goes alone into an empty window, or it would never go."""
    return used + ask.cost <= ask.allowed or used <= 0


def room_at(bins: Mapping[float, float], ask: QuotaAsk, *, now: float) -> float:
    """When the live ``bins`` will have left room for ``ask``: the end of the window of
    the oldest bins whose leaving makes it fit (seconds since the epoch)."""
    used = sum(bins.values())
    for start in sorted(bins):
        used -= bins[start]
        if fits(used, ask):
            return start + ask.width + ask.period
    return now


def window_end(bins: Mapping[float, float], period: float) -> float:
    """When the newest of ``bins`` leaves the window: until then the bucket is not idle."""
    return max((start + period / BINS + period for start in bins), default=0.0)


def day_start(value: datetime) -> datetime:
    """Midnight UTC of ``value``'s day (a naive time is UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    return datetime(value.year, value.month, value.day, tzinfo=UTC)


def warmup_length(steps: tuple[tuple[int, int], ...]) -> timedelta:
    """How long a warm-up schedule lasts."""
    return timedelta(days=sum(days for days, _ in steps))
