"""The ORM store: the queue in the project's own database (SQLite or PostgreSQL).

Reads go through the ORM. Writes that must be one step (a claim, an outcome, a
cancel) are single SQL statements with ``RETURNING``, so each is one round trip:

- a claim on PostgreSQL picks the earliest due items with ``FOR UPDATE SKIP LOCKED``
  and leases them in the same ``UPDATE``: no worker waits on another's rows;
- on SQLite the same ``UPDATE`` is a compare-and-set under SQLite's write lock, and
  re-checks that the lease is free, so two processes on one file never share an item;
- writes run at READ COMMITTED whatever the connection's default, since ``SKIP
  LOCKED`` and the ``MAX_ITEMS`` lock need that level;
- an enqueue joins the caller's transaction: a view that rolls back queues nothing.

One class holds every write because they share its plumbing (quoting, the drivers'
values, the statement cache, the error translation); the operators' reads are in
``orm_queries``, the database's particulars in ``orm_database``.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import date, datetime, timedelta
from typing import Any

from django.core import checks
from django.db import InterfaceError, OperationalError, ProgrammingError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from bumail_queue.conf import QueueSettings
from bumail_queue.errors import ErrorCode, QueueError, first_line
from bumail_queue.estimates import planner_estimate
from bumail_queue.items import AttemptResult, NewItem, QueueItem, pending_recipients_json
from bumail_queue.models import Item, Message, MTASTSPolicy, TLSReportCount, item_from_row
from bumail_queue.queries import AGE_BUCKETS, ItemCount, ItemQuery, QueueGauges, QueueSummary, RetryResult
from bumail_queue.shaping import DestinationState, Permit, PermitRequest, WindowChange
from bumail_queue.sts import STSMode, STSPolicy, TLSResult, TLSSessionCount
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionUpdate

from . import orm_claims, orm_queries, orm_suppressions
from .base import COMPLETE_TRIES, MESSAGE_HEAD_BYTES, QueueStore, WorkListener
from .orm_database import (
    ADD_FUNCTION,
    INSERT_COLUMNS,
    ITEM_COLUMNS,
    WAKE_CHANNEL,
    PostgresListener,
    aware,
    binding_cursor,
    check_database,
    connection_facts,
    default_is_read_committed,
    id_text,
    prep_value,
)
from .orm_shaping import ORMShaping

# Serialises adds that count against MAX_ITEMS across every process (pg_advisory_xact_lock).
_MAX_ITEMS_LOCK = 0x62756D61696C  # "bumail"
# How often an add retries when the item holding its key leaves meanwhile.
_KEY_RACES = 3
# What a database that cannot be used raises (STORE_UNAVAILABLE): no connection, a lost
# one, SQLite locked beyond its timeout; a missing table is a ProgrammingError on
# PostgreSQL, an OperationalError on SQLite.
_UNAVAILABLE_ERRORS = (OperationalError, InterfaceError, ProgrammingError)
# How often a SQLite claim that lost every item it read to another process reads again.
_CLAIM_RACES = 50
# The columns every new item starts with the same value in: the batch add writes them
# in its statement rather than send a list of them.
_STARTING_VALUES = {"attempts": "0", "delay_notified": "false", "rev": "0"}
# The PostgreSQL type of each column the batch add sends a list of.
_ARRAY_TYPES = {
    "id": "uuid", "key": "varchar", "sender": "text", "recipients": "jsonb", "size": "bigint",
    "created_at": "timestamptz", "next_attempt_at": "timestamptz", "priority": "smallint", "channel": "varchar",
}  # fmt: skip
# Ids per statement of a retry by id: well within SQLite's bound parameters.
_IDS_PER_STATEMENT = 500
# TLS report counts per upsert: nine parameters each, well within SQLite's bound parameters.
_COUNTS_PER_STATEMENT = 100
_TLS_COUNT_COLUMNS = ("day", "domain", "policy_id", "policy", "result", "mx_host", "address", "reason", "count")
_TLS_KIND_COLUMNS = ("day", "domain", "policy_id", "result", "mx_host", "address")


def _built_once(method: Callable[..., str]) -> Callable[..., str]:
    """Build a statement's text once per store: it depends only on the database's vendor."""

    @functools.wraps(method)
    def build(self: ORMStore, *args: Any) -> str:
        key = (method.__name__, args)
        sql = self._statements.get(key)
        if sql is None:
            sql = self._statements[key] = method(self, *args)
        return sql

    return build


class ORMStore(QueueStore):
    """Keeps the queue in ``bumail_queue_items`` / ``bumail_queue_messages`` of ``DATABASE``."""

    supports_transactional_enqueue = True
    counts_are_estimates = True
    claims_by_id = True
    supports_shaping = True

    def __init__(self, settings: QueueSettings) -> None:
        super().__init__(settings)
        self.alias: str = settings.database
        self.items_table = Item._meta.db_table
        self.messages_table = Message._meta.db_table
        self._statements: dict[tuple[str, tuple[Any, ...]], str] = {}
        # The channel this store's last claim ended with: where its round-robin stands.
        self._last_channel = ""
        self._shaping = ORMShaping(self)

    # -- plumbing ---------------------------------------------------------------------

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    @_built_once
    def quote(self, name: str) -> str:
        """Return ``name`` quoted as this database quotes identifiers."""
        return self.connection.ops.quote_name(name)

    def _prep(self, column: str, value: Any) -> Any:
        return prep_value(column, value, self.connection)

    def _prep_id(self, item_id: str) -> Any | None:
        """Return the id as the database keeps it, or ``None`` for an id no item has."""
        if not self.is_known_id(item_id):
            return None
        try:
            parsed = uuid.UUID(item_id)
        except (ValueError, TypeError, AttributeError):
            return None
        return self._prep("id", parsed)

    def prep_time(self, value: datetime) -> Any:
        """Return a time as this database's driver takes it in a raw statement."""
        return self.connection.ops.adapt_datetimefield_value(value)

    @_built_once
    def _select_list(self, alias: str = "") -> str:
        prefix = f"{alias}." if alias else ""
        return ", ".join(prefix + self.quote(c) for c in ITEM_COLUMNS)

    def _row_to_item(self, row: Sequence[Any]) -> QueueItem:
        values = dict(zip(ITEM_COLUMNS, row, strict=False))
        # Raw rows skip the ORM's converters; SQLite gives text, psycopg gives objects.
        if isinstance(values["id"], str):
            values["id"] = uuid.UUID(values["id"])
        if isinstance(values["recipients"], str | bytes):
            values["recipients"] = json.loads(values["recipients"])
        for column in ("created_at", "next_attempt_at", "lease_expires_at"):
            values[column] = aware(values[column])
        return item_from_row(values)

    @contextmanager
    def translated_errors(self) -> Iterator[None]:
        """Turn a database that cannot be used into ``QueueError(STORE_UNAVAILABLE)``."""
        try:
            yield
        except _UNAVAILABLE_ERRORS as error:
            raise self._unavailable(error) from error

    def _unavailable(self, error: Exception) -> QueueError:
        return QueueError(
            ErrorCode.STORE_UNAVAILABLE,
            f"The queue's database {self.alias!r} could not be used (has manage.py migrate run?): {first_line(error)}",
        )

    @contextmanager
    def _writing(self, *, single_statement: bool = False, binding: bool = False) -> Iterator[Any]:
        """Yield a cursor for a write, in a transaction at READ COMMITTED.

        Inside the caller's transaction the write joins it (under a savepoint when it
        takes several statements, so a refused add leaves the caller's work alone). A
        single statement outside one needs no transaction of its own when the
        connection already defaults to READ COMMITTED: one round trip, not four.
        With ``binding``, the cursor sends the parameters apart from the SQL
        (``orm_database.binding_cursor``): for the statements that carry messages.
        """
        # Errors are translated here rather than by translated_errors() around it: one
        # generator rather than two nested, for a path most writes take.
        connection = self.connection
        try:
            if single_statement and not _needs_own_transaction(connection):
                with self._cursor(connection, binding=binding) as cursor:
                    yield cursor
            elif connection.in_atomic_block:
                with transaction.atomic(using=self.alias), self._cursor(connection, binding=binding) as cursor:
                    yield cursor
            else:
                with transaction.atomic(using=self.alias), self._cursor(connection, binding=binding) as cursor:
                    if connection.vendor == "postgresql":
                        cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE")
                    yield cursor
        except _UNAVAILABLE_ERRORS as error:
            raise self._unavailable(error) from error

    @staticmethod
    def _cursor(connection: BaseDatabaseWrapper, *, binding: bool) -> Any:
        return binding_cursor(connection) if binding else connection.cursor()

    def writing(self, *, single_statement: bool = False) -> AbstractContextManager[Any]:
        """Yield a cursor for a write: one transaction at READ COMMITTED, or for a single
        statement none of its own where the connection's default allows (``_writing``)."""
        return self._writing(single_statement=single_statement)

    # -- adding -----------------------------------------------------------------------

    def _insert_values(self, new: NewItem) -> builtins.list[Any]:
        # In INSERT_COLUMNS' order. Only the columns whose form differs between the
        # databases go through their field (a hot path: one call per enqueued message).
        recipients = [recipient.to_dict() for recipient in new.pending_recipients]
        return [
            self._prep("id", uuid.UUID(new.id)),
            new.key,
            new.sender,
            self._prep("recipients", recipients),
            new.size,
            self.prep_time(new.created_at),
            self.prep_time(new.next_attempt_at),
            0,
            False,
            new.priority,
            new.channel,
            0,
        ]

    @_built_once
    def _insert_sql(self, rows: int) -> str:
        row = "(" + ", ".join(["%s"] * len(INSERT_COLUMNS)) + ")"
        return (
            f"INSERT INTO {self.quote(self.items_table)} ({', '.join(map(self.quote, INSERT_COLUMNS))}) "
            f"VALUES {', '.join([row] * rows)} "
            f"ON CONFLICT ({self.quote('key')}) WHERE {self.quote('key')} IS NOT NULL DO NOTHING RETURNING {self.quote('id')}"
        )

    def add_many(self, items: Sequence[NewItem], *, max_items: int | None = None) -> builtins.list[QueueItem]:
        """On PostgreSQL without ``MAX_ITEMS``, one statement whatever the number of
        items; otherwise a transaction (``MAX_ITEMS`` counts the queue under a lock)."""
        if not items:
            return []
        for new in items:
            self.validate_new(new)
        connection = self.connection
        if max_items is None and connection.vendor == "postgresql":
            # Translated here, not by a context manager: the path of every send_mail().
            try:
                if len(items) == 1:
                    return [self._add_one_statement(items[0], connection)]
                return self._add_batch_statement(items)
            except _UNAVAILABLE_ERRORS as error:
                raise self._unavailable(error) from error
        return self._add_in_transaction(items, max_items)

    @_built_once
    def _add_batch_sql(self) -> str:
        # A column of values per parameter (unnest), so that the statement's text is
        # the same for any number of items; the constant columns are written here.
        q, items, messages = self.quote, self.quote(self.items_table), self.quote(self.messages_table)
        given = [c for c in INSERT_COLUMNS if c not in _STARTING_VALUES]
        arrays = ", ".join(f"%s::{_ARRAY_TYPES[column]}[]" for column in given)
        values = ", ".join(_STARTING_VALUES.get(column, f"new.{q(column)}") for column in INSERT_COLUMNS)
        return (
            f"WITH new_items AS (INSERT INTO {items} ({', '.join(map(q, INSERT_COLUMNS))}) "
            f"SELECT {values} FROM unnest({arrays}) AS new({', '.join(map(q, given))}) "
            f"ON CONFLICT ({q('key')}) WHERE {q('key')} IS NOT NULL DO NOTHING RETURNING {q('id')}), "
            f"new_messages AS (INSERT INTO {messages} ({q('item_id')}, {q('data')}) "
            f"SELECT given.{q('id')}, given.{q('data')} FROM unnest(%s::uuid[], %s::bytea[]) "
            f"AS given({q('id')}, {q('data')}) JOIN new_items USING ({q('id')})) "
            # One NOTIFY, and the ids inserted: a row whose key was taken is not.
            f"SELECT array_agg({q('id')}), pg_notify('{WAKE_CHANNEL}', '') FROM new_items HAVING count(*) > 0"
        )

    def _add_batch_statement(self, items: Sequence[NewItem], *, _depth: int = 0) -> builtins.list[QueueItem]:
        # The items and their messages in one statement: one round trip, atomic by itself.
        # The messages go as plain bytes, as in every PostgreSQL add (_add_function_arguments).
        rows = [self._insert_values(new) for new in items]
        given = [index for index, column in enumerate(INSERT_COLUMNS) if column not in _STARTING_VALUES]
        params = [[row[index] for row in rows] for index in given]
        params += [[row[0] for row in rows], [new.message for new in items]]
        with self._writing(single_statement=True, binding=True) as cursor:
            cursor.execute(self._add_batch_sql(), params)
            found = cursor.fetchone()
        added = {id_text(value) for value in (found[0] if found else [])}
        by_id = {new.id: new.to_queue_item() for new in items if new.id in added}
        return self._keyed_ones_too(
            items, by_id, lambda gone: self._add_batch_statement(gone, _depth=_depth + 1), _depth
        )

    @_built_once
    def _add_one_sql(self) -> str:
        message_sql = (
            f"INSERT INTO {self.quote(self.messages_table)} ({self.quote('item_id')}, {self.quote('data')}) "
            f"SELECT {self.quote('id')}, %s FROM new_item"
        )
        # pg_notify wakes idle workers once the statement (or the caller's transaction)
        # commits; PostgreSQL folds the notices of one transaction into one.
        return (
            f"WITH new_item AS ({self._insert_sql(1)}), new_message AS ({message_sql}) "
            f"SELECT {self.quote('id')}, pg_notify('{WAKE_CHANNEL}', '') FROM new_item"
        )

    @_built_once
    def _add_function_sql(self) -> str:
        # The casts name the function's own types, whatever the driver makes of a value.
        types = ("uuid", "varchar", "text", "jsonb", "bigint", "timestamptz", "timestamptz", "smallint", "varchar")
        return f"SELECT {ADD_FUNCTION}({', '.join(f'%s::{t}' for t in types)}, %s::bytea)"

    def _add_one_statement(self, new: NewItem, connection: BaseDatabaseWrapper) -> QueueItem:
        # The item and its message in one statement: one round trip, atomic by itself.
        # The migration's function when the database has it (its plan kept for the
        # session: a third less of the database's time), the same as one WITH otherwise.
        if connection_facts(connection).add_function:
            sql, params = self._add_function_sql(), _add_function_arguments(new)
        else:
            sql, params = self._add_one_sql(), [*self._insert_values(new), new.message]
        for _ in range(_KEY_RACES):
            row = self._bound_row(connection, sql, params)
            if row is not None and row[0] is not None:
                return new.to_queue_item()
            # The key is taken: return its item, unless that item left the queue
            # between the two statements, in which case the key is free again.
            key = _taken_key(new)
            existing = self._get_by_keys([key]).get(key)
            if existing is not None:
                return existing
        raise _key_race(new)

    def _bound_row(self, connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """Run one statement that carries a message and return its row: ``_writing``'s
        single statement, without its generator where no transaction is needed (the
        path of every ``send_mail()``). The caller translates the database's errors."""
        if _needs_own_transaction(connection):
            with self._writing(single_statement=True, binding=True) as cursor:
                cursor.execute(sql, params)
                return cursor.fetchone()  # type: ignore[no-any-return]
        with binding_cursor(connection) as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()  # type: ignore[no-any-return]

    def _add_in_transaction(
        self, items: Sequence[NewItem], max_items: int | None, *, _depth: int = 0
    ) -> builtins.list[QueueItem]:
        by_id: dict[str, QueueItem] = {}
        with self._writing() as cursor:
            if max_items is not None and self.connection.vendor == "postgresql":
                # Every add that counts waits here, so two never take the last place.
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_MAX_ITEMS_LOCK])
            # SQLite: the first INSERT takes the database's write lock, which the count
            # below then reads under, so concurrent adds are serialised there too.
            for start in range(0, len(items), 500):
                chunk = items[start : start + 500]
                cursor.execute(self._insert_sql(len(chunk)), [v for new in chunk for v in self._insert_values(new)])
                # RETURNING names the rows inserted; a row whose key was taken is not.
                added = {id_text(row[0]) for row in cursor.fetchall()}
                by_id.update((new.id, new.to_queue_item()) for new in chunk if new.id in added)
            inserted = [new for new in items if new.id in by_id]
            if inserted and self.connection.vendor == "postgresql":
                cursor.execute(f"SELECT pg_notify('{WAKE_CHANNEL}', '')")
            if inserted:
                Message.objects.using(self.alias).bulk_create(
                    [Message(item_id=uuid.UUID(new.id), data=new.message) for new in inserted]
                )
            if max_items is not None:
                cursor.execute(f"SELECT COUNT(*) FROM {self.quote(self.items_table)}")
                total = cursor.fetchone()[0]
                if total > max_items:
                    raise QueueError(
                        ErrorCode.FULL,
                        f"The queue is full: MAX_ITEMS is {max_items} and adding {len(inserted)} would make {total}.",
                    )
        return self._keyed_ones_too(
            items, by_id, lambda gone: self._add_in_transaction(gone, max_items, _depth=_depth + 1), _depth
        )

    def _keyed_ones_too(
        self,
        items: Sequence[NewItem],
        by_id: dict[str, QueueItem],
        add_again: Callable[[Sequence[NewItem]], builtins.list[QueueItem]],
        depth: int,
    ) -> builtins.list[QueueItem]:
        """Return ``items`` as added: those not in ``by_id`` had their key taken, and
        are answered with the item holding it, or added again when it left meanwhile."""
        missing = [new for new in items if new.id not in by_id]
        existing = self._get_by_keys([_taken_key(new) for new in missing]) if missing else {}
        gone = [new for new in missing if new.key not in existing]
        if gone:
            # Their keys' items left the queue between the statements: add them anew.
            if depth >= _KEY_RACES:
                raise _key_race(gone[0])
            for item in add_again(gone):
                by_id[item.id] = item
                existing[_taken_key(item)] = item
        return [by_id[new.id] if new.id in by_id else existing[_taken_key(new)] for new in items]

    def _get_by_keys(self, keys: Iterable[str]) -> dict[str, QueueItem]:
        with self.translated_errors():
            rows = Item.objects.using(self.alias).filter(key__in=list(keys))
            return {_taken_key(row): row.to_queue_item() for row in rows}

    # -- reading ----------------------------------------------------------------------

    def get(self, item_id: str) -> QueueItem | None:
        key = self._prep_id(item_id)
        if key is None:
            return None
        with self.translated_errors():
            row = Item.objects.using(self.alias).filter(id=uuid.UUID(item_id)).first()
        return None if row is None else row.to_queue_item()

    def list(self, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        with self.translated_errors():
            rows = Item.objects.using(self.alias).order_by("next_attempt_at", "seq")[offset : offset + limit]
            return [row.to_queue_item() for row in rows]

    def count(self) -> int:
        with self.translated_errors():
            return Item.objects.using(self.alias).count()

    def read_message(self, item_id: str) -> bytes | None:
        key = self._prep_id(item_id)
        if key is None:
            return None
        sql = f"SELECT {self.quote('data')} FROM {self.quote(self.messages_table)} WHERE {self.quote('item_id')} = %s"
        with self.translated_errors(), self.connection.cursor() as cursor:
            cursor.execute(sql, [key])
            row = cursor.fetchone()
        return None if row is None else bytes(row[0])

    def read_messages(self, item_ids: Iterable[str]) -> dict[str, bytes]:
        """One query for the messages of a batch (a worker reads a claim's at once)."""
        return self.select_messages(item_ids)

    def select_messages(self, item_ids: Iterable[str], *, head: int | None = None) -> dict[str, bytes]:
        """The messages of ``item_ids`` by id, or their first ``head`` bytes, in one query."""
        keys = [key for key in map(self._prep_id, item_ids) if key is not None]
        if not keys:
            return {}
        q = self.quote
        data = q("data") if head is None else f"substr({q('data')}, 1, %s)"
        sql = (
            f"SELECT {q('item_id')}, {data} FROM {q(self.messages_table)} "
            f"WHERE {q('item_id')} IN ({', '.join(['%s'] * len(keys))})"
        )
        with self.translated_errors(), self.connection.cursor() as cursor:
            cursor.execute(sql, keys if head is None else [head, *keys])
            return {id_text(item_id): bytes(data) for item_id, data in cursor.fetchall()}

    # -- leases and outcomes ----------------------------------------------------------

    def claim(self, *, owner: str, now: datetime, lease_until: datetime, limit: int = 1) -> builtins.list[QueueItem]:
        """Lease the due items of every lane, channels in turn (``orm_claims``)."""
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

    @_built_once
    def _lease_sql(self) -> str:
        # The lease doubles as the retry time: a leased item's next_attempt_at is its
        # lease's expiry, so it leaves the front of its lane (a backlog of leases
        # never slows a claim) and falls due by itself if its worker dies.
        q = self.quote
        return (
            f"UPDATE {self.quote(self.items_table)} SET {q('lease_owner')} = %s, {q('lease_expires_at')} = %s, "
            f"{q('next_attempt_at')} = %s"
        )

    @_built_once
    def _count_sql(self) -> str:
        return orm_claims.postgres_count_sql(self.quote, self.items_table)

    @_built_once
    def _skip_locked_claim_sql(self) -> str:
        return orm_claims.postgres_claim_sql(
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
            list(column) for column in zip(*orm_claims.shares_of(counted, limit, after), strict=True)
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
                    due = orm_claims.sqlite_fronts(cursor, self.quote, self.items_table, at, limit, self._last_channel)
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
                due = orm_claims.sqlite_fronts(cursor, self.quote, self.items_table, at, limit, self._last_channel)
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
        for start in range(0, len(keys), _IDS_PER_STATEMENT):
            chunk = keys[start : start + _IDS_PER_STATEMENT]
            with self._writing(single_statement=True) as cursor:
                cursor.execute(self._claim_items_sql(len(chunk)), [owner, until, until, *chunk, at, at])
                rows.extend(cursor.fetchall())
        rows.sort(key=lambda row: row[0])
        return [self._row_to_item(row[1:]) for row in rows]

    @_built_once
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
        for start in range(0, len(keys), _IDS_PER_STATEMENT):
            chunk = keys[start : start + _IDS_PER_STATEMENT]
            # An item due earlier keeps its time, and its place among the due.
            update = (
                f"UPDATE {q(self.items_table)} SET {q('next_attempt_at')} = "
                f"CASE WHEN {q('next_attempt_at')} > %s THEN %s ELSE {q('next_attempt_at')} END "
                f"WHERE {q('id')} IN ({', '.join(['%s'] * len(chunk))}) "
                f"AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s)"
            )
            due |= self._move_ids(update, [at, at, *chunk, at])
        return due

    @_built_once
    def _waiting_sql(self) -> str:
        """Not due yet at the first ``%s``, and free of a lease at the second."""
        q = self.quote
        return f"{q('next_attempt_at')} > %s AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s)"

    @_built_once
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

    @_built_once
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
            for start in range(0, len(keys), _IDS_PER_STATEMENT):
                chunk = keys[start : start + _IDS_PER_STATEMENT]
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

    def cancel(self, item_id: str) -> QueueItem | None:
        key = self._prep_id(item_id)
        if key is None:
            return None
        q = self.quote
        with self._writing() as cursor:
            cursor.execute(f"DELETE FROM {self.quote(self.messages_table)} WHERE {q('item_id')} = %s", [key])
            cursor.execute(
                f"DELETE FROM {self.quote(self.items_table)} WHERE {q('id')} = %s RETURNING {self._select_list()}",
                [key],
            )
            row = cursor.fetchone()
        return None if row is None else self._row_to_item(row)

    # -- MTA-STS policies and TLS report counts ----------------------------------------

    def get_sts_policy(self, domain: str) -> STSPolicy | None:
        with self.translated_errors():
            row = MTASTSPolicy.objects.using(self.alias).filter(domain=domain).first()
        if row is None:
            return None
        return STSPolicy(
            domain=row.domain,
            id=row.policy_id,
            mode=STSMode(row.mode),
            mx=tuple(row.mx),
            max_age=row.max_age,
            fetched_at=row.fetched_at,
        )

    def put_sts_policy(self, policy: STSPolicy) -> None:
        """One upsert on the domain's primary key."""
        self.validate_sts_policy(policy)
        row = MTASTSPolicy(
            domain=policy.domain,
            policy_id=policy.id,
            mode=policy.mode.value,
            mx=list(policy.mx),
            max_age=policy.max_age,
            fetched_at=policy.fetched_at,
        )
        with self.translated_errors():
            MTASTSPolicy.objects.using(self.alias).bulk_create(
                [row],
                update_conflicts=True,
                unique_fields=["domain"],
                update_fields=["policy_id", "mode", "mx", "max_age", "fetched_at"],
            )

    def count_tls_sessions(self, counts: Sequence[TLSSessionCount]) -> None:
        """An ``INSERT ... ON CONFLICT DO UPDATE`` adding to each kind's row, per 100
        kinds, in one transaction."""
        self.validate_tls_counts(counts)
        merged: dict[tuple[Any, ...], TLSSessionCount] = {}
        for count in counts:  # one row per kind and statement, as ON CONFLICT requires
            known = merged.get(count.kind)
            merged[count.kind] = count if known is None else dataclasses.replace(known, count=known.count + count.count)
        rows = list(merged.values())
        if not rows:
            return
        with self._writing() as cursor:
            for start in range(0, len(rows), _COUNTS_PER_STATEMENT):
                chunk = rows[start : start + _COUNTS_PER_STATEMENT]
                params: builtins.list[Any] = []
                for row in chunk:
                    params += self._tls_count_values(row)
                cursor.execute(self._count_tls_sql(len(chunk)), params)

    def _tls_count_values(self, count: TLSSessionCount) -> builtins.list[Any]:
        connection = self.connection
        policy_field = TLSReportCount._meta.get_field("policy")
        return [
            connection.ops.adapt_datefield_value(count.day),
            count.domain,
            count.policy_id,
            policy_field.get_db_prep_save(list(count.policy), connection),
            count.result or "",
            count.mx_host,
            count.address,
            count.reason,
            count.count,
        ]

    @_built_once
    def _count_tls_sql(self, rows: int) -> str:
        q, table = self.quote, self.quote(TLSReportCount._meta.db_table)
        row = "(" + ", ".join(["%s"] * len(_TLS_COUNT_COLUMNS)) + ")"
        return (
            f"INSERT INTO {table} ({', '.join(map(q, _TLS_COUNT_COLUMNS))}) VALUES {', '.join([row] * rows)} "
            f"ON CONFLICT ({', '.join(map(q, _TLS_KIND_COLUMNS))}) "
            f"DO UPDATE SET {q('count')} = {table}.{q('count')} + excluded.{q('count')}"
        )

    def tls_session_counts(self, day: date) -> builtins.list[TLSSessionCount]:
        with self.translated_errors():
            rows = list(TLSReportCount.objects.using(self.alias).filter(day=day).values(*_TLS_COUNT_COLUMNS))
        return [
            TLSSessionCount(
                day=row["day"],
                domain=row["domain"],
                policy_id=row["policy_id"],
                policy=tuple(row["policy"]),
                result=TLSResult(row["result"]) if row["result"] else None,
                mx_host=row["mx_host"],
                address=row["address"],
                reason=row["reason"],
                count=row["count"],
            )
            for row in rows
        ]

    def purge_tls_session_counts(self, *, before: date) -> int:
        with self.translated_errors():
            deleted, _ = TLSReportCount.objects.using(self.alias).filter(day__lt=before).delete()
        return deleted

    # -- shaping: one row per destination, each step one statement (orm_shaping.py) -----

    def take_permit(self, request: PermitRequest) -> Permit:
        return self._shaping.take(request)

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
        self._shaping.release(
            key, slot=slot, now=now, change=change, concurrency=concurrency, suspend_until=suspend_until
        )

    def renew_permit(self, key: str, *, slot: str, now: datetime, until: datetime) -> bool:
        return self._shaping.renew(key, slot=slot, now=now, until=until)

    def destination_states(self, *, now: datetime) -> builtins.list[DestinationState]:
        return self._shaping.states(now=now)

    def forget_idle_destinations(self, *, before: datetime, now: datetime) -> int:
        return self._shaping.forget_idle(before=before, now=now)

    # -- checks, and reading for operators (the admin, queue_status): orm_queries.py ----

    def check(self, **kwargs: Any) -> builtins.list[checks.CheckMessage]:
        return check_database(self.connection, self.alias)

    def search(self, query: ItemQuery, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        """Match as ``ItemQuery`` says, and ``text`` in the message's header block too."""
        return orm_queries.search(self, query, offset=offset, limit=limit)

    def read_message_heads(self, item_ids: Sequence[str], *, size: int = MESSAGE_HEAD_BYTES) -> dict[str, bytes]:
        return orm_queries.read_message_heads(self, item_ids, size=size)

    def lanes(self) -> builtins.list[tuple[str, int]]:
        """One statement that skips through the lanes' index: a probe per lane."""
        return orm_queries.lanes(self)

    def summary(self, *, now: datetime, age_buckets: Sequence[timedelta] = AGE_BUCKETS) -> QueueSummary:
        return orm_queries.summary(self, now=now, age_buckets=age_buckets)

    def gauges(self, *, now: datetime) -> QueueGauges:
        """One statement; on PostgreSQL beyond ``gauge_sample_rows`` items, over a sample."""
        return orm_queries.gauges(self, now=now)

    def estimated_count(self) -> ItemCount:
        """On PostgreSQL, the planner's estimate once the table is large: no ``COUNT(*)``."""
        with self.translated_errors():
            estimate = planner_estimate(self.connection, self.items_table)
        return ItemCount(self.count(), exact=True) if estimate is None else ItemCount(estimate, exact=False)

    # -- the suppression list: orm_suppressions.py -------------------------------------

    def suppressions_of(self, addresses: Iterable[str], *, now: datetime) -> dict[str, Suppression]:
        return orm_suppressions.suppressions_of(self, addresses, now=now)

    def update_suppressions(self, change: SuppressionChange, *, now: datetime) -> SuppressionUpdate:
        self.validate_suppressions(change)
        if not change:
            return SuppressionUpdate()
        return orm_suppressions.update_suppressions(self, change, now=now)

    def search_suppressions(
        self, *, now: datetime, text: str | None = None, offset: int = 0, limit: int = 100
    ) -> builtins.list[Suppression]:
        return orm_suppressions.search_suppressions(self, now=now, text=text, offset=offset, limit=limit)

    def count_suppressions(self, *, now: datetime) -> int:
        return orm_suppressions.count_suppressions(self, now=now)

    def purge_suppressions(self, *, now: datetime) -> int:
        return orm_suppressions.purge_suppressions(self, now=now)


def _needs_own_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Return whether a single statement needs a transaction of its own: outside the
    caller's, on a connection whose transactions do not default to READ COMMITTED."""
    return not connection.in_atomic_block and not default_is_read_committed(connection)


def _ends_at_domain(domain: str) -> str:
    """The ``LIKE`` pattern of an address at ``domain``: the text after its last ``@``
    is the domain, since a domain holds no ``@``."""
    return f"%@{orm_queries.escape_like(domain)}"


def _add_function_arguments(new: NewItem) -> list[Any]:
    """Return the add function's arguments as psycopg takes them as they are.

    Its statement casts each one to its type (``_add_function_sql``), so the values need
    none of the fields' adaptation, nor Django's ``Jsonb`` wrapper: the id goes as its
    text, the recipients as their JSON. The message goes as plain bytes, which psycopg
    adapts in either binding, as it does in every add on PostgreSQL: the ``Binary``
    wrapper Django's field adds more than doubled the client's CPU for an add's
    statement (docs/stores.md, "Adding").
    """
    return [
        new.id,
        new.key,
        new.sender,
        pending_recipients_json(new.recipients),
        new.size,
        new.created_at,
        new.next_attempt_at,
        new.priority,
        new.channel,
        new.message,
    ]


def _taken_key(keyed: NewItem | QueueItem | Item) -> str:
    """Return the idempotency key of an item that has one: only a keyed add is ever
    skipped (its key was taken), and only keyed rows are looked up by key."""
    assert keyed.key is not None
    return keyed.key


def _key_race(new: NewItem) -> QueueError:
    return QueueError(
        ErrorCode.STORE_UNAVAILABLE,
        f"The idempotency key {new.key!r} kept changing hands while it was added; try again.",
    )
