"""How long the admin's queue pages take over a large queue on PostgreSQL.

    python bench/admin_list.py [--items 100000] [--rounds 20] [--postgres URL]

Creates its own database, ``bumail_bench_admin``, on the server ``--postgres`` names
(dropping one left over by an interrupted run), fills the ORM store's tables with
``--items`` items in one ``INSERT ... SELECT generate_series`` (80% waiting for a
first attempt, 15% deferred with a reply, 5% leased to a worker; one to three
recipients each over 50 domains; a 1 KB message each), runs ``VACUUM ANALYZE``, then
renders each page with Django's test client as a logged-in superuser and prints one
Markdown table: the median and the slowest of ``--rounds`` renders, and the queries
each render made. The database is dropped at the end.

The list page must stay well under a second whatever the queue's size: it reads one
page of items through the ``(next_attempt_at, seq)`` index, the heads of their
messages, and PostgreSQL's row estimate, never a ``COUNT(*)``. Searches and filters
other than the state scan the table; they are shown for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402 - the path above comes first
    DEFAULT_POSTGRES,
    create_bench_database,
    drop_bench_database,
    postgres_bench_url,
)

DATABASE = "bumail_bench_admin"
MESSAGE = (
    "From: Shop Example <shop@example.com>\r\nTo: someone@example.org\r\nSubject: Your order has shipped\r\n"
    "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nMessage-ID: <bench@example.com>\r\n\r\n"
    + "Your parcel is on its way and should arrive within three working days.\r\n"
    * 12
).encode()


def fill(count: int) -> None:
    """Make ``count`` items and their messages, server-side, in one statement."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "WITH new AS (INSERT INTO bumail_queue_items (id, sender, recipients, size, created_at, next_attempt_at, "
            "attempts, delay_notified, lease_owner, lease_expires_at, rev) "
            "SELECT gen_random_uuid(), 'shop@example.com', "
            "(SELECT jsonb_agg(jsonb_build_object("
            "  'address', 'user' || i || '.' || r || '@d' || ((i + r) %% 50) || '.example.com',"
            "  'status', CASE WHEN i %% 20 BETWEEN 1 AND 3 THEN 'deferred' ELSE 'pending' END,"
            "  'reply', CASE WHEN i %% 20 BETWEEN 1 AND 3 THEN jsonb_build_object('code', 451, 'status', '4.7.1', 'text', 'Greylisted') END))"
            "  FROM generate_series(1, 1 + i %% 3) AS r), "
            "%s, now() - (i %% 2000) * interval '1 minute', "
            "CASE WHEN i %% 20 = 0 THEN now() + interval '10 minutes' "
            "     WHEN i %% 20 BETWEEN 1 AND 3 THEN now() + (i %% 240) * interval '1 minute' "
            "     ELSE now() - (i %% 2000) * interval '1 minute' END, "
            "CASE WHEN i %% 20 BETWEEN 1 AND 3 THEN 1 ELSE 0 END, false, "
            "CASE WHEN i %% 20 = 0 THEN 'worker-' || (i %% 4) END, "
            "CASE WHEN i %% 20 = 0 THEN now() + interval '10 minutes' END, 0 "
            "FROM generate_series(1, %s) AS i RETURNING id) "
            "INSERT INTO bumail_queue_messages (item_id, data) SELECT id, %s FROM new",
            [len(MESSAGE), count, MESSAGE],
        )
        cursor.execute("VACUUM ANALYZE bumail_queue_items")
        cursor.execute("VACUUM ANALYZE bumail_queue_messages")


def measure(client: Any, url: str, rounds: int) -> tuple[float, float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)  # warm-up: templates, the session, the plan cache
    if response.status_code != 200:
        raise SystemExit(f"{url} answered {response.status_code}")
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        times.append(time.perf_counter() - start)
        assert response.status_code == 200
    return statistics.median(times), max(times), len(queries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--postgres", default=os.environ.get("BUMAIL_TEST_POSTGRES_URL", DEFAULT_POSTGRES))
    args = parser.parse_args(argv)

    os.environ["BENCH_DATABASE_URL"] = postgres_bench_url(args.postgres, DATABASE)
    create_bench_database(args.postgres, DATABASE)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.admin_settings"
    import django

    django.setup()
    try:
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client

        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        fill(args.items)
        print(
            f"{args.items:,} items made in {time.perf_counter() - started:.1f} s; PostgreSQL {connection.pg_version // 10000}\n"
        )
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "bench@example.com", None))
        base = "/admin/bumail_queue/item/"
        pages = [
            ("the list, first page", base),
            ("the list, page 50", base + "?p=50"),
            ("state: deferred", base + "?state=deferred"),
            ("state: being delivered", base + "?state=delivering"),
            ("recipient domain", base + "?domain=d7.example.com"),
            ("search: a recipient", base + "?q=user4242.1%40"),
            ("search: an item id (not found)", base + "?q=00000000-0000-4000-8000-000000000000"),
            ("the overview (counts and shape)", base + "overview/"),
        ]
        print(f"| page ({args.items:,} items) | median | slowest | queries |")
        print("|---|---|---|---|")
        for label, url in pages:
            median, slowest, queries = measure(client, url, args.rounds)
            print(f"| {label} | {median * 1000:.0f} ms | {slowest * 1000:.0f} ms | {queries} |")
    finally:
        from django.db import connections

        connections.close_all()  # a database in use cannot be dropped
        drop_bench_database(args.postgres, DATABASE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
