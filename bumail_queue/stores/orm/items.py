"""The ORM store's items and their messages: adding, reading and cancelling."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import NewItem, QueueItem, pending_recipients_json
from bumail_queue.models import Item, Message

from .connection import UNAVAILABLE_ERRORS, ORMConnection, built_once, needs_own_transaction
from .database import (
    ADD_FUNCTION,
    INSERT_COLUMNS,
    WAKE_CHANNEL,
    binding_cursor,
    connection_facts,
    id_text,
)

# Serialises adds that count against MAX_ITEMS across every process (pg_advisory_xact_lock).
_MAX_ITEMS_LOCK = 0x62756D61696C  # "bumail"
# How often an add retries when the item holding its key leaves meanwhile.
_KEY_RACES = 3
# The columns every new item starts with the same value in: the batch add writes them
# in its statement rather than send a list of them.
_STARTING_VALUES = {"attempts": "0", "delay_notified": "false", "rev": "0"}
# The PostgreSQL type of each column the batch add sends a list of.
_ARRAY_TYPES = {
    "id": "uuid", "key": "varchar", "sender": "text", "recipients": "jsonb", "size": "bigint",
    "created_at": "timestamptz", "next_attempt_at": "timestamptz", "priority": "smallint", "channel": "varchar",
}  # fmt: skip


class ORMItems(ORMConnection):
    """Adds items in one statement where it can, reads them and their messages, cancels them."""

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

    @built_once
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
            except UNAVAILABLE_ERRORS as error:
                raise self._unavailable(error) from error
        return self._add_in_transaction(items, max_items)

    @built_once
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

    @built_once
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

    @built_once
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
        if needs_own_transaction(connection):
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
