"""The ORM store's bulk actions for operators: a filter's items a page at a time, and
a batch held or released in one statement (``queue_hold``, ``queue_release``).

A page is bounded by ``seq``, the primary key, which no write changes: one index-only
probe finds where the page ends, one statement reads the matching rows within it. A
hold moves ``next_attempt_at`` to ``HELD_AT``, out of every claim's range, so the
claims' index scans never meet a held row and need no condition of their own; a
release moves it back to now. Each is one ``UPDATE`` per ``IDS_PER_STATEMENT`` ids on
the unique index of ``id``, a short lock on those rows only.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from bumail_queue.models import Item
from bumail_queue.queries import HELD_AT, BulkPage, HoldResult, ItemQuery

from . import queries
from .connection import IDS_PER_STATEMENT
from .database import id_text
from .retries import ORMRetries


class ORMBulk(ORMRetries):
    """Pages through a filter's items, holds and releases batches of them."""

    def bulk_page(self, query: ItemQuery, *, cursor: str | None = None, limit: int = 1000) -> BulkPage:
        """Two statements: where the page of ``limit`` rows after ``cursor`` (a ``seq``)
        ends, through the primary key, and the rows of it the filter matches."""
        after = 0 if cursor is None else int(cursor)
        rows = Item.objects.using(self.alias)
        with self.translated_errors():
            # The page's last seq, and whether one follows it: two rows of the index at most.
            bounds = list(
                rows.filter(seq__gt=after).order_by("seq").values_list("seq", flat=True)[limit - 1 : limit + 1]
            )
            last = bounds[0] if bounds else None
            page = rows.filter(queries.item_filter(cast("queries.ORMTables", self), query), seq__gt=after)
            if last is not None:
                page = page.filter(seq__lte=last)
            found = [row.to_queue_item() for row in page.order_by("seq")]
        # A pattern's SQL is loose where JSON escapes an address: ``matches_addresses`` decides.
        items = tuple(item for item in found if query.matches_addresses(item))
        return BulkPage(items=items, cursor=str(last) if len(bounds) == 2 else None)

    def hold(self, item_ids: Sequence[str], *, now: datetime) -> HoldResult:
        """An ``UPDATE`` per ``IDS_PER_STATEMENT`` ids; when some are left, one ``SELECT``
        to tell those a lease holds from the others."""
        keys = self._keys(item_ids)
        at = self.prep_time(now)
        q = self.quote
        changed: set[str] = set()
        for chunk in _chunks(builtins.list(keys.values())):
            update = (
                f"UPDATE {q(self.items_table)} SET {q('next_attempt_at')} = %s, "
                f"{q('lease_owner')} = NULL, {q('lease_expires_at')} = NULL "
                f"WHERE {q('id')} IN ({', '.join(['%s'] * len(chunk))}) AND {q('next_attempt_at')} < %s "
                f"AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s) RETURNING {q('id')}"
            )
            held_at = self.prep_time(HELD_AT)
            changed |= self._returned_ids(update, [held_at, *chunk, held_at, at])
        left = [key for key in keys.values() if id_text(key) not in changed]
        leased = self._leased_ids(left, at) if left else set()
        return _result(item_ids, keys, changed, leased)

    def release(self, item_ids: Sequence[str], *, now: datetime) -> HoldResult:
        """An ``UPDATE`` per ``IDS_PER_STATEMENT`` ids, waking idle workers (PostgreSQL's
        ``NOTIFY``) when one was released."""
        keys = self._keys(item_ids)
        q = self.quote
        changed: set[str] = set()
        for chunk in _chunks(builtins.list(keys.values())):
            update = (
                f"UPDATE {q(self.items_table)} SET {q('next_attempt_at')} = %s "
                f"WHERE {q('id')} IN ({', '.join(['%s'] * len(chunk))}) AND {q('next_attempt_at')} >= %s"
            )
            changed |= self._move_ids(update, [self.prep_time(now), *chunk, self.prep_time(HELD_AT)])
        return _result(item_ids, keys, changed, set())

    def _keys(self, item_ids: Sequence[str]) -> dict[str, Any]:
        """The prepared key of each id given that could be an item's, once per item."""
        keys: dict[str, Any] = {}
        seen: set[str] = set()
        for item_id in dict.fromkeys(item_ids):
            key = self._prep_id(item_id)
            if key is not None and id_text(key) not in seen:
                seen.add(id_text(key))
                keys[item_id] = key
        return keys

    def _returned_ids(self, update: str, params: Sequence[Any]) -> set[str]:
        with self._writing(single_statement=True) as cursor:
            cursor.execute(update, params)
            return {id_text(row[0]) for row in cursor.fetchall()}

    def _leased_ids(self, keys: builtins.list[Any], at: Any) -> set[str]:
        q = self.quote
        found: set[str] = set()
        with self.translated_errors(), self.connection.cursor() as cursor:
            for chunk in _chunks(keys):
                cursor.execute(
                    f"SELECT {q('id')} FROM {q(self.items_table)} WHERE {q('id')} IN ({', '.join(['%s'] * len(chunk))}) "
                    f"AND {q('lease_owner')} IS NOT NULL AND {q('lease_expires_at')} > %s",
                    [*chunk, at],
                )
                found.update(id_text(row[0]) for row in cursor.fetchall())
        return found


def _chunks(keys: builtins.list[Any]) -> builtins.list[builtins.list[Any]]:
    return [keys[start : start + IDS_PER_STATEMENT] for start in range(0, len(keys), IDS_PER_STATEMENT)]


def _result(item_ids: Sequence[str], keys: dict[str, Any], changed: set[str], leased: set[str]) -> HoldResult:
    """The ids as given, each where its item ended up."""
    given = builtins.list(dict.fromkeys(item_ids))
    text = {item_id: id_text(key) for item_id, key in keys.items()}
    return HoldResult(
        changed=tuple(item_id for item_id in given if text.get(item_id) in changed),
        leased=tuple(item_id for item_id in given if text.get(item_id) in leased),
        unchanged=tuple(item_id for item_id in given if text.get(item_id) not in changed | leased),
    )
