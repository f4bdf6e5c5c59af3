"""PostgreSQL's estimate of a table's rows, for pages that must not count a large table.

``COUNT(*)`` reads every row; the planner's ``reltuples`` is kept up to date by
``ANALYZE`` and autovacuum and costs one catalogue lookup. The ORM store's queue and
the delivery log both page with it.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

#: Below this many rows (by PostgreSQL's estimate) an exact count is cheap enough.
EXACT_COUNT_BELOW = 100_000


def planner_estimate(connection: BaseDatabaseWrapper, table: str) -> int | None:
    """Return PostgreSQL's estimate of ``table``'s rows once it is ``EXACT_COUNT_BELOW``
    or more (counting them would read them all); ``None`` where counting is cheap."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < EXACT_COUNT_BELOW:
        return None
    return int(row[0])
