"""A bulk hold and release of many items while workers claim other mail.

    python bench/bulk.py [--n N] [--other M] [--workers W] [--postgres URL] [--redis URL] [--only postgres,redis]

For PostgreSQL and the Redis store: ``N`` items (100,000 by default) queued for
later in the ``default`` channel, and ``M`` other items due now in two other
channels. ``W`` worker processes (3) claim the other mail one item a claim, as fast
as they can, from before the hold starts until the release ends. Meanwhile
``queue.hold(BulkFilter(channel="default"))`` holds the ``N`` items, a batch of
1,000 at a time, and ``queue.release`` releases them again.

One Markdown table: for each action, how many items it changed in how many batches,
how long it took, and the claims made while it ran: how many, their median and the
longest. The longest claim is the one to read: a batch that held a lock a claim
needed would show there as a claim as long as the batch.

Compare the rows of one table with each other only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402 - the path above comes first
    DEFAULT_POSTGRES,
    DEFAULT_REDIS,
    BenchError,
    _spawn,
    create_bench_database,
    database_label,
    drop_bench_database,
    in_child,
    insert_due,
    migrate,
    postgres_bench_url,
    reset_queue,
    settle,
    setup_django,
)

#: A database of this script's own on the PostgreSQL server, dropped at the end.
DATABASE = "bumail_bench_bulk"


def claimer(database_url: str, owner: str, ready: Any, stop: Any, conn: Any) -> None:
    """Claim one item a claim until ``stop``; send back each claim's start and length."""
    setup_django(database_url)
    from bumail_queue.stores import get_store

    store = get_store()
    claims: list[tuple[float, float]] = []
    ready.wait()
    while not stop.is_set():
        now = datetime.now(UTC)
        before = time.perf_counter()
        store.claim(owner=owner, now=now, lease_until=now + timedelta(hours=1), limit=1)
        claims.append((before, time.perf_counter() - before))
    conn.send(claims)
    conn.close()


def seed(database_url: str, n: int, other: int) -> str:
    """Queue the items; return the database's label."""
    setup_django(database_url)
    reset_queue()
    now = datetime.now(UTC)
    insert_due(n, due_at=now + timedelta(days=1))  # the default channel: held and released
    insert_due(other, due_at=now - timedelta(minutes=1), channels=2)  # ch-0, ch-1: the workers' mail
    settle()
    return database_label()


def act(database_url: str) -> list[tuple[str, int, int, float, float, float]]:
    """Hold, then release, the default channel's items; return each action's numbers
    and the times it started and ended."""
    setup_django(database_url)
    from bumail_queue import queue
    from bumail_queue.operations.bulk import BulkFilter

    done = []
    for name, action in (("hold", queue.hold), ("release", queue.release)):
        start = time.perf_counter()
        result = action(BulkFilter(channel="default"), by="bench")
        end = time.perf_counter()
        done.append((name, result.count, result.batches, end - start, start, end))
    return done


def measure(database_url: str, *, n: int, other: int, workers: int) -> list[list[str]]:
    label = in_child(seed, database_url, n, other)
    ctx = _spawn()
    ready, stop = ctx.Event(), ctx.Event()
    processes, pipes = [], []
    for number in range(workers):
        receiver, sender = ctx.Pipe(duplex=False)
        process = ctx.Process(target=claimer, args=(database_url, f"w{number}", ready, stop, sender))
        process.start()
        sender.close()
        processes.append(process)
        pipes.append(receiver)
    time.sleep(2)  # the workers' start-up, before they claim
    ready.set()
    try:
        actions = in_child(act, database_url)
    finally:
        stop.set()
    claims = [claim for pipe in pipes for claim in pipe.recv()]
    for process in processes:
        process.join()
    rows = []
    for name, count, batches, seconds, start, end in actions:
        during = [length for began, length in claims if start <= began <= end]
        if not during:
            raise BenchError(f"No claim was made during the {name}.")
        rows.append(
            [
                label,
                name,
                f"{count:,}",
                str(batches),
                f"{seconds:.2f}",
                f"{count / seconds:,.0f}",
                f"{len(during):,}",
                f"{statistics.median(during) * 1000:.2f}",
                f"{max(during) * 1000:.1f}",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="items held and released")
    parser.add_argument("--other", type=int, default=50_000, help="items the workers claim meanwhile")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES)
    parser.add_argument("--redis", default=DEFAULT_REDIS)
    parser.add_argument("--only", default="postgres,redis")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    header = [
        "store",
        "action",
        "items",
        "batches",
        "seconds",
        "items/s",
        "claims meanwhile",
        "median ms",
        "longest ms",
    ]
    rows: list[list[str]] = []
    try:
        if "postgres" in only:
            create_bench_database(args.postgres, DATABASE)
            url = postgres_bench_url(args.postgres, DATABASE)
            try:
                in_child(migrate, url)
                rows += measure(url, n=args.n, other=args.other, workers=args.workers)
            finally:
                drop_bench_database(args.postgres, DATABASE)
        if "redis" in only:
            in_child(migrate, args.redis)
            rows += measure(args.redis, n=args.n, other=args.other, workers=args.workers)
            in_child(_reset, args.redis)
    except BenchError as error:
        print(error, file=sys.stderr)
        return 2
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


def _reset(database_url: str) -> None:
    setup_django(database_url)
    reset_queue()


if __name__ == "__main__":
    sys.exit(main())
