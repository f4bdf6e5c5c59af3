"""The plumbing every part of the ORM store shares: its database, quoting, the drivers'
values, the statement cache, and the translation of a database that cannot be used."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError, ProgrammingError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from bumail_queue.conf import QueueSettings
from bumail_queue.errors import ErrorCode, QueueError, first_line
from bumail_queue.items import QueueItem
from bumail_queue.models import Item, Message, item_from_row
from bumail_queue.stores.base import QueueStore

from .database import (
    ITEM_COLUMNS,
    aware,
    binding_cursor,
    default_is_read_committed,
    prep_value,
)

# Ids per statement of a claim or a retry by id: well within SQLite's bound parameters.
IDS_PER_STATEMENT = 500
# What a database that cannot be used raises (STORE_UNAVAILABLE): no connection, a lost
# one, SQLite locked beyond its timeout; a missing table is a ProgrammingError on
# PostgreSQL, an OperationalError on SQLite.
UNAVAILABLE_ERRORS = (OperationalError, InterfaceError, ProgrammingError)


def built_once(method: Callable[..., str]) -> Callable[..., str]:
    """Build a statement's text once per store: it depends only on the database's vendor."""

    @functools.wraps(method)
    def build(self: ORMConnection, *args: Any) -> str:
        key = (method.__name__, args)
        sql = self._statements.get(key)
        if sql is None:
            sql = self._statements[key] = method(self, *args)
        return sql

    return build


class ORMConnection(QueueStore):
    """The database of ``DATABASE`` and what each statement is written and run with."""

    def __init__(self, settings: QueueSettings) -> None:
        super().__init__(settings)
        self.alias: str = settings.database
        self.items_table = Item._meta.db_table
        self.messages_table = Message._meta.db_table
        self._statements: dict[tuple[str, tuple[Any, ...]], str] = {}
        # The channel this store's last claim ended with: where its round-robin stands.
        self._last_channel = ""

    # -- plumbing ---------------------------------------------------------------------

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    @built_once
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

    @built_once
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
        except UNAVAILABLE_ERRORS as error:
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
        (``database.binding_cursor``): for the statements that carry messages.
        """
        # Errors are translated here rather than by translated_errors() around it: one
        # generator rather than two nested, for a path most writes take.
        connection = self.connection
        try:
            if single_statement and not needs_own_transaction(connection):
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
        except UNAVAILABLE_ERRORS as error:
            raise self._unavailable(error) from error

    @staticmethod
    def _cursor(connection: BaseDatabaseWrapper, *, binding: bool) -> Any:
        return binding_cursor(connection) if binding else connection.cursor()

    def writing(self, *, single_statement: bool = False) -> AbstractContextManager[Any]:
        """Yield a cursor for a write: one transaction at READ COMMITTED, or for a single
        statement none of its own where the connection's default allows (``_writing``)."""
        return self._writing(single_statement=single_statement)


def needs_own_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Return whether a single statement needs a transaction of its own: outside the
    caller's, on a connection whose transactions do not default to READ COMMITTED."""
    return not connection.in_atomic_block and not default_is_read_committed(connection)
