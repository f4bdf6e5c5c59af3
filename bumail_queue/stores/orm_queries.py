"""The ORM store's answers to the operator's questions (``search``, ``summary``...).

Kept apart from the claim and record paths of ``orm.py``: nothing here writes, and
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

from bumail_queue.items import QueueItem
from bumail_queue.models import Item
from bumail_queue.queries import (
    SEARCH_HEAD_BYTES,
    ItemQuery,
    ItemState,
    QueueSummary,
    lane_counts,
    lane_order,
    shape_from_counts,
)

from .orm_claims import lanes_sql


class ORMTables(Protocol):
    """What these answers need of the ORM store: its tables, its connection, its quoting."""

    alias: str
    items_table: str
    messages_table: str

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


def _state_filter(state: ItemState, now: datetime) -> Q:
    if state == ItemState.DELIVERING:
        return _leased(now)
    tried = Q(attempts__gt=0) if state == ItemState.DEFERRED else Q(attempts=0)
    return ~_leased(now) & tried


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


def _filter(store: ORMTables, query: ItemQuery) -> Q:
    where = Q()
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
    rows = Item.objects.using(store.alias).filter(_filter(store, query)).order_by("next_attempt_at", "seq")
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
            deferred=Count("seq", filter=~leased & Q(attempts__gt=0)),
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
        ItemState.QUEUED: counts["total"] - counts["delivering"] - counts["deferred"],
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
