"""The ORM store's shaping buckets: one row of ``bumail_queue_shaping`` per destination.

Each step is one statement, atomic by itself: an ``INSERT ... ON CONFLICT (key) DO
UPDATE`` whose ``SET`` decides the request from the row as it stands. On PostgreSQL
the conflicting row is locked and a concurrent statement re-reads it once the first
commits, so two workers never both take the last slot or token; on SQLite the
statement runs under the database's write lock. The arithmetic is ``shaping.Bucket``'s,
written in SQL: the decision (``ok``) is spelled out in every column it changes, and
``granted`` keeps the id of the last request granted, which ``RETURNING`` gives back.

The two databases differ only in their JSON functions (the slots are a JSON object of
slot to lease end, a ``QUOTA``'s bins one of bin start to count) and in the names of
``LEAST``/``GREATEST``.
"""

from __future__ import annotations

import builtins
import json
import uuid
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from django.db.backends.base.base import BaseDatabaseWrapper

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.models import ShapingBucket
from bumail_queue.quota import QuotaAsk, fits, room_at
from bumail_queue.shaping import (
    SLOW_START_RESET_SECONDS,
    Bucket,
    DestinationState,
    Permit,
    PermitRequest,
    WindowChange,
    limit_of,
    moment,
    seconds,
)

TABLE = ShapingBucket._meta.db_table

ENSURE_TRIES = 3
"""How many times a request makes its bucket's row before it gives up."""


class ORMWriter(Protocol):
    """What the statements need of the ORM store: its connection and its write cursor."""

    @property
    def connection(self) -> BaseDatabaseWrapper: ...

    def _writing(self, *, single_statement: bool = False) -> AbstractContextManager[Any]: ...

    def translated_errors(self) -> AbstractContextManager[None]: ...


class _SQL:
    """The fragments that differ between PostgreSQL and SQLite."""

    def __init__(self, vendor: str) -> None:
        self.postgres = vendor == "postgresql"
        self.least, self.greatest = ("LEAST", "GREATEST") if self.postgres else ("min", "max")

    def p(self, name: str) -> str:
        """A number parameter (typed on PostgreSQL, where a NULL has no type of its own)."""
        return f"%({name})s::float8" if self.postgres else f"%({name})s"

    def each(self, slots: str) -> str:
        """The rows (slot, until) of a slots object."""
        if self.postgres:
            return f"jsonb_each_text({slots}) AS s(slot, until)"
        return f"json_each({slots}) AS s"

    def slot(self) -> str:
        return "s.slot" if self.postgres else "s.key"

    def until(self) -> str:
        return "s.until::float8" if self.postgres else "s.value"

    def live_slots(self, slots: str = "b.slots", *, without: str | None = None) -> str:
        where = f"{self.until()} > {self.p('now')}"
        if without is not None:
            where += f" AND (%({without})s IS NULL OR {self.slot()} <> %({without})s)"
        if self.postgres:
            return f"(SELECT coalesce(jsonb_object_agg(s.slot, {self.until()}), '{{}}'::jsonb) FROM {self.each(slots)} WHERE {where})"
        return f"(SELECT json_group_object(s.key, s.value) FROM {self.each(slots)} WHERE {where})"

    def gathered_slots(self) -> str:
        """The aggregate that gathers ``s`` rows back into a slots object (empty for none)."""
        if self.postgres:
            return f"coalesce(jsonb_object_agg(s.slot, {self.until()}), '{{}}'::jsonb)"
        return "json_group_object(s.key, s.value)"

    def with_slot(self, slots: str) -> str:
        if self.postgres:
            return f"({slots} || jsonb_build_object(%(slot)s::text, %(slot_until)s::float8))"
        return f"json_set({slots}, '$.\"' || %(slot)s || '\"', %(slot_until)s)"

    def no_wait(self, joined: str) -> str:
        """One more ``FROM`` item that commits the statement without waiting for the disk,
        on PostgreSQL.

        A bucket is soft state: a database crash that forgets its last milliseconds
        costs a token or a slot lease at most, and waiting for the WAL's flush on every
        session would cost a disk write each (``synchronous_commit`` off for this
        statement's transaction alone, as the claim does). ``joined`` leads it: ``", "``
        after another ``FROM`` item, ``" FROM "`` alone. SQLite waits for its disk on
        every commit whatever is asked (``""``).
        """
        if self.postgres:
            return f"{joined}(SELECT set_config('synchronous_commit', 'off', true)) AS no_wait"
        return ""

    def json_param(self, name: str) -> str:
        return f"%({name})s::jsonb" if self.postgres else f"%({name})s"

    def floor(self, value: str) -> str:
        return f"floor({value})" if self.postgres else f"CAST({value} AS INTEGER)"

    # A QUOTA's bins: {"<bin start>": count}, as rows q(start, n).

    def each_bin(self, bins: str) -> str:
        if self.postgres:
            return f"jsonb_each_text({bins}) AS q(bin, n)"
        return f"json_each({bins}) AS q"

    def bin_start(self) -> str:
        return "q.bin::float8" if self.postgres else "CAST(q.key AS REAL)"

    def bin_count(self) -> str:
        return "q.n::float8" if self.postgres else "q.value"

    def gathered_bins(self) -> str:
        if self.postgres:
            return f"coalesce(jsonb_object_agg(q.bin, {self.bin_count()}), '{{}}'::jsonb)"
        return "json_group_object(q.key, q.value)"

    def with_cost(self, bins: str) -> str:
        """``bins`` with the request's cost added to the bin of now."""
        if self.postgres:
            return (
                f"({bins} || jsonb_build_object(%(bin)s::text, "
                f"coalesce(({bins}->>%(bin)s::text)::float8, 0) + %(cost)s::float8))"
            )
        path = "'$.\"' || %(bin)s || '\"'"
        return f"json_set({bins}, {path}, coalesce(json_extract({bins}, {path}), 0) + %(cost)s)"


def _take_sql(sql: _SQL) -> str:
    """One ``UPDATE`` that reads the row (locked on PostgreSQL), decides, and writes.

    The decision is computed once, in the CTEs, from the row as it stands: ``kept``
    (the slots whose lease has not ended), ``w`` (the window and the refilled tokens)
    and ``d`` (``ok``, the request granted). ``granted`` keeps the request's id when
    it is, which ``RETURNING`` gives back. No row: ``_ensure_sql`` first.
    """
    p, least, greatest = sql.p, sql.least, sql.greatest
    lock = " FOR UPDATE" if sql.postgres else ""
    limit = (
        f"CASE WHEN w.window_size IS NULL THEN {p('concurrency')} "
        f"ELSE {greatest}(1, {least}({p('concurrency')}, {sql.floor('w.window_size')})) END"
    )
    return (
        f"WITH cur AS (SELECT tokens, tokens_at, window_size, slots, suspended_until, active_at, quota_bins "
        f"FROM {TABLE} WHERE key = %(key)s{lock}), "
        f"kept AS (SELECT {sql.gathered_slots()} AS slots, count(*) AS n FROM cur, {sql.each('cur.slots')} "
        f"WHERE {sql.until()} > {p('now')}), "
        # The quota's bins still within its window, and what they count.
        f"qb AS (SELECT {sql.gathered_bins()} AS bins, coalesce(sum({sql.bin_count()}), 0) AS used "
        f"FROM cur, {sql.each_bin('cur.quota_bins')} "
        f"WHERE {sql.bin_start()} + {p('width')} > {p('now')} - {p('period')}), "
        f"w AS (SELECT CASE WHEN {p('initial')} IS NULL THEN NULL "
        f"WHEN cur.window_size IS NULL OR (kept.n = 0 AND {p('now')} - cur.active_at > {p('reset')}) "
        f"THEN {p('initial')} ELSE cur.window_size END AS window_size, "
        f"CASE WHEN {p('rate')} IS NULL THEN NULL WHEN cur.tokens IS NULL THEN {p('capacity')} "
        f"ELSE {least}({p('capacity')}, cur.tokens + {greatest}(0, {p('now')} - cur.tokens_at) * {p('rate')}) END AS refill "
        "FROM cur, kept), "
        "d AS (SELECT w.window_size, w.refill, kept.slots, qb.bins, "
        f"(cur.suspended_until <= {p('now')} AND (w.refill IS NULL OR w.refill >= 1) "
        f"AND ({p('concurrency')} IS NULL OR kept.n < {limit}) "
        f"AND ({p('quota')} IS NULL OR qb.used + {p('cost')} <= {p('quota')} OR qb.used <= 0)) AS ok "
        "FROM cur, kept, w, qb) "
        f"UPDATE {TABLE} SET "
        "tokens = CASE WHEN d.refill IS NULL THEN NULL WHEN d.ok THEN d.refill - 1 ELSE d.refill END, "
        f"tokens_at = {greatest}({p('now')}, {TABLE}.tokens_at), "
        "window_size = d.window_size, "
        f"slots = CASE WHEN d.ok AND %(slot)s IS NOT NULL THEN {sql.with_slot('d.slots')} ELSE d.slots END, "
        f"active_at = CASE WHEN d.ok THEN {p('now')} ELSE {TABLE}.active_at END, "
        f"held = CASE WHEN %(held)s = 0 THEN {TABLE}.held WHEN {TABLE}.held_until > {p('now')} "
        f"THEN {TABLE}.held + %(held)s ELSE %(held)s END, "
        f"held_until = CASE WHEN %(held)s = 0 THEN {TABLE}.held_until "
        f"ELSE {greatest}({TABLE}.held_until, {p('held_until')}) END, "
        f"quota_bins = CASE WHEN {p('quota')} IS NULL THEN {TABLE}.quota_bins "
        f"WHEN d.ok THEN {sql.with_cost('d.bins')} ELSE d.bins END, "
        f"quota_period = coalesce({p('period')}, {TABLE}.quota_period), "
        f"quota_until = CASE WHEN d.ok AND {p('quota')} IS NOT NULL "
        f"THEN {greatest}({TABLE}.quota_until, {p('bin_end')}) ELSE {TABLE}.quota_until END, "
        f"granted = CASE WHEN d.ok THEN %(request)s ELSE {TABLE}.granted END "
        f"FROM d{sql.no_wait(', ')} WHERE {TABLE}.key = %(key)s "
        f"RETURNING {TABLE}.granted, {TABLE}.tokens, {TABLE}.window_size, {TABLE}.slots, {TABLE}.suspended_until, "
        f"{TABLE}.quota_bins"
    )


def _ensure_sql(sql: _SQL) -> str:
    """A full bucket for a destination without a row (a first request, or one forgotten).

    It is active from now: another worker's ``forget_idle`` between this statement and
    the request it was made for must not take it for a bucket idle for an hour.
    """
    return (
        f"INSERT INTO {TABLE} (key, tokens, tokens_at, window_size, slots, suspended_until, active_at, held, "
        f"held_until, granted, quota_bins, quota_period, quota_until) VALUES (%(key)s, NULL, 0, NULL, "
        f"{sql.json_param('no_slots')}, 0, {sql.p('now')}, 0, 0, '', {sql.json_param('no_slots')}, 0, 0) "
        "ON CONFLICT (key) DO NOTHING"
    )


def _release_sql(sql: _SQL) -> str:
    p, least, greatest = sql.p, sql.least, sql.greatest
    window = (
        "(CASE WHEN b.window_size IS NULL THEN NULL "
        f"WHEN %(change)s = 'grow' AND {p('concurrency')} IS NULL THEN b.window_size + 1 "
        f"WHEN %(change)s = 'grow' THEN {least}({p('concurrency')}, b.window_size + 1) "
        f"WHEN %(change)s = 'halve' THEN {greatest}(1, b.window_size / 2) ELSE b.window_size END)"
    )
    return (
        f"INSERT INTO {TABLE} AS b (key, tokens, tokens_at, window_size, slots, suspended_until, active_at, held, "
        "held_until, granted, quota_bins, quota_period, quota_until) "
        f"SELECT %(key)s, NULL, 0, NULL, {sql.json_param('no_slots')}, coalesce({p('suspend')}, 0), {p('now')}, 0, 0, '', "
        f"{sql.json_param('no_slots')}, 0, 0"
        f"{sql.no_wait(' FROM ') or ' WHERE true'} "
        "ON CONFLICT (key) DO UPDATE SET "
        f"slots = {sql.live_slots(without='slot')}, window_size = {window}, "
        f"suspended_until = {greatest}(b.suspended_until, coalesce({p('suspend')}, 0)), "
        f"active_at = {greatest}(b.active_at, {p('now')})"
    )


def _renew_sql(sql: _SQL) -> str:
    p = sql.p
    if sql.postgres:
        set_slot = "jsonb_set(slots, ARRAY[%(slot)s::text], to_jsonb(%(until)s::float8))"
        held = f"(slots->>%(slot)s::text)::float8 > {p('now')}"
    else:
        path = "'$.\"' || %(slot)s || '\"'"
        set_slot = f"json_set(slots, {path}, %(until)s)"
        held = f"json_extract(slots, {path}) > %(now)s"
    return f"UPDATE {TABLE} SET slots = {set_slot} WHERE key = %(key)s AND {held}"


class ORMShaping:
    """The four steps of ``QueueStore``'s shaping interface, as statements of ``store``."""

    def __init__(self, store: ORMWriter) -> None:
        self.store = store
        self._statements: dict[tuple[str, str], str] = {}

    def _sql(self, name: str) -> str:
        vendor = self.store.connection.vendor
        found = self._statements.get((name, vendor))
        if found is None:
            build = {"take": _take_sql, "ensure": _ensure_sql, "release": _release_sql, "renew": _renew_sql}[name]
            found = self._statements[(name, vendor)] = build(_SQL(vendor))
        return found

    def take(self, request: PermitRequest) -> Permit:
        limits, now = request.limits, seconds(request.now)
        rate = limits.rate
        slot_until = None if request.slot_until is None else seconds(request.slot_until)
        slot = request.slot if slot_until is not None else None
        params = {
            "key": request.key,
            "now": now,
            "rate": None if rate is None else rate.per_second,
            "capacity": None if rate is None else rate.capacity,
            "concurrency": limits.concurrency,
            "initial": limits.slow_start,
            "reset": SLOW_START_RESET_SECONDS,
            "slot": slot,
            "slot_until": slot_until,
            "held": request.held,
            "held_until": seconds(request.held_until) if request.held and request.held_until else 0.0,
            "request": uuid.uuid4().hex,
            **_quota_params(request.quota_ask, now),
        }
        row = self._take_row(params)
        granted, tokens, window, slots, suspended_until, bins = row
        live = [until for until in _slots(slots).values() if until > now]
        limit = limit_of(limits.concurrency, window)
        if granted == params["request"]:
            return Permit(granted=True, sessions=len(live), limit=limit)
        if suspended_until > now:
            return Permit(
                granted=False, reason="suspended", retry_at=moment(suspended_until), sessions=len(live), limit=limit
            )
        ask = request.quota_ask
        if ask is not None and not fits(sum(_bins(bins).values()), ask):
            retry = room_at(_bins(bins), ask, now=now)
            return Permit(granted=False, reason="quota", retry_at=moment(retry), sessions=len(live), limit=limit)
        if rate is not None and tokens is not None and tokens < 1:
            retry = now + (1 - tokens) / rate.per_second
            return Permit(granted=False, reason="rate", retry_at=moment(retry), sessions=len(live), limit=limit)
        return Permit(granted=False, reason="concurrency", sessions=len(live), limit=limit)

    def _take_row(self, params: dict[str, Any]) -> Any:
        """Run the request on its bucket's row, making a full one first if there is none."""
        for _ in range(ENSURE_TRIES):
            with self.store._writing(single_statement=True) as cursor:
                cursor.execute(self._sql("take"), params)
                row = cursor.fetchone()
            if row is not None:
                return row
            with self.store._writing(single_statement=True) as cursor:
                cursor.execute(self._sql("ensure"), {"key": params["key"], "now": params["now"], "no_slots": "{}"})
        # Deleted under each request: a store that forgets its rows this fast is not one
        # to shape by, and the worker holds the item back as it would for a store down.
        raise QueueError(
            ErrorCode.STORE_UNAVAILABLE,
            f"The shaping bucket of {params['key']!r} vanished {ENSURE_TRIES} times before it could be read.",
        )

    def release(
        self,
        key: str,
        *,
        slot: str | None,
        now: datetime,
        change: WindowChange,
        concurrency: int | None,
        suspend_until: datetime | None,
    ) -> None:
        params = {
            "key": key,
            "slot": slot,
            "now": seconds(now),
            "change": change.value,
            "concurrency": concurrency,
            "suspend": None if suspend_until is None else seconds(suspend_until),
            "no_slots": "{}",
        }
        with self.store._writing(single_statement=True) as cursor:
            cursor.execute(self._sql("release"), params)

    def renew(self, key: str, *, slot: str, now: datetime, until: datetime) -> bool:
        params = {"key": key, "slot": slot, "now": seconds(now), "until": seconds(until)}
        with self.store._writing(single_statement=True) as cursor:
            cursor.execute(self._sql("renew"), params)
            return bool(cursor.rowcount == 1)

    def states(self, *, now: datetime) -> builtins.list[DestinationState]:
        with self.store.translated_errors():
            rows = ShapingBucket.objects.using(self.store.connection.alias).order_by("key")
            return [_bucket_of(row).state(row.key, now) for row in rows]

    def forget_idle(self, *, before: datetime, now: datetime) -> int:
        at = seconds(now)
        with self.store.translated_errors():
            deleted, _ = (
                ShapingBucket.objects.using(self.store.connection.alias)
                .filter(active_at__lt=seconds(before), suspended_until__lte=at, held_until__lte=at, quota_until__lte=at)
                .delete()
            )
        return deleted


def _quota_params(ask: QuotaAsk | None, now: float) -> dict[str, Any]:
    """The statement's quota parameters: all ``None`` without a quota in force."""
    if ask is None:
        return dict.fromkeys(("quota", "period", "width", "cost", "bin", "bin_end"))
    start = ask.bin_at(now)
    return {
        "quota": ask.allowed,
        "period": ask.period,
        "width": ask.width,
        "cost": ask.cost,
        "bin": str(int(start)),
        "bin_end": start + ask.width + ask.period,
    }


def _bins(raw: Any) -> dict[float, float]:
    """A quota's bins as the driver returns them: a dict (psycopg) or JSON text (SQLite)."""
    found = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return {float(start): float(count) for start, count in (found or {}).items()}


def _slots(raw: Any) -> dict[str, float]:
    """A slots object as the driver returns it: a dict (psycopg) or JSON text (SQLite)."""
    found = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return {str(slot): float(until) for slot, until in (found or {}).items()}


def _bucket_of(row: ShapingBucket) -> Bucket:
    return Bucket(
        tokens=row.tokens,
        tokens_at=row.tokens_at,
        window=row.window_size,
        slots=_slots(row.slots),
        suspended_until=row.suspended_until,
        active_at=row.active_at,
        held=row.held,
        held_until=row.held_until,
        quota_bins=_bins(row.quota_bins),
        quota_period=row.quota_period,
    )
