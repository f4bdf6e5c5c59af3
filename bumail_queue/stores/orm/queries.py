"""The ORM store's answers to the operator's questions (``search``, ``summary``...).

Kept apart from the claim and record paths (``claims``): nothing here writes, and
nothing here is on a worker's way. Each answer is one or two statements whatever the
size of the queue: the admin's list page costs the same with ten items or a million.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Count, Min, Q
from django.db.models.expressions import RawSQL

from bumail_queue.estimates import current_rows_estimate
from bumail_queue.items import QueueItem, RecipientStatus
from bumail_queue.models import Item
from bumail_queue.queries import (
    HELD_AT,
    SEARCH_HEAD_BYTES,
    ItemQuery,
    ItemState,
    QueueGauges,
    QueueSummary,
    lane_counts,
    lane_order,
    scaled,
    shape_from_counts,
)

from .claim_sql import lanes_sql
from .database import aware


class ORMTables(Protocol):
    """What these answers need of the ORM store: its tables, its connection, its quoting."""

    alias: str
    items_table: str
    messages_table: str
    gauge_sample_rows: int

    @property
    def connection(self) -> BaseDatabaseWrapper: ...

    def quote(self, name: str) -> str: ...

    def prep_time(self, value: datetime) -> Any: ...

    def translated_errors(self) -> AbstractContextManager[None]: ...

    def select_messages(self, item_ids: Iterable[str], *, head: int | None = None) -> dict[str, bytes]: ...


def escape_like(text: str) -> str:
    """Return ``text`` as a ``LIKE`` pattern that matches it literally (``ESCAPE '\\'``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _leased(now: datetime) -> Q:
    return Q(lease_owner__isnull=False, lease_expires_at__gt=now)


def _held(now: datetime) -> Q:
    return ~_leased(now) & Q(next_attempt_at__gte=HELD_AT)


def _state_filter(state: ItemState, now: datetime) -> Q:
    if state == ItemState.DELIVERING:
        return _leased(now)
    if state == ItemState.HELD:
        return _held(now)
    tried = Q(attempts__gt=0) if state == ItemState.DEFERRED else Q(attempts=0)
    return ~_leased(now) & Q(next_attempt_at__lt=HELD_AT) & tried


def _headers_match(store: ORMTables, text: str) -> RawSQL:
    """The ids of items whose message's header block contains ``text`` (ASCII case aside)."""
    q, messages = store.quote, store.quote(store.messages_table)
    pattern = f"%{escape_like(text)}%"
    if store.connection.vendor == "postgresql":
        # The header block ends at the first empty line; LEAST skips the NULLs of a
        # separator not found. 'escape' turns the bytes into text for ILIKE.
        sql = (
            f"SELECT h.{q('item_id')} FROM (SELECT {q('item_id')}, substring({q('data')} from 1 for {SEARCH_HEAD_BYTES}) AS head "
            f"FROM {messages}) AS h WHERE encode(substring(h.head from 1 for LEAST("
            r"NULLIF(position('\x0d0a0d0a'::bytea in h.head), 0), NULLIF(position('\x0a0a'::bytea in h.head), 0), "
            f"{SEARCH_HEAD_BYTES})), 'escape') ILIKE %s"
        )
    else:
        # SQLite's LIKE ignores ASCII case; MIN of two positions, 0 meaning not found.
        sql = (
            f"SELECT h.{q('item_id')} FROM (SELECT {q('item_id')}, substr({q('data')}, 1, {SEARCH_HEAD_BYTES}) AS head "
            f"FROM {messages}) AS h WHERE CAST(substr(h.head, 1, MIN("
            f"COALESCE(NULLIF(instr(h.head, X'0D0A0D0A'), 0), {SEARCH_HEAD_BYTES}), "
            f"COALESCE(NULLIF(instr(h.head, X'0A0A'), 0), {SEARCH_HEAD_BYTES}))) AS TEXT) LIKE %s ESCAPE '\\'"
        )
    return RawSQL(sql, [pattern])  # noqa: S611 - the text is a parameter; the rest is ours


def _sql_pattern(pattern: str, anything: str) -> str:
    """An address pattern (``queries.address_pattern``) as a regular expression both
    databases read alike: each literal character in brackets, ``*`` as ``anything``."""
    parts = ("".join(f"[{c}]" if c not in "\\^]" else f"\\{c}" for c in part) for part in pattern.strip().split("*"))
    return anything.join(parts)


def item_filter(store: ORMTables, query: ItemQuery) -> Q:
    """The condition of ``query``; ``sender`` and ``recipient`` patterns are left to
    ``ItemQuery.matches_addresses`` (``bulk``), ``older_than`` is a condition."""
    where = Q()
    if query.created_before is not None:
        where &= Q(created_at__lt=query.created_before)
    if query.sender is not None:
        where &= Q(sender__iregex=f"^{_sql_pattern(query.sender, '.*')}$")
    if query.recipient is not None:
        # The recipients are JSON: one address matches where a value of "address" does.
        address = _sql_pattern(query.recipient, '[^"]*')
        where &= Q(recipients__iregex=f'"address": ?"{address}"')
    if query.state is not None:
        where &= _state_filter(query.state, query.now)
    if query.domain is not None:
        # The recipients are JSON: an address at the domain ends with '@domain"'.
        where &= Q(recipients__icontains=f'@{query.domain}"')
    if query.channel is not None:
        where &= Q(channel=query.channel)
    if query.priority is not None:
        where &= Q(priority=query.priority)
    if query.item_id is not None:
        where &= Q(id=uuid.UUID(query.item_id))  # the unique index: no scan
    elif query.text is not None:
        text = query.text
        where &= Q(sender__icontains=text) | Q(recipients__icontains=text) | Q(id__in=_headers_match(store, text))
    return where


def search(store: ORMTables, query: ItemQuery, *, offset: int, limit: int) -> list[QueueItem]:
    """Return a page of matching items, earliest due first, in one statement."""
    rows = Item.objects.using(store.alias).filter(item_filter(store, query)).order_by("next_attempt_at", "seq")
    with store.translated_errors():
        return [row.to_queue_item() for row in rows[offset : offset + limit]]


def read_message_heads(store: ORMTables, item_ids: Sequence[str], *, size: int) -> dict[str, bytes]:
    """Return the first ``size`` bytes of each message, in one statement."""
    return store.select_messages(item_ids, head=size)


def summary(store: ORMTables, *, now: datetime, age_buckets: Sequence[timedelta]) -> QueueSummary:
    """Return the counts (one statement) and the shape (one more) of the queue."""
    leased = _leased(now)
    with store.translated_errors():
        counts = Item.objects.using(store.alias).aggregate(
            total=Count("seq"),
            delivering=Count("seq", filter=leased),
            deferred=Count("seq", filter=~leased & Q(attempts__gt=0, next_attempt_at__lt=HELD_AT)),
            held=Count("seq", filter=_held(now)),
            due=Count("seq", filter=~leased & Q(next_attempt_at__lte=now)),
            oldest=Min("created_at"),
        )
        shape_rows = _shape_rows(store, now, tuple(age_buckets))
        lane_rows = (
            Item.objects.using(store.alias)
            .values_list("channel", "priority")
            .annotate(total=Count("seq"), due=Count("seq", filter=~leased & Q(next_attempt_at__lte=now)))
            .order_by()
        )
        lanes = lane_counts(lane_rows)
    by_state = {
        ItemState.DELIVERING: counts["delivering"],
        ItemState.DEFERRED: counts["deferred"],
        ItemState.HELD: counts["held"],
        ItemState.QUEUED: counts["total"] - counts["delivering"] - counts["deferred"] - counts["held"],
    }
    shape = shape_from_counts({(domain or "", index): n for domain, index, n in shape_rows}, len(age_buckets) + 1)
    return QueueSummary(
        now=now,
        total=counts["total"],
        by_state=by_state,
        oldest_created_at=counts["oldest"],
        due=counts["due"],
        pending_recipients=sum(n for _, _, n in shape_rows),
        age_buckets=tuple(age_buckets),
        shape=shape,
        lanes=lanes,
    )


def lanes(store: ORMTables) -> list[tuple[str, int]]:
    """Return the lanes, skipping through the lanes' index: one probe per lane."""
    sql = f"WITH RECURSIVE {lanes_sql(store.quote, store.quote(store.items_table))} SELECT channel, priority FROM lanes"
    with store.translated_errors(), store.connection.cursor() as cursor:
        cursor.execute(sql)
        found = [(channel, int(priority)) for channel, priority in cursor.fetchall()]
    return sorted(found, key=lambda lane: lane_order(*lane))


def _shape_rows(store: ORMTables, now: datetime, bounds: tuple[timedelta, ...]) -> list[tuple[str, int, int]]:
    q, items = store.quote, store.quote(store.items_table)
    # An item is in the first bucket whose bound it is younger than (created after now - bound).
    bucket = (
        "CASE "
        + " ".join(f"WHEN i.{q('created_at')} > %s THEN {n}" for n in range(len(bounds)))
        + f" ELSE {len(bounds)} END"
    )
    params: list[Any] = [store.prep_time(now - bound) for bound in bounds]
    if store.connection.vendor == "postgresql":
        address = "r.value->>'address'"
        sql = (
            f"SELECT lower(substring({address} from '[^@]*$')) AS domain, {bucket} AS bucket, COUNT(*) "
            f"FROM {items} AS i CROSS JOIN LATERAL jsonb_array_elements(i.{q('recipients')}) AS r(value) "
            f"WHERE r.value->>'status' IN ('pending', 'deferred') GROUP BY 1, 2"
        )
    else:
        # SQLite has no "last @": split at the first, and shape_from_counts trims the rest.
        address = "json_extract(r.value, '$.address')"
        sql = (
            f"SELECT lower(substr({address}, instr({address}, '@') + 1)) AS domain, {bucket} AS bucket, COUNT(*) "
            f"FROM {items} AS i, json_each(i.{q('recipients')}) AS r "
            f"WHERE json_extract(r.value, '$.status') IN ('pending', 'deferred') GROUP BY 1, 2"
        )
    with store.connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(domain, int(index), int(n)) for domain, index, n in cursor.fetchall()]


#: How many of the oldest items (by ``seq``, the order they were added in) a sampled
#: ``gauges`` reads for the oldest of each state: an index scan of the primary key.
OLDEST_READ = 1000

# The states of one row, as SQL over the columns of ``_gauged_rows`` (alias ``g``).
_LEASED = "g.leased"
_HELD = "NOT g.leased AND g.held"
_DEFERRED = "NOT g.leased AND NOT g.held AND g.attempts > 0"
_QUEUED = "NOT g.leased AND NOT g.held AND g.attempts = 0"
_DUE = "NOT g.leased AND g.next_attempt_at <= %s"


def held_literal(store: ORMTables) -> str:
    """``HELD_AT`` as a constant of this database's SQL: SQLite's text, PostgreSQL's
    ``timestamptz``."""
    held = store.prep_time(HELD_AT)
    return f"'{held}'" if isinstance(held, str) else f"'{HELD_AT.isoformat()}'::timestamptz"


def gauges(store: ORMTables, *, now: datetime) -> QueueGauges:
    """Return the gauges in one statement: exact over the whole table, or on PostgreSQL
    beyond ``gauge_sample_rows`` items estimated from a sample of about as many rows.

    The sample is ``TABLESAMPLE SYSTEM``: whole pages, each kept with the same chance.
    Its shares (of each state, of recipients per item) are applied to the planner's
    estimate of the table's rows, which autovacuum keeps current on a busy queue
    table: the counts then vary far less between scrapes than the sample's size does.
    The oldest of each state is the oldest among the sample and the ``OLDEST_READ``
    oldest items, and the first due item is found on the due index: the oldest item
    and the item due the longest stay exact.
    """
    with store.translated_errors():
        estimate = current_rows_estimate(store.connection, store.items_table)
        sampled = estimate is not None and estimate > store.gauge_sample_rows
        percent = 100.0 * store.gauge_sample_rows / estimate if sampled and estimate else None
        at = store.prep_time(now)
        sql = _gauges_sql(store, percent)
        with store.connection.cursor() as cursor:
            cursor.execute(sql, [at] * sql.count("%s"))  # every parameter is ``now``
            row = cursor.fetchone()
    return _gauges_from_row(row, now=now, estimate=estimate if sampled else None)


def _gauged_rows(store: ORMTables, sample: str) -> str:
    """The items (or a sample of them) with what ``gauges`` counts of each: whether a
    lease holds it at the first ``%s``, and its pending and deferred recipients."""
    q, items = store.quote, store.quote(store.items_table)
    columns = f"i.{q('created_at')}, i.{q('next_attempt_at')}, i.{q('attempts')}"
    leased = f"(i.{q('lease_owner')} IS NOT NULL AND i.{q('lease_expires_at')} > %s)"
    columns += f", (i.{q('next_attempt_at')} >= {held_literal(store)}) AS held"
    if store.connection.vendor == "postgresql":
        return (
            f"SELECT {columns}, {leased} AS leased, r.pending, r.deferred FROM {items} AS i {sample} "
            "CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE e.value->>'status' = 'pending') AS pending, "
            "count(*) FILTER (WHERE e.value->>'status' = 'deferred') AS deferred "
            f"FROM jsonb_array_elements(i.{q('recipients')}) AS e(value)) AS r"
        )
    recipients = f"SELECT count(*) FROM json_each(i.{q('recipients')}) WHERE json_extract(value, '$.status') = "
    return (
        f"SELECT {columns}, {leased} AS leased, ({recipients}'pending') AS pending, "
        f"({recipients}'deferred') AS deferred FROM {items} AS i"
    )


def _gauges_sql(store: ORMTables, percent: float | None) -> str:
    """The one statement of ``gauges``; ``percent`` of the table's pages sampled, or all."""
    sample = "" if percent is None else f"TABLESAMPLE SYSTEM ({percent:.6f})"
    counted = (
        f"SELECT count(*) FILTER (WHERE {_QUEUED}) AS queued, count(*) FILTER (WHERE {_DEFERRED}) AS deferred, "
        f"count(*) FILTER (WHERE {_LEASED}) AS delivering, "
        f"min(g.created_at) FILTER (WHERE {_QUEUED}) AS oldest_queued, "
        f"min(g.created_at) FILTER (WHERE {_DEFERRED}) AS oldest_deferred, "
        f"min(g.created_at) FILTER (WHERE {_LEASED}) AS oldest_delivering, "
        f"count(*) FILTER (WHERE {_DUE}) AS due, min(g.next_attempt_at) FILTER (WHERE {_DUE}) AS first_due, "
        "coalesce(sum(g.pending), 0) AS pending, coalesce(sum(g.deferred), 0) AS deferred_recipients, "
        f"count(*) FILTER (WHERE {_HELD}) AS held, min(g.created_at) FILTER (WHERE {_HELD}) AS oldest_held "
        f"FROM ({_gauged_rows(store, sample)}) AS g"
    )
    if percent is None:
        return counted
    q, items = store.quote, store.quote(store.items_table)
    leased = f"({q('lease_owner')} IS NOT NULL AND {q('lease_expires_at')} > %s)"
    # The oldest items by seq, through the primary key; the first due, through the due index.
    oldest = (
        f"SELECT min(g.created_at) FILTER (WHERE {_QUEUED}) AS queued, "
        f"min(g.created_at) FILTER (WHERE {_DEFERRED}) AS deferred, "
        f"min(g.created_at) FILTER (WHERE {_LEASED}) AS delivering, "
        f"min(g.created_at) FILTER (WHERE {_HELD}) AS held FROM ("
        f"SELECT {q('created_at')} AS created_at, {q('attempts')} AS attempts, {leased} AS leased, "
        f"{q('next_attempt_at')} >= {held_literal(store)} AS held "
        f"FROM {items} ORDER BY {q('seq')} LIMIT {OLDEST_READ}) AS g"
    )
    first_due = (
        f"SELECT {q('next_attempt_at')} FROM {items} WHERE {q('next_attempt_at')} <= %s AND NOT {leased} "
        f"ORDER BY {q('next_attempt_at')}, {q('seq')} LIMIT 1"
    )
    return (
        f"SELECT c.*, o.queued, o.deferred, o.delivering, o.held, ({first_due}) AS exact_first_due "
        f"FROM ({counted}) AS c CROSS JOIN ({oldest}) AS o"
    )


def _gauges_from_row(row: Sequence[Any], *, now: datetime, estimate: int | None) -> QueueGauges:
    """Read the statement's row; with the table's ``estimate``, the counts are a sample's."""
    queued, deferred, delivering, *oldest, due, first_due, pending, deferred_recipients, held, oldest_held = row[:12]
    oldest_times = [aware(value) for value in (*oldest, oldest_held)]
    first_due_at = aware(first_due)
    scale: float | None = None
    if estimate is not None:  # sampled: the oldest items' and the due index's exact answers
        exact_oldest = [aware(value) for value in row[12:16]]
        oldest_times = [_earliest(a, b) for a, b in zip(oldest_times, exact_oldest, strict=True)]
        first_due_at = aware(row[16])
        sampled_rows = queued + deferred + delivering + held
        scale = estimate / sampled_rows if sampled_rows else 0.0
    states = (ItemState.QUEUED, ItemState.DEFERRED, ItemState.DELIVERING, ItemState.HELD)
    counts = (queued, deferred, delivering, held)
    return QueueGauges(
        now=now,
        items={state: scaled(int(n), scale) for state, n in zip(states, counts, strict=True)},
        recipients={
            RecipientStatus.PENDING: scaled(int(pending), scale),
            RecipientStatus.DEFERRED: scaled(int(deferred_recipients), scale),
        },
        oldest=dict(zip(states, oldest_times, strict=True)),
        due=scaled(int(due), scale),
        first_due_at=first_due_at,
        exact=estimate is None,
    )


def _earliest(one: datetime | None, other: datetime | None) -> datetime | None:
    return other if one is None else one if other is None else min(one, other)
