"""What the ORM store needs of its database besides its statements.

The vendors it runs on and their system checks, the default isolation level asked
once per connection, the ``LISTEN`` connection that wakes idle workers on
PostgreSQL, and the values raw rows hold, which differ between the drivers.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
import weakref
from datetime import UTC, datetime
from typing import Any

from django.core import checks
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.utils.dateparse import parse_datetime

from bumail_queue.models import Item
from bumail_queue.stores.base import WorkListener

SUPPORTED_VENDORS = ("postgresql", "sqlite")

#: The items table's columns as the store's statements read them, in this order.
ITEM_COLUMNS = (
    "id", "key", "sender", "recipients", "size", "created_at", "next_attempt_at",
    "attempts", "delay_notified", "priority", "channel", "lease_owner", "lease_expires_at",
)  # fmt: skip
#: The columns an add writes: those a new item starts with (it has no lease), and its revision.
INSERT_COLUMNS = (*ITEM_COLUMNS[: ITEM_COLUMNS.index("lease_owner")], "rev")

_ITEM_FIELDS: dict[str, Field[Any, Any]] = {f.attname: f for f in Item._meta.concrete_fields}


def prep_value(column: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
    """Return ``value`` as ``connection``'s driver takes it for the items' ``column``."""
    return _ITEM_FIELDS[column].get_db_prep_save(value, connection)


#: The NOTIFY channel that enqueues, retries and give-backs signal on PostgreSQL.
WAKE_CHANNEL = "bumail_queue"

#: The function migration 0008 makes on PostgreSQL: an item and its message added in
#: one call, whose plan PostgreSQL keeps for the session (see ``add_function``).
ADD_FUNCTION = "bumail_queue_add"
ADD_FUNCTION_SIGNATURE = (
    f"{ADD_FUNCTION}(uuid, character varying, text, jsonb, bigint, timestamp with time zone, "
    "timestamp with time zone, smallint, character varying, bytea)"
)


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionFacts:
    """What the store asks a physical connection once: its default isolation, and
    whether the database has the add function (a database made without migrations,
    as a test run with ``--nomigrations`` makes it, has not)."""

    read_committed: bool
    add_function: bool


_SQLITE_FACTS = ConnectionFacts(read_committed=True, add_function=False)
# The facts of each physical connection, asked once.
_facts_by_connection: weakref.WeakKeyDictionary[Any, ConnectionFacts] = weakref.WeakKeyDictionary()


def connection_facts(connection: BaseDatabaseWrapper) -> ConnectionFacts:
    """Return the ``ConnectionFacts`` of ``connection``, asking its database once."""
    if connection.vendor != "postgresql":
        return _SQLITE_FACTS
    raw = connection.connection
    if raw is None:
        connection.ensure_connection()
        raw = connection.connection
    known = _facts_by_connection.get(raw)
    if known is None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('default_transaction_isolation'), to_regprocedure(%s) IS NOT NULL",
                [ADD_FUNCTION_SIGNATURE],
            )
            isolation, has_function = cursor.fetchone()
        known = _facts_by_connection[raw] = ConnectionFacts(
            read_committed=isolation == "read committed", add_function=bool(has_function)
        )
    return known


def default_is_read_committed(connection: BaseDatabaseWrapper) -> bool:
    """Return whether a transaction begun on ``connection`` runs at READ COMMITTED."""
    return connection_facts(connection).read_committed


def check_database(connection: BaseDatabaseWrapper, alias: str) -> list[checks.CheckMessage]:
    """Return the system check errors about the database the ORM store is to use."""
    vendor = connection.vendor
    if vendor not in SUPPORTED_VENDORS:
        return [
            checks.Error(
                f"The ORM store runs on PostgreSQL or SQLite; DATABASES[{alias!r}] is {vendor}.",
                hint="Point BUMAIL_QUEUE['DATABASE'] at a PostgreSQL or SQLite database.",
                id="bumail_queue.E013",
            )
        ]
    if vendor != "sqlite":
        return []
    import sqlite3  # here: a project on PostgreSQL never loads the SQLite driver

    if sqlite3.sqlite_version_info < (3, 35):
        return [
            checks.Error(
                f"The ORM store needs SQLite 3.35 or newer (RETURNING); this Python has {sqlite3.sqlite_version}.",
                id="bumail_queue.E014",
            )
        ]
    return []


class PostgresListener(WorkListener):
    """A connection of its own that LISTENs; a pooler in transaction mode cannot, and
    then the worker's poll (``POLL_SECONDS``) still finds the work."""

    def __init__(self, alias: str) -> None:
        # A separate Django connection, so it has every option of the alias.
        self._wrapper = connections.create_connection(alias)
        self._wrapper.ensure_connection()
        self._wrapper.set_autocommit(True)
        self._raw = self._wrapper.connection
        self._raw.execute(f"LISTEN {WAKE_CHANNEL}")

    def wait(self, timeout: float) -> bool:
        for _ in self._raw.notifies(timeout=timeout, stop_after=1):
            return True
        return False

    def close(self) -> None:
        self._wrapper.close()


def binding_cursor(connection: BaseDatabaseWrapper) -> Any:
    """Return a cursor of ``connection`` that sends its parameters apart from the SQL.

    For a statement that carries a message: Django's PostgreSQL cursors write every
    parameter into the statement's text (psycopg's client-side binding), a message of
    2 KB as 4 KB of hex the server then parses; bound apart, the bytes go as they are,
    which halves what an enqueue costs the database (docs/stores.md). The cursor is
    Django's own wrapper, so its query log, its execute wrappers and the tests' query
    counts see the statement. On SQLite, and on a project that chose server-side
    binding (``OPTIONS["server_side_binding"]``), it is the usual cursor.

    The statement is never prepared by name unless the project chose server-side
    binding, whose prepared statements it then accepted: a pooler in transaction mode
    (PgBouncer before 1.21) cannot keep a prepared statement between transactions.
    """
    if connection.vendor != "postgresql" or connection.settings_dict["OPTIONS"].get("server_side_binding") is True:
        return connection.cursor()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = _unprepared_cursor_class()(connection.connection)
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


@functools.cache
def _unprepared_cursor_class() -> type[Any]:
    import psycopg  # only on PostgreSQL: psycopg is the postgres extra's

    class UnpreparedCursor(psycopg.Cursor[Any]):
        """psycopg's server-side binding cursor, whose statements are never prepared."""

        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
        ) -> Any:
            return super().execute(query, params, prepare=False, binary=binary)

    return UnpreparedCursor


def aware(value: Any) -> datetime | None:
    """Return a raw row's time as an aware UTC ``datetime``: SQLite gives text, psycopg objects."""
    if value is None or (isinstance(value, datetime) and value.tzinfo is not None):
        return value
    parsed = parse_datetime(value) if isinstance(value, str) else value
    return None if parsed is None else parsed.replace(tzinfo=UTC)


def id_text(value: Any) -> str:
    """Return an id as text: psycopg gives a UUID, SQLite the 32 hex digits Django keeps."""
    return str(value if isinstance(value, uuid.UUID) else uuid.UUID(value))
