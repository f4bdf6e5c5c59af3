"""The ORM store's suppression list: ``bumail_queue_suppressions``, a row per address and scope.

A row is an entry (``suppressed``), or the note of an address's first expiry
(``MAX_AGE``, global scope), which the second expiry while it lasts makes an entry.
Each write is one ``INSERT ... ON CONFLICT`` per entry or one ``DELETE ... RETURNING``
per 500 addresses of a scope; an expiry reads its row under a lock first, so two
workers noting the same address at once meet in the row, one after the other.
Lookups go by the ``(address, scope)`` unique index, a batch in one statement (500
addresses a statement, well within SQLite's bound parameters); the admin's page
walks the ``created_at`` index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from django.db.backends.base.base import BaseDatabaseWrapper

from bumail_queue.items import Reply
from bumail_queue.models import Suppression as Row
from bumail_queue.suppression import (
    DISPROVED_BY_DELIVERY,
    GLOBAL_SCOPE,
    Suppression,
    SuppressionChange,
    SuppressionReason,
    SuppressionUpdate,
    lookup_keys,
    search_form,
)

from .database import aware
from .queries import escape_like

#: Addresses per statement of a lookup or a removal.
ADDRESSES_PER_STATEMENT = 500
#: Expired rows an update that adds entries drops on its way, so the table stays the
#: size of what is in force without a purge; ``purge`` drops the rest.
PURGE_ON_THE_WAY = 100

_COLUMNS = (
    "address",
    "scope",
    "suppressed",
    "reason",
    "reply_code",
    "reply_status",
    "reply_text",
    "created_at",
    "expires_at",
)
_ENTRY_COLUMNS = ", ".join(c for c in _COLUMNS if c != "suppressed")


class ORMWriter(Protocol):
    """What the list needs of the ORM store: its connection, its quoting, its writes."""

    alias: str

    @property
    def connection(self) -> BaseDatabaseWrapper: ...

    def quote(self, name: str) -> str: ...

    def prep_time(self, value: datetime) -> Any: ...

    def translated_errors(self) -> AbstractContextManager[None]: ...

    def writing(self, *, single_statement: bool = False) -> AbstractContextManager[Any]: ...


def _table(store: ORMWriter) -> str:
    return store.quote(Row._meta.db_table)


def _entry(row: Sequence[Any]) -> Suppression:
    """An entry from a row of ``_ENTRY_COLUMNS`` (raw: SQLite gives times as text)."""
    address, scope, reason, code, status, text, created_at, expires_at = row
    return Suppression(
        address=address,
        scope=scope,
        reason=SuppressionReason(reason),
        reply=Reply(code=code, status=status, text=text),
        created_at=_time(created_at),
        expires_at=_time(expires_at),
    )


def _time(value: Any) -> datetime:
    """A raw row's time (never NULL in this table) as an aware ``datetime``."""
    time = aware(value)
    assert time is not None
    return time


def _values(store: ORMWriter, entry: Suppression, *, suppressed: bool, expires_at: datetime) -> list[Any]:
    reply = entry.reply
    return [
        entry.address,
        entry.scope,
        suppressed,
        entry.reason.value,
        reply.code,
        reply.status[:16],
        reply.text,
        store.prep_time(entry.created_at),
        store.prep_time(expires_at),
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class Wanted:
    """What a search asks of the entries besides being in force (``None``: anything)."""

    text: str | None = None
    scope: str | None = None
    reason: SuppressionReason | None = None


def suppression_entries(
    store: ORMWriter, addresses: Iterable[str], *, now: datetime, scopes: Sequence[str] | None
) -> dict[str, list[Suppression]]:
    """Look a batch up on the ``(address, scope)`` index: one statement per 500 keys, each
    address's and its ``forgotten_key`` in the same ``IN`` list."""
    given = lookup_keys(addresses)
    keys = list(given)
    found: dict[str, list[Suppression]] = {}
    table, q = _table(store), store.quote
    in_scopes, scope_params = "", []
    if scopes is not None:
        if not scopes:
            return {}
        in_scopes = f" AND {q('scope')} IN ({', '.join(['%s'] * len(scopes))})"
        scope_params = list(scopes)
    with store.translated_errors(), store.connection.cursor() as cursor:
        for start in range(0, len(keys), ADDRESSES_PER_STATEMENT):
            chunk = keys[start : start + ADDRESSES_PER_STATEMENT]
            cursor.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM {table} WHERE {q('address')} IN ({', '.join(['%s'] * len(chunk))})"
                f"{in_scopes} AND {q('suppressed')} AND {q('expires_at')} > %s",
                [*chunk, *scope_params, store.prep_time(now)],
            )
            for row in cursor.fetchall():
                entry = _entry(row)
                for address in given[entry.address]:
                    found.setdefault(address, []).append(entry)
    return found


def _upsert_sql(store: ORMWriter) -> str:
    table, q = _table(store), store.quote
    updated = ", ".join(f"{q(c)} = excluded.{q(c)}" for c in _COLUMNS if c != "address")
    return (
        f"INSERT INTO {table} ({', '.join(map(q, _COLUMNS))}) VALUES ({', '.join(['%s'] * len(_COLUMNS))}) "
        f"ON CONFLICT ({q('address')}, {q('scope')}) DO UPDATE SET {updated}"
    )


def update_suppressions(store: ORMWriter, change: SuppressionChange, *, now: datetime) -> SuppressionUpdate:
    """Apply a change in one transaction: an upsert per entry or expiry, one ``DELETE`` per
    500 addresses of a scope cleared."""
    written = list(change.add)
    removed: list[str] = []
    at = store.prep_time(now)
    # Each DELETE: the addresses of one scope, and whether only what a delivery disproves goes.
    deletes: dict[tuple[str, bool], list[str]] = {(GLOBAL_SCOPE, True): list(change.clear)} if change.clear else {}
    for address, scope in change.clear_scoped:
        deletes.setdefault((scope, False), []).append(address)
    # The common change, a batch's deliveries taking their addresses off, is one
    # DELETE: no transaction of its own, and no commit to wait for when it finds none.
    alone = (
        not change.add
        and not change.expired
        and len(deletes) == 1
        and all(len(addresses) <= ADDRESSES_PER_STATEMENT for addresses in deletes.values())
    )
    with store.writing(single_statement=alone) as cursor:
        for entry in change.add:
            cursor.execute(_upsert_sql(store), _values(store, entry, suppressed=True, expires_at=entry.expires_at))
        for entry in change.expired:
            if _expired_once_more(store, cursor, entry, change.note_until or now, now):
                written.append(entry)
        for (scope, delivered), addresses in deletes.items():
            for start in range(0, len(addresses), ADDRESSES_PER_STATEMENT):
                chunk = addresses[start : start + ADDRESSES_PER_STATEMENT]
                removed += _delete(store, cursor, chunk, scope, now, delivered=delivered)
        if written:
            _drop_expired(store, cursor, at, limit=PURGE_ON_THE_WAY)
    return SuppressionUpdate(suppressed=tuple(written), removed=tuple(removed))


def _expired_once_more(store: ORMWriter, cursor: Any, entry: Suppression, note_until: datetime, now: datetime) -> bool:
    """Note an expiry of ``entry.address``; return whether it put ``entry`` in force.

    A new address gets its note in the first statement. Otherwise the row is read under
    its lock (``FOR UPDATE`` on PostgreSQL; SQLite's write lock, which the ``INSERT``
    took, on SQLite), so of two workers noting the same address at once, the second
    sees the note the first wrote: an entry in force stays, a lasting note becomes the
    entry, a lapsed one is noted anew. Expiries are rare: three statements at most.
    """
    table, q = _table(store), store.quote
    cursor.execute(
        f"INSERT INTO {table} ({', '.join(map(q, _COLUMNS))}) VALUES ({', '.join(['%s'] * len(_COLUMNS))}) "
        f"ON CONFLICT ({q('address')}, {q('scope')}) DO NOTHING RETURNING {q('address')}",
        _values(store, entry, suppressed=False, expires_at=note_until),
    )
    if cursor.fetchone() is not None:
        return False
    lock = " FOR UPDATE" if store.connection.vendor == "postgresql" else ""
    cursor.execute(
        f"SELECT {q('suppressed')}, {q('expires_at')} FROM {table} WHERE {q('address')} = %s AND {q('scope')} = %s{lock}",
        [entry.address, GLOBAL_SCOPE],
    )
    suppressed, expires_at = cursor.fetchone()
    lasting = _time(expires_at) > now
    if suppressed and lasting:
        return False
    cursor.execute(
        _upsert_sql(store),
        _values(store, entry, suppressed=lasting, expires_at=entry.expires_at if lasting else note_until),
    )
    return bool(lasting)


def _delete(
    store: ORMWriter, cursor: Any, addresses: Sequence[str], scope: str, now: datetime, *, delivered: bool
) -> list[str]:
    """Delete the rows of ``addresses`` in ``scope`` (for ``delivered`` addresses, their
    notes and the entries a delivery disproves alone); return those whose entries were
    in force."""
    q = store.quote
    params: list[Any] = [scope, *addresses]
    disproved = ""
    if delivered:
        reasons = sorted(reason.value for reason in DISPROVED_BY_DELIVERY)
        disproved = f" AND (NOT {q('suppressed')} OR {q('reason')} IN ({', '.join(['%s'] * len(reasons))}))"
        params += reasons
    cursor.execute(
        f"DELETE FROM {_table(store)} WHERE {q('scope')} = %s "
        f"AND {q('address')} IN ({', '.join(['%s'] * len(addresses))}){disproved} "
        f"RETURNING {q('address')}, {q('suppressed')}, {q('expires_at')}",
        params,
    )
    return [address for address, suppressed, expires_at in cursor.fetchall() if suppressed and _time(expires_at) > now]


def _drop_expired(store: ORMWriter, cursor: Any, at: Any, *, limit: int | None) -> int:
    table, q = _table(store), store.quote
    expired = f"SELECT {q('id')} FROM {table} WHERE {q('expires_at')} <= %s"
    if limit is not None:
        expired += f" LIMIT {int(limit)}"
    cursor.execute(
        f"DELETE FROM {table} WHERE {q('id')} IN ({expired}) RETURNING {q('suppressed')}",
        [at],
    )
    return sum(1 for (suppressed,) in cursor.fetchall() if suppressed)


def search_suppressions(
    store: ORMWriter, *, now: datetime, wanted: Wanted, offset: int, limit: int
) -> list[Suppression]:
    """A page in one statement, on the ``created_at`` index; a text is a ``LIKE`` that reads every entry."""
    if limit <= 0:
        return []
    q = store.quote
    where = f"{q('suppressed')} AND {q('expires_at')} > %s"
    params: list[Any] = [store.prep_time(now)]
    if wanted.text is not None:
        # ASCII case aside, as the other stores compare: the C collation's lower() on
        # PostgreSQL, SQLite's LIKE.
        address = f'lower({q("address")} COLLATE "C")' if store.connection.vendor == "postgresql" else q("address")
        where += f" AND {address} LIKE %s ESCAPE '\\'"
        params.append(f"%{escape_like(search_form(wanted.text))}%")
    if wanted.scope is not None:
        where += f" AND {q('scope')} = %s"
        params.append(wanted.scope)
    if wanted.reason is not None:
        where += f" AND {q('reason')} = %s"
        params.append(wanted.reason.value)
    sql = (
        f"SELECT {_ENTRY_COLUMNS} FROM {_table(store)} WHERE {where} "
        f"ORDER BY {q('created_at')} DESC, {q('address')} DESC, {q('scope')} DESC LIMIT %s OFFSET %s"
    )
    with store.translated_errors(), store.connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit, offset])
        return [_entry(row) for row in cursor.fetchall()]


def count_suppressions(store: ORMWriter, *, now: datetime) -> int:
    with store.translated_errors():
        return Row.objects.using(store.alias).filter(suppressed=True, expires_at__gt=now).count()


def purge_suppressions(store: ORMWriter, *, now: datetime) -> int:
    with store.writing() as cursor:
        return _drop_expired(store, cursor, store.prep_time(now), limit=None)
