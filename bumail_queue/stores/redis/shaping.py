"""The Redis store's shaping buckets: a hash and a sorted set of slots per destination.

Each step (take, release, renew, forget) is one script, which decides from the bucket
as it stands; the buckets read back become ``shaping.Bucket``s, which say each
destination's state.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import cast

from bumail_queue.quota import QuotaAsk
from bumail_queue.shaping import (
    SLOW_START_RESET_SECONDS,
    Bucket,
    DestinationState,
    Permit,
    PermitRequest,
    WindowChange,
    moment,
    seconds,
)

from . import scripts
from .connection import RedisConnection
from .layout import hash_fields

# How long a shaping bucket outlives the last thing it holds (a slot's lease, a
# suspension, held items): an hour, by then its tokens are full and its window reset.
BUCKET_KEPT_SECONDS = 3600


class RedisShaping(RedisConnection):
    """Gives and takes back room at a destination, and reads and forgets its bucket."""

    # -- shaping: a hash and a sorted set of slots per destination, one script a step ---

    def take_permit(self, request: PermitRequest) -> Permit:
        limits, rate = request.limits, request.limits.rate
        slot = request.slot if request.slot is not None and request.slot_until is not None else None
        args: list[str | bytes | int] = [
            self.keys.prefix,
            request.key,
            _number(seconds(request.now)),
            "" if rate is None else _number(rate.per_second),
            "" if rate is None else _number(rate.capacity),
            "" if limits.concurrency is None else str(limits.concurrency),
            "" if limits.slow_start is None else str(limits.slow_start),
            _number(SLOW_START_RESET_SECONDS),
            slot or "",
            "" if slot is None or request.slot_until is None else _number(seconds(request.slot_until)),
            str(request.held),
            _number(seconds(request.held_until or request.now)),
            str(BUCKET_KEPT_SECONDS),
            *_quota_args(request.quota_ask, seconds(request.now)),
        ]
        granted, reason, retry, sessions, limit = self._run(
            scripts.SHAPING_TAKE, "ask for room at a destination", [self.keys.shaping], args
        )
        return Permit(
            granted=granted == 1,
            reason=reason.decode() or None,
            retry_at=moment(float(retry)) if retry else None,
            sessions=int(sessions),
            limit=int(limit) if limit != b"" else None,
        )

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
        args: list[str | bytes | int] = [
            self.keys.prefix,
            key,
            slot or "",
            _number(seconds(now)),
            change.value,
            "" if concurrency is None else str(concurrency),
            "" if suspend_until is None else _number(seconds(suspend_until)),
            str(BUCKET_KEPT_SECONDS),
        ]
        self._run(scripts.SHAPING_RELEASE, "end a session at a destination", [self.keys.shaping], args)

    def renew_permit(self, key: str, *, slot: str, now: datetime, until: datetime) -> bool:
        args: list[str | bytes | int] = [
            self.keys.prefix,
            key,
            slot,
            _number(seconds(now)),
            _number(seconds(until)),
            str(BUCKET_KEPT_SECONDS),
        ]
        return bool(self._run(scripts.SHAPING_RENEW, "renew a session's slot", [self.keys.shaping], args) == 1)

    def destination_states(self, *, now: datetime) -> builtins.list[DestinationState]:
        """The index's destinations, then each bucket and its live slots, pipelined."""
        client = self._redis()
        at = seconds(now)
        with self._translated_errors("read the shaping buckets"):
            found = cast("list[bytes]", client.zrangebyscore(self.keys.shaping, at, "+inf"))
            keys = sorted(key.decode() for key in found)
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(self.keys.bucket(key))
                pipe.zrangebyscore(f"{self.keys.bucket(key)}:slots", f"({at}", "+inf", withscores=True)
                pipe.hgetall(f"{self.keys.bucket(key)}:quota")
            replies = pipe.execute()
        states = []
        for key, fields, slots, bins in zip(keys, replies[::3], replies[1::3], replies[2::3], strict=True):
            if fields:
                states.append(_bucket_from(hash_fields(fields), slots, hash_fields(bins)).state(key, now))
        return states

    def forget_idle_destinations(self, *, before: datetime, now: datetime) -> int:
        args: list[str | bytes | int] = [self.keys.prefix, _number(seconds(before)), _number(seconds(now))]
        return int(self._run(scripts.SHAPING_FORGET, "forget idle destinations", [self.keys.shaping], args))


def _number(value: float) -> str:
    """A number as the shaping scripts read it: seconds to the microsecond, rates exactly."""
    return repr(float(value))


def _quota_args(ask: QuotaAsk | None, now: float) -> list[str | bytes | int]:
    """The take script's last arguments: the quota in force, its period, the bin width,
    the request's cost and the bin of now (empty strings without a quota in force)."""
    if ask is None:
        return ["", "", "", "", ""]
    start = ask.bin_at(now)
    return [str(ask.allowed), _number(ask.period), _number(ask.width), str(ask.cost), str(int(start))]


def _bucket_from(
    fields: Mapping[bytes, bytes], slots: Sequence[tuple[bytes, float]], bins: Mapping[bytes, bytes]
) -> Bucket:
    def number(name: bytes) -> float | None:
        raw = fields.get(name)
        return None if raw is None else float(raw)

    return Bucket(
        tokens=number(b"tokens"),
        tokens_at=number(b"tokens_at") or 0.0,
        window=number(b"window"),
        slots={slot.decode(): float(until) for slot, until in slots},
        suspended_until=number(b"suspended_until") or 0.0,
        active_at=number(b"active_at") or 0.0,
        held=int(number(b"held") or 0),
        held_until=number(b"held_until") or 0.0,
        quota_bins={float(start): float(count) for start, count in bins.items()},
        quota_period=number(b"quota_period") or 0.0,
    )
