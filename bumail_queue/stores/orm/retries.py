"""The ORM store's retries for operators (``queue_retry``, the admin) and its wake-up."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from bumail_queue.items import QueueItem
from bumail_queue.queries import RetryResult
from bumail_queue.stores.base import WorkListener

from . import queries
from .connection import IDS_PER_STATEMENT, ORMConnection, built_once
from .database import (
    WAKE_CHANNEL,
    PostgresListener,
    id_text,
)


class ORMRetries(ORMConnection):
    """Makes waiting items due again, and wakes the idle workers when they are."""

    # -- retrying for operators: queue_retry ------------------------------------------

    def retry_deferred(self, *, now: datetime, domain: str | None = None) -> int:
        """One ``UPDATE`` of the waiting items with a deferred recipient: it reads each
        item not due yet, as no index covers the recipients' JSON. With ``domain``, one
        ``SELECT`` more of the items SQL cannot compare (a non-ASCII address, whose
        domain may be written otherwise than ``domain_spellings``), compared here and
        moved by id."""
        at = self.prep_time(now)
        spellings = () if domain is None else self.domain_spellings(domain)
        update = (
            f"UPDATE {self.quote(self.items_table)} SET {self.quote('next_attempt_at')} = %s "
            f"WHERE {self._waiting_sql()} AND {self._deferred_recipient_sql(self._at_spellings_sql(len(spellings)))}"
        )
        moved = self._move_count(update, [at, at, at, *map(_ends_at_domain, spellings)])
        if domain is not None:
            others = [
                item.id
                for item in self._waiting_at_non_ascii_addresses(at)
                if self.has_deferred_recipient(item, domain)
            ]
            moved += self.retry_items(others, now=now).due
        return moved

    def retry_items(self, item_ids: Sequence[str], *, now: datetime) -> RetryResult:
        """An ``UPDATE`` per 500 ids, on the unique index of ``id``; when some are left,
        one ``SELECT`` to tell those a lease holds from those of no item."""
        given = list(dict.fromkeys(item_ids))
        keys = {item_id: key for item_id in given if (key := self._prep_id(item_id)) is not None}
        by_text = {id_text(key): key for key in keys.values()}  # one per item, however its id is spelled
        due = self._make_due_by_id(list(by_text.values()), self.prep_time(now))
        leased = self._present_ids([key for text, key in by_text.items() if text not in due])
        return RetryResult(
            due=len(due),
            leased=tuple(item_id for item_id, key in keys.items() if id_text(key) in leased),
            missing=tuple(
                item_id for item_id in given if item_id not in keys or id_text(keys[item_id]) not in due | leased
            ),
        )

    def _make_due_by_id(self, keys: builtins.list[Any], at: Any) -> set[str]:
        """Make the items of ``keys`` no lease holds due at ``at``; return their id texts."""
        q = self.quote
        due: set[str] = set()
        for start in range(0, len(keys), IDS_PER_STATEMENT):
            chunk = keys[start : start + IDS_PER_STATEMENT]
            # An item due earlier keeps its time, and its place among the due.
            update = (
                f"UPDATE {q(self.items_table)} SET {q('next_attempt_at')} = "
                f"CASE WHEN {q('next_attempt_at')} > %s THEN %s ELSE {q('next_attempt_at')} END "
                f"WHERE {q('id')} IN ({', '.join(['%s'] * len(chunk))}) "
                f"AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s)"
            )
            due |= self._move_ids(update, [at, at, *chunk, at])
        return due

    @built_once
    def _waiting_sql(self) -> str:
        """Not due yet at the first ``%s``, and free of a lease at the second; not held."""
        q = self.quote
        held = queries.held_literal(cast("queries.ORMTables", self))
        return (
            f"{q('next_attempt_at')} > %s AND {q('next_attempt_at')} < {held} "
            f"AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s)"
        )

    @built_once
    def _deferred_recipient_sql(self, condition: str = "") -> str:
        """The row has a deferred recipient whose ``{address}`` meets ``condition``, if given."""
        recipients = f"{self.quote(self.items_table)}.{self.quote('recipients')}"
        if self.connection.vendor == "postgresql":
            if not condition:  # jsonb containment: no row per recipient
                return f"""{recipients} @> '[{{"status": "deferred"}}]'"""
            each, status, address = (
                f"jsonb_array_elements({recipients}) AS r(value)",
                "r.value->>'status'",
                "(r.value->>'address')",
            )
        else:
            each, status, address = (
                f"json_each({recipients}) AS r",
                "json_extract(r.value, '$.status')",
                "json_extract(r.value, '$.address')",
            )
        where = f"{status} = 'deferred'" + (f" AND ({condition.format(address=address)})" if condition else "")
        return f"EXISTS (SELECT 1 FROM {each} WHERE {where})"

    @built_once
    def _at_spellings_sql(self, spellings: int) -> str:
        """``{address}`` ends at one of ``spellings`` domains, each a ``LIKE`` pattern
        parameter; ASCII case aside (the C collation's on PostgreSQL, whatever the
        database's), so both databases compare alike. Empty for none."""
        lowered = 'lower({address} COLLATE "C")' if self.connection.vendor == "postgresql" else "lower({address})"
        return " OR ".join([f"{lowered} LIKE %s ESCAPE '\\'"] * spellings)

    def _waiting_at_non_ascii_addresses(self, at: Any) -> builtins.list[QueueItem]:
        """The waiting items with a deferred recipient whose address is not ASCII."""
        if self.connection.vendor == "postgresql":
            non_ascii = "octet_length({address}) <> char_length({address})"
        else:
            non_ascii = "length(CAST({address} AS BLOB)) <> length({address})"
        sql = (
            f"SELECT {self._select_list()} FROM {self.quote(self.items_table)} "
            f"WHERE {self._waiting_sql()} AND {self._deferred_recipient_sql(non_ascii)}"
        )
        with self.translated_errors(), self.connection.cursor() as cursor:
            cursor.execute(sql, [at, at])
            return [self._row_to_item(row) for row in cursor.fetchall()]

    def _present_ids(self, keys: builtins.list[Any]) -> set[str]:
        """Which of ``keys`` (prepared ids) are items in the queue, as id texts."""
        found: set[str] = set()
        q = self.quote
        with self.translated_errors(), self.connection.cursor() as cursor:
            for start in range(0, len(keys), IDS_PER_STATEMENT):
                chunk = keys[start : start + IDS_PER_STATEMENT]
                placeholders = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"SELECT {q('id')} FROM {q(self.items_table)} WHERE {q('id')} IN ({placeholders})", chunk
                )
                found.update(id_text(row[0]) for row in cursor.fetchall())
        return found

    def _waking(self, update: str, result: str) -> str:
        """``update`` as one PostgreSQL statement that returns ``result`` over the rows it
        changed (no row when none changed) and, when any changed, sends one NOTIFY,
        which wakes idle workers on commit."""
        return (
            f"WITH moved AS ({update} RETURNING {self.quote('id')}) "
            f"SELECT {result}, pg_notify('{WAKE_CHANNEL}', '') FROM moved HAVING count(*) > 0"
        )

    def _move_count(self, update: str, params: Sequence[Any]) -> int:
        """Run ``update``, waking idle workers; return how many rows it changed."""
        postgres = self.connection.vendor == "postgresql"
        with self._writing(single_statement=True) as cursor:
            cursor.execute(self._waking(update, "count(*)") if postgres else update, params)
            if not postgres:
                return int(cursor.rowcount)
            row = cursor.fetchone()
        return 0 if row is None else int(row[0])

    def _move_ids(self, update: str, params: Sequence[Any]) -> set[str]:
        """Run ``update``, waking idle workers; return the ids of the rows it changed."""
        q = self.quote
        with self._writing(single_statement=True) as cursor:
            if self.connection.vendor == "postgresql":
                cursor.execute(self._waking(update, f"array_agg({q('id')})"), params)
                row = cursor.fetchone()
                values = [] if row is None else row[0]
            else:
                cursor.execute(f"{update} RETURNING {q('id')}", params)
                values = [row[0] for row in cursor.fetchall()]
        return {id_text(value) for value in values}

    def listener(self) -> WorkListener | None:
        """On PostgreSQL, a ``LISTEN`` on its own connection: idle workers wake on enqueue."""
        if self.connection.vendor != "postgresql":
            return None
        return PostgresListener(self.alias)


def _ends_at_domain(domain: str) -> str:
    """The ``LIKE`` pattern of an address at ``domain``: the text after its last ``@``
    is the domain, since a domain holds no ``@``."""
    return f"%@{queries.escape_like(domain)}"
