"""The ORM store's leases and outcomes: claims, by lanes or by id, renewals, completions."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from bumail_queue.errors import QueueError
from bumail_queue.items import AttemptResult, QueueItem
from bumail_queue.stores.base import COMPLETE_TRIES

from . import claim_sql
from .connection import IDS_PER_STATEMENT, ORMConnection, built_once
from .database import (
    WAKE_CHANNEL,
    id_text,
)

# How often a SQLite claim that lost every item it read to another process reads again.
_CLAIM_RACES = 50


class ORMClaims(ORMConnection):
    """Leases due items to a worker and records what its attempts found."""

    # -- leases and outcomes ----------------------------------------------------------

    def claim(self, *, owner: str, now: datetime, lease_until: datetime, limit: int = 1) -> builtins.list[QueueItem]:
        """Lease the due items of every lane, channels in turn (``claim_sql``)."""
        self.validate_owner(owner)
        if limit < 1:
            return []
        until, at = self.prep_time(lease_until), self.prep_time(now)
        connection = self.connection
        if connection.vendor == "postgresql":
            rows = self._claim_skip_locked(owner, until, at, limit)
        elif not connection.in_atomic_block and connection.get_autocommit():
            rows = self._claim_write_locked(owner, until, at, limit)
        else:
            rows = self._claim_compare_and_set(owner, until, at, limit)
        return [self._row_to_item(row) for row in rows]

    @built_once
    def _lease_sql(self) -> str:
        # The lease doubles as the retry time: a leased item's next_attempt_at is its
        # lease's expiry, so it leaves the front of its lane (a backlog of leases
        # never slows a claim) and falls due by itself if its worker dies.
        q = self.quote
        return (
            f"UPDATE {self.quote(self.items_table)} SET {q('lease_owner')} = %s, {q('lease_expires_at')} = %s, "
            f"{q('next_attempt_at')} = %s"
        )

    @built_once
    def _count_sql(self) -> str:
        return claim_sql.postgres_count_sql(self.quote, self.items_table)

    @built_once
    def _skip_locked_claim_sql(self) -> str:
        return claim_sql.postgres_claim_sql(
            self.quote, self.items_table, self._lease_sql(), self._select_list(self.quote(self.items_table))
        )

    def _claim_skip_locked(self, owner: str, until: Any, at: Any, limit: int) -> builtins.list[Any]:
        # Two statements: how many items each lane has due (as far as a claim could
        # take), then each lane's share (items.fair_shares) locked as it is read,
        # skipping rows another claimer holds, so no worker waits on another's items,
        # ordered and leased. An idle queue costs the first alone.
        with self.translated_errors(), self.connection.cursor() as cursor:
            cursor.execute(self._count_sql(), [at, at, limit, at, at])
            counted = cursor.fetchall()
        if not counted:
            return []
        after = self._last_channel
        channels, priorities, shares = (
            list(column) for column in zip(*claim_sql.shares_of(counted, limit, after), strict=True)
        )
        with self._writing(single_statement=True) as cursor:
            cursor.execute(
                self._skip_locked_claim_sql(), [channels, priorities, shares, at, at, limit, after, owner, until, until]
            )
            rows = cursor.fetchall()
        rows.sort(key=lambda row: row[:4])
        if rows:
            self._last_channel = rows[-1][3]
        return [row[4:] for row in rows]

    def _claim_write_locked(self, owner: str, until: Any, at: Any, limit: int) -> builtins.list[Any]:
        # SQLite has no row locks, but one writer at a time: a transaction begun
        # IMMEDIATE holds the write lock from its start, so the due items it reads are
        # still due and free when it leases them, and no claimer ever loses a race.
        connection = self.connection
        with self.translated_errors():
            connection.ensure_connection()
            with connection.cursor() as cursor:
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    due = claim_sql.sqlite_fronts(cursor, self.quote, self.items_table, at, limit, self._last_channel)
                    rows = self._lease_due(cursor, due, owner, until, at) if due else []
                except BaseException:
                    cursor.execute("ROLLBACK")
                    raise
                cursor.execute("COMMIT")
        return rows

    def _lease_due(self, cursor: Any, due: dict[Any, Any], owner: str, until: Any, at: Any) -> builtins.list[Any]:
        """Lease those of ``due`` (``seq`` to due time and channel) still due and free; their
        rows, in ``due``'s order. The round-robin moves on to the last one's channel."""
        q = self.quote
        sql = (
            f"{self._lease_sql()} WHERE {q('seq')} IN ({', '.join(['%s'] * len(due))}) "
            f"AND {q('next_attempt_at')} <= %s AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s) "
            f"RETURNING {q('seq')}, {self._select_list()}"
        )
        cursor.execute(sql, [owner, until, until, *due, at, at])
        leased = {row[0]: row[1:] for row in cursor.fetchall()}
        taken = [seq for seq in due if seq in leased]
        if taken:
            self._last_channel = due[taken[-1]][1]
        return [leased[seq] for seq in taken]

    def _claim_compare_and_set(self, owner: str, until: Any, at: Any, limit: int) -> builtins.list[Any]:
        # Inside the caller's transaction (a test's, a deliver_due() in a view) the
        # claim cannot begin its own: read the due items, then lease only those still
        # due and free. The UPDATE runs under SQLite's write lock, so of two processes
        # that read the same items, the second finds them leased and takes none of
        # them; it then reads again, so a lost race never reads as an empty queue.
        for _ in range(_CLAIM_RACES):
            with self.translated_errors(), self.connection.cursor() as cursor:
                due = claim_sql.sqlite_fronts(cursor, self.quote, self.items_table, at, limit, self._last_channel)
            if not due:
                return []
            with self._writing(single_statement=True) as cursor:
                rows = self._lease_due(cursor, due, owner, until, at)
            if rows:
                return rows
        return []

    def claim_items(
        self, item_ids: Sequence[str], *, owner: str, now: datetime, lease_until: datetime
    ) -> builtins.list[QueueItem]:
        """One ``UPDATE`` per 500 ids, on the unique index of ``id``: it leases the rows
        still due and free when it reaches them (PostgreSQL re-reads a row another
        claimer changed meanwhile; SQLite runs it under its write lock)."""
        self.validate_owner(owner)
        prepared = (self._prep_id(item_id) for item_id in item_ids)
        keys = builtins.list({id_text(key): key for key in prepared if key is not None}.values())
        until, at = self.prep_time(lease_until), self.prep_time(now)
        rows: builtins.list[Any] = []
        for start in range(0, len(keys), IDS_PER_STATEMENT):
            chunk = keys[start : start + IDS_PER_STATEMENT]
            with self._writing(single_statement=True) as cursor:
                cursor.execute(self._claim_items_sql(len(chunk)), [owner, until, until, *chunk, at, at])
                rows.extend(cursor.fetchall())
        rows.sort(key=lambda row: row[0])
        return [self._row_to_item(row[1:]) for row in rows]

    @built_once
    def _claim_items_sql(self, ids: int) -> str:
        q = self.quote
        return (
            f"{self._lease_sql()} WHERE {q('id')} IN ({', '.join(['%s'] * ids)}) "
            f"AND {q('next_attempt_at')} <= %s AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s) "
            f"RETURNING {q('seq')}, {self._select_list()}"
        )

    def renew(self, item_id: str, *, owner: str, lease_until: datetime) -> bool:
        self.validate_owner(owner)
        key = self._prep_id(item_id)
        if key is None:
            return False
        q, until = self.quote, self.prep_time(lease_until)
        sql = (
            f"UPDATE {self.quote(self.items_table)} SET {q('lease_expires_at')} = %s, {q('next_attempt_at')} = %s "
            f"WHERE {q('id')} = %s AND {q('lease_owner')} = %s"
        )
        with self._writing(single_statement=True) as cursor:
            cursor.execute(sql, [until, until, key, owner])
            return bool(cursor.rowcount == 1)

    def _read_for_complete(self, key: Any) -> tuple[QueueItem, int] | None:
        return next(iter(self._read_many_for_complete([key]).values()), None)

    def complete(self, item_id: str, *, owner: str, result: AttemptResult) -> QueueItem | None:
        self.validate_owner(owner)
        self.validate_result(result)
        key = self._prep_id(item_id)
        if key is None:
            return None
        for _ in range(COMPLETE_TRIES):
            read = self._read_for_complete(key)
            if read is None:
                return None
            item, rev = read
            if item.lease_owner != owner:
                break
            recorded = result.recorded_on(item)
            # Only the owner, and only over the state it read: a write in between
            # (a renewal is none, it leaves rev alone) makes it read again.
            if self._write_outcome(key, owner, rev, recorded):
                return recorded
        raise self.lease_lost(item_id, owner)

    def complete_many(
        self, results: Sequence[tuple[str, AttemptResult]], *, owner: str
    ) -> builtins.list[QueueItem | QueueError | None]:
        """Record a batch: one read, then one transaction and one commit for all of it.

        The commit (an fsync) is what a completion costs; a worker that records what
        its sessions finished together pays it once for all of them. The finished
        items leave in one statement.
        """
        self.validate_owner(owner)
        for _, result in results:
            self.validate_result(result)
        keys = {item_id: self._prep_id(item_id) for item_id, _ in results}
        done: dict[str, QueueItem | QueueError | None] = {}
        contested: builtins.list[tuple[str, AttemptResult]] = []
        # Read before the transaction: on SQLite a transaction that reads, then writes,
        # deadlocks with another writer at once instead of waiting. The rev guards
        # every write against what changed since.
        held = self._read_many_for_complete([key for key in keys.values() if key is not None])
        finished: dict[str, tuple[QueueItem, int]] = {}
        unfinished: builtins.list[tuple[str, QueueItem, int]] = []
        for item_id, result in results:
            read = held.get(item_id) if keys[item_id] is not None else None
            if read is None:
                done[item_id] = None
                continue
            item, rev = read
            if item.lease_owner != owner:
                done[item_id] = self.lease_lost(item_id, owner)
                continue
            recorded = result.recorded_on(item)
            if recorded.is_finished:
                finished[item_id] = (recorded, rev)
            else:
                unfinished.append((item_id, recorded, rev))
        result_of = dict(results)
        # A batch whose items all finished is one DELETE: no transaction of its own.
        with self._writing() if unfinished else nullcontext():
            for item_id, recorded, rev in unfinished:
                if self._write_outcome(keys[item_id], owner, rev, recorded):
                    done[item_id] = recorded
                else:
                    contested.append((item_id, result_of[item_id]))
            dropped = self._drop_finished(owner, [(keys[item_id], rev) for item_id, (_, rev) in finished.items()])
        for item_id, (recorded, _) in finished.items():
            if item_id in dropped:
                done[item_id] = recorded
            else:
                contested.append((item_id, result_of[item_id]))
        # Changed between the read and the write: each goes the single way, which reads again.
        done.update(
            zip((item_id for item_id, _ in contested), super().complete_many(contested, owner=owner), strict=True)
        )
        return [done[item_id] for item_id, _ in results]

    def _drop_finished(self, owner: str, held: builtins.list[tuple[Any, int]]) -> set[str]:
        """Drop the items still as read (owner and rev) with their messages; return their ids."""
        if not held:
            return set()
        q, items, messages = self.quote, self.quote(self.items_table), self.quote(self.messages_table)
        pairs = ", ".join(["(%s, %s)"] * len(held))
        params = [value for pair in held for value in pair]
        delete = (
            f"DELETE FROM {items} WHERE {q('lease_owner')} = %s AND ({q('id')}, {q('rev')}) IN (VALUES {pairs}) "
            f"RETURNING {q('id')}"
        )
        postgres = self.connection.vendor == "postgresql"
        with self._writing(single_statement=postgres) as cursor:
            if postgres:
                cursor.execute(
                    f"WITH gone AS ({delete}), gone_message AS (DELETE FROM {messages} "
                    f"WHERE {q('item_id')} IN (SELECT {q('id')} FROM gone)) SELECT {q('id')} FROM gone",
                    [owner, *params],
                )
                gone = [row[0] for row in cursor.fetchall()]
            else:
                cursor.execute(delete, [owner, *params])
                gone = [row[0] for row in cursor.fetchall()]
                if gone:
                    cursor.execute(
                        f"DELETE FROM {messages} WHERE {q('item_id')} IN ({', '.join(['%s'] * len(gone))})", gone
                    )
        return {id_text(value) for value in gone}

    def _read_many_for_complete(self, keys: builtins.list[Any]) -> dict[str, tuple[QueueItem, int]]:
        if not keys:
            return {}
        sql = (
            f"SELECT {self._select_list()}, {self.quote('rev')} FROM {self.quote(self.items_table)} "
            f"WHERE {self.quote('id')} IN ({', '.join(['%s'] * len(keys))})"
        )
        with self.translated_errors(), self.connection.cursor() as cursor:
            cursor.execute(sql, keys)
            rows = cursor.fetchall()
        items = ((self._row_to_item(row[:-1]), row[-1]) for row in rows)
        return {item.id: (item, rev) for item, rev in items}

    def _write_outcome(self, key: Any, owner: str, rev: int, item: QueueItem) -> bool:
        q, items = self.quote, self.quote(self.items_table)
        guard = f"WHERE {q('id')} = %s AND {q('lease_owner')} = %s AND {q('rev')} = %s"
        if item.is_finished and self.connection.vendor == "postgresql":
            # The item and its message in one statement: one round trip, atomic by itself.
            sql = (
                f"WITH gone AS (DELETE FROM {items} {guard} RETURNING {q('id')}), "
                f"gone_message AS (DELETE FROM {self.quote(self.messages_table)} "
                f"WHERE {q('item_id')} IN (SELECT {q('id')} FROM gone)) SELECT 1 FROM gone"
            )
            with self._writing(single_statement=True) as cursor:
                cursor.execute(sql, [key, owner, rev])
                return cursor.fetchone() is not None
        if item.is_finished:
            with self._writing() as cursor:
                cursor.execute(f"DELETE FROM {items} {guard}", [key, owner, rev])
                if cursor.rowcount != 1:
                    return False
                cursor.execute(f"DELETE FROM {self.quote(self.messages_table)} WHERE {q('item_id')} = %s", [key])
                return True
        sql = (
            f"UPDATE {items} SET {q('recipients')} = %s, {q('next_attempt_at')} = %s, {q('attempts')} = %s, "
            f"{q('delay_notified')} = %s, {q('lease_owner')} = NULL, {q('lease_expires_at')} = NULL, "
            f"{q('rev')} = {q('rev')} + 1 {guard}"
        )
        params = [
            self._prep("recipients", [r.to_dict() for r in item.recipients]),
            self.prep_time(item.next_attempt_at),
            item.attempts,
            self._prep("delay_notified", item.delay_notified),
            key,
            owner,
            rev,
        ]
        with self._writing(single_statement=True) as cursor:
            cursor.execute(sql, params)
            return bool(cursor.rowcount == 1)

    def reschedule(self, item_id: str, *, at: datetime, owner: str | None = None) -> bool:
        if owner is not None:
            self.validate_owner(owner)
        key = self._prep_id(item_id)
        if key is None:
            return False
        q, when = self.quote, self.prep_time(at)
        if owner is None:
            sql = f"UPDATE {self.quote(self.items_table)} SET {q('next_attempt_at')} = %s WHERE {q('id')} = %s"
            params = [when, key]
        else:
            sql = (
                f"UPDATE {self.quote(self.items_table)} SET {q('next_attempt_at')} = %s, {q('lease_owner')} = NULL, "
                f"{q('lease_expires_at')} = NULL WHERE {q('id')} = %s AND {q('lease_owner')} = %s"
            )
            params = [when, key, owner]
        if self.connection.vendor == "postgresql":
            # An item made due (retry now, given back) wakes idle workers on commit.
            sql = f"WITH moved AS ({sql} RETURNING 1) SELECT pg_notify('{WAKE_CHANNEL}', '') FROM moved"
        with self._writing(single_statement=True) as cursor:
            cursor.execute(sql, params)
            return bool(cursor.rowcount == 1)
