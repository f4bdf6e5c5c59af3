"""How long a scrape of the queue's gauges takes over a large queue, on every store.

    python bench/metrics_scrape.py [--items 100000] [--rounds 20] [--postgres URL] [--redis URL|none]

For each store (the ORM store on SQLite and on PostgreSQL, and Redis) it makes
``--items`` items through the store's own ``add_many`` (one to three recipients
each), claims them all and records a batch so that 15% are deferred (tried once,
each with a reply), 5% stay leased and the rest are queued and due; it adds 10,000
delivery log entries of the last hour. Then it times, ``--rounds`` times after a
warm-up, ``QueueStore.gauges()`` alone and a whole scrape of the queue's collector
(``generate_latest``: the gauges and the delivery log's last hour), with the store
sampling (its default ``gauge_sample_rows``) and reading every item (exact), and
prints one Markdown table of the medians. PostgreSQL runs ``VACUUM ANALYZE`` after
the set-up, as autovacuum would on a busy table. It uses the databases and the key
prefix of ``bench/run.py`` (created and dropped, deleted before and after).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
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

DATABASE = "bumail_bench_metrics"
REDIS_PREFIX = "bumail:bench:"


def measure(url: str, redis_url: str | None, items: int, rounds: int) -> list[tuple[str, str, float, bool]]:
    """In a fresh process: set Django up on ``url``, fill the store, time the scrapes."""
    os.environ["BENCH_DATABASE_URL"] = url
    if redis_url:
        os.environ["BENCH_REDIS_URL"] = redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone
    from prometheus_client import CollectorRegistry, generate_latest

    from bumail_queue import delivery_log
    from bumail_queue.items import AttemptResult, Outcome, RecipientStatus, Reply
    from bumail_queue.metrics.queue import QueueCollector
    from bumail_queue.stores import get_store
    from bumail_queue.testing import new_item

    call_command("migrate", verbosity=0)
    store = get_store()
    if redis_url:
        _delete_redis_keys(redis_url)
    label = "Redis" if redis_url else {"postgresql": "PostgreSQL", "sqlite": "SQLite"}[connection.vendor]
    now = timezone.now()
    for start in range(0, items, 1000):
        store.add_many(
            [
                new_item(
                    recipients=[f"u{n}.{r}@d{n % 50}.example.com" for r in range(1 + n % 3)],
                    created_at=now - timedelta(seconds=items - n),
                )
                for n in range(start, min(items, start + 1000))
            ]
        )
    later = now + timedelta(seconds=1)
    claimed = []
    while batch := store.claim(owner="bench", now=later, lease_until=later + timedelta(hours=1), limit=5000):
        claimed += batch
    results = []
    late = Reply(code=451, status="4.7.1", text="Greylisted, try again later")
    for n, item in enumerate(claimed):
        if n % 20 in (1, 2, 3):
            outcomes = {r.address: Outcome(status=RecipientStatus.DEFERRED, reply=late) for r in item.recipients}
            results.append((item.id, AttemptResult(outcomes=outcomes, next_attempt_at=later + timedelta(hours=1))))
        elif n % 20:
            results.append((item.id, AttemptResult(outcomes={}, next_attempt_at=item.created_at, count_attempt=False)))
    for start in range(0, len(results), 5000):
        store.complete_many(results[start : start + 5000], owner="bench")
    log = [
        delivery_log._entry(
            item_id=item.id, recipient=item.recipients[0].address, status="delivered", reply=None,
            envelope_sender=item.sender, remote_host=None, next_attempt_at=None, at=later - timedelta(seconds=n % 3000),
        )
        for n, item in enumerate(claimed[:10_000])
    ]  # fmt: skip
    delivery_log.write(log)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE bumail_queue_items")
            cursor.execute("VACUUM ANALYZE bumail_queue_delivery_log")
    registry = CollectorRegistry()
    registry.register(QueueCollector(clock=lambda: later))
    rows = []
    default_sample = store.gauge_sample_rows
    for mode, sample in (("sampled", default_sample), ("exact", items * 10)):
        store.gauge_sample_rows = sample
        gauges = store.gauges(now=later)  # warm-up
        rows.append((label, f"gauges(), {mode}", _median(lambda: store.gauges(now=later), rounds), gauges.exact))
        rows.append((label, f"whole scrape, {mode}", _median(lambda: generate_latest(registry), rounds), gauges.exact))
    store.gauge_sample_rows = default_sample
    if redis_url:
        _delete_redis_keys(redis_url)
    return rows


def _median(call: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _delete_redis_keys(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{REDIS_PREFIX}*", count=1000))
    if keys:
        client.delete(*keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--postgres", default=os.environ.get("BUMAIL_TEST_POSTGRES_URL", DEFAULT_POSTGRES))
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    postgres = postgres_bench_url(args.postgres, DATABASE)
    runs: list[tuple[str, str | None]] = [
        (f"sqlite:///{Path(tempfile.mkdtemp()) / 'metrics.sqlite3'}", None),
        (postgres, None),
    ]
    if args.redis != "none":
        runs.append((f"sqlite:///{Path(tempfile.mkdtemp()) / 'metrics.sqlite3'}", args.redis))
    create_bench_database(args.postgres, DATABASE)
    rows = []
    try:
        context = multiprocessing.get_context("spawn")
        for url, redis_url in runs:
            with context.Pool(1) as pool:
                rows += pool.apply(measure, (url, redis_url, args.items, args.rounds))
    finally:
        drop_bench_database(args.postgres, DATABASE)
    print(f"| store ({args.items:,} items) | what | median of {args.rounds} | exact |")
    print("|---|---|---|---|")
    for label, what, seconds, exact in rows:
        print(f"| {label} | {what} | {seconds * 1000:.1f} ms | {'yes' if exact else 'no (sampled)'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
