"""How the Redis store keeps MTA-STS policies and TLS report counts.

A policy is a field of one hash, ``<prefix>mta-sts``, its domain to its JSON, and its
domain is scored by its expiry in ``<prefix>mta-sts:expires``; a failed fetch likewise,
in ``<prefix>mta-sts:failed`` and ``<prefix>mta-sts:failed:until``, so that a purge
finds the expired of either without a scan. A day's
counts are two hashes, each kind (``TLSSessionCount.kind``, as JSON) to its count
(``HINCRBY``) and to its policy and first reason (``HSETNX``), written for a batch in
one ``MULTI``/``EXEC``; the sorted set ``<prefix>tlsrpt:days`` lists the days, so a
purge finds them without scanning keys. ``RedisSTS`` gives the store these operations,
each within the client's error translation.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any, cast

from redis import Redis

from bumail_queue.sts import STSFailure, STSMode, STSPolicy, TLSResult, TLSSessionCount

from .connection import RedisConnection
from .layout import RedisKeys, from_micros, hash_fields, micros
from .scripts import STS_PURGE


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def policy_json(policy: STSPolicy) -> str:
    """Return a policy as the hash keeps it."""
    return _json(
        {
            "id": policy.id,
            "mode": policy.mode.value,
            "mx": list(policy.mx),
            "max_age": policy.max_age,
            "fetched": micros(policy.fetched_at),
        }
    )


def policy_from_json(domain: str, raw: bytes) -> STSPolicy:
    """Read a policy back from the hash."""
    data = json.loads(raw)
    return STSPolicy(
        domain=domain,
        id=data["id"],
        mode=STSMode(data["mode"]),
        mx=tuple(data["mx"]),
        max_age=int(data["max_age"]),
        fetched_at=from_micros(data["fetched"].encode()),
    )


def failure_json(failure: STSFailure) -> str:
    """Return a failed fetch as the hash keeps it."""
    return _json(
        {
            "id": failure.policy_id,
            "result": failure.result.value,
            "reason": failure.reason,
            "until": micros(failure.until),
        }
    )


def failure_from_json(domain: str, raw: bytes) -> STSFailure:
    """Read a failed fetch back from the hash."""
    data = json.loads(raw)
    return STSFailure(
        domain=domain,
        policy_id=data["id"],
        result=TLSResult(data["result"]),
        reason=data["reason"],
        until=from_micros(data["until"].encode()),
    )


def add_counts(client: Redis, keys: RedisKeys, counts: Sequence[TLSSessionCount]) -> None:
    """Add ``counts`` in one ``MULTI``/``EXEC``: every count, or none."""
    pipe = client.pipeline(transaction=True)
    for count in counts:
        field = _json([count.domain, count.policy_id, count.result or "", count.mx_host, count.address])
        pipe.hincrby(keys.tls_counts(count.day), field, count.count)
        pipe.hsetnx(keys.tls_about(count.day), field, _json({"policy": list(count.policy), "reason": count.reason}))
    for day in {count.day for count in counts}:
        pipe.zadd(keys.tls_days, {day.isoformat(): day.toordinal()})
    pipe.execute()


def read_counts(client: Redis, keys: RedisKeys, day: date) -> list[TLSSessionCount]:
    """Return the counts of ``day``, read in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.tls_counts(day))
    pipe.hgetall(keys.tls_about(day))
    counted, about = (hash_fields(reply) for reply in pipe.execute())
    return [_count_of(day, field, int(value), about) for field, value in counted.items()]


def _count_of(day: date, field: bytes, value: int, about: Mapping[bytes, bytes]) -> TLSSessionCount:
    domain, policy_id, result, mx_host, address = json.loads(field)
    extra = json.loads(about.get(field, b"{}"))
    return TLSSessionCount(
        day=day,
        domain=domain,
        policy_id=policy_id,
        policy=tuple(extra.get("policy", ())),
        result=TLSResult(result) if result else None,
        mx_host=mx_host,
        address=address,
        reason=extra.get("reason", ""),
        count=value,
    )


def purge_counts(client: Redis, keys: RedisKeys, before: date) -> int:
    """Delete the counts of the days before ``before``; return how many kinds went."""
    found = cast("list[bytes]", client.zrangebyscore(keys.tls_days, "-inf", before.toordinal() - 1))
    days = [date.fromisoformat(raw.decode()) for raw in found]
    if not days:
        return 0
    pipe = client.pipeline(transaction=True)
    for day in days:
        pipe.hlen(keys.tls_counts(day))
        pipe.delete(keys.tls_counts(day), keys.tls_about(day))
    pipe.zrem(keys.tls_days, *(day.isoformat() for day in days))
    replies = pipe.execute()
    return sum(int(replies[index]) for index in range(0, 2 * len(days), 2))


class RedisSTS(RedisConnection):
    """Keeps the domains' MTA-STS policies and the days' TLS report counts, laid out as above."""

    def get_sts_policy(self, domain: str) -> STSPolicy | None:
        client = self._redis()
        with self._translated_errors("read the MTA-STS policy"):
            raw = client.hget(self.keys.sts_policies, domain)
        return None if raw is None else policy_from_json(domain, cast("bytes", raw))

    def put_sts_policy(self, policy: STSPolicy) -> None:
        self.validate_sts_policy(policy)
        client = self._redis()
        with self._translated_errors("keep the MTA-STS policy"):
            pipe = client.pipeline(transaction=True)
            pipe.hset(self.keys.sts_policies, policy.domain, policy_json(policy))
            pipe.zadd(self.keys.sts_expiry, {policy.domain: int(micros(policy.expires_at))})
            pipe.execute()

    def get_sts_failure(self, domain: str, policy_id: str, *, now: datetime) -> STSFailure | None:
        client = self._redis()
        with self._translated_errors("read the MTA-STS fetch failure"):
            raw = client.hget(self.keys.sts_failures, domain)
        if raw is None:
            return None
        failure = failure_from_json(domain, cast("bytes", raw))
        return failure if failure.policy_id == policy_id and failure.until > now else None

    def put_sts_failure(self, failure: STSFailure) -> None:
        self.validate_sts_failure(failure)
        client = self._redis()
        with self._translated_errors("keep the MTA-STS fetch failure"):
            pipe = client.pipeline(transaction=True)
            pipe.hset(self.keys.sts_failures, failure.domain, failure_json(failure))
            pipe.zadd(self.keys.sts_failures_until, {failure.domain: int(micros(failure.until))})
            pipe.execute()

    def purge_sts(self, *, now: datetime) -> int:
        """One script: the sorted sets find what expired by ``now``."""
        client = self._redis()
        keys = self.keys
        with self._translated_errors("purge the MTA-STS policies"):
            gone = STS_PURGE(
                client, [keys.sts_policies, keys.sts_expiry, keys.sts_failures, keys.sts_failures_until], [micros(now)]
            )
        return int(gone)

    def count_tls_sessions(self, counts: Sequence[TLSSessionCount]) -> None:
        self.validate_tls_counts(counts)
        if not counts:
            return
        client = self._redis()
        with self._translated_errors("count the TLS sessions"):
            add_counts(client, self.keys, counts)

    def tls_session_counts(self, day: date) -> builtins.list[TLSSessionCount]:
        client = self._redis()
        with self._translated_errors("read the TLS report counts"):
            return read_counts(client, self.keys, day)

    def purge_tls_session_counts(self, *, before: date) -> int:
        client = self._redis()
        with self._translated_errors("purge the TLS report counts"):
            return purge_counts(client, self.keys, before)
