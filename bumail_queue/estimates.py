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


#: Rows a page is taken to hold when a table was never analysed: more than an item
#: row takes, so an unknown table is sampled rather than read whole.
_ROWS_PER_PAGE_UNKNOWN = 100


def current_rows_estimate(connection: BaseDatabaseWrapper, table: str) -> int | None:
    """Return PostgreSQL's estimate of the rows ``table`` holds now, ``None`` elsewhere.

    The planner's own: the rows per page of the last ``ANALYZE`` (or ``VACUUM``) times
    the pages the table has now, so a table that grew since is not taken for the size
    it was. One catalogue lookup; no row is read.
    """
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples, relpages, pg_relation_size(oid) / current_setting('block_size')::bigint "
            "FROM pg_class WHERE oid = to_regclass(%s)",
            [table],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    rows, pages_then, pages_now = row
    if pages_now == 0:
        return 0
    if rows is None or rows < 0 or pages_then <= 0:
        return int(pages_now * _ROWS_PER_PAGE_UNKNOWN)
    return int(rows / pages_then * pages_now)
