"""Benchmarks of bumail_queue: enqueue, claim, and claim behind a backlog of leases.

    python bench/run.py [--n N] [--only enqueue,claim,backlog,lanes] [--postgres URL] [--redis URL] [--rounds R]

Prints one Markdown table. Compare its rows with each other (ratios within one run on
one machine), never with a table printed by another run. ``bench/README.md`` says what
each row measures.

PostgreSQL: the script creates its own database, ``bumail_bench``, on the server that
``--postgres`` names (dropping a ``bumail_bench`` left over by an interrupted run),
works only in it, and drops it at the end. SQLite: a file in a temporary directory,
removed at the end. Redis (``--redis``, ``none`` to leave it out): the Redis store
under the key prefix ``bumail:bench:``, whose keys the script deletes before and
after each measurement.

Each measurement is made in ``--rounds`` rounds, and the rounds of rows that are
compared with each other alternate, so a burst of load from elsewhere on the machine
spreads over all of them rather than landing on one. Every round runs in a fresh
process (multiprocessing, spawn) set up with ``bench/settings.py`` for one database.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SETTINGS_MODULE = "bench.settings"
BENCH_DATABASE = "bumail_bench"
DEFAULT_POSTGRES = "postgres://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
REDIS_PREFIX = "bumail:bench:"  # bench/settings.py gives the Redis store this prefix
PHASES = ("enqueue", "claim", "backlog", "lanes")

MASS_MESSAGES = 1000  # send_mass_mail(): messages in each measured call
CLAIM_PROCESSES = (1, 4)
BATCH_LIMIT = 100  # the batch variant's claim(limit=...)
BATCH_FACTOR = 10  # the batch variant claims BATCH_FACTOR * n items a round
BACKLOGS = (0, 10_000, 50_000)  # items leased (in flight) when the claim is measured
IN_FLIGHT = "in-flight"  # the owner of the backlog's leases
LANE_CHANNELS = (1, 10, 100)  # channels the due items are spread over, one priority each
WAITING = 50_000  # items not due yet, at a higher priority, in the lanes row that has them

BODY = (
    "Hello,\n\n"
    "Your order has shipped and should arrive within three working days. You can follow\n"
    "the parcel from your account page at any time.\n\n"
    "Thank you for shopping with us.\n"
) * 3
RAW_MESSAGE = (
    b"From: app@example.com\r\nTo: user@example.com\r\nSubject: Your order\r\n"
    b"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n" + BODY.replace("\n", "\r\n").encode()
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class BenchError(Exception):
    """A measurement could not be made (a process failed, a database is unreachable)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """One round of one measurement."""

    items: int
    seconds: float
    latencies: Sequence[float] = ()  # seconds per call, where the measurement is a loop of calls
    calls: int = 0
    ok: bool = True
    check: str = ""
    rows: int | None = None  # rows queued, where the measurement enqueues


@dataclasses.dataclass(kw_only=True)
class Row:
    """One line of the table: the rounds of one measurement, summed up."""

    benchmark: str
    database: str
    processes: int
    unit: str
    samples: list[Sample] = dataclasses.field(default_factory=list)
    ratio_to: Row | None = None
    ratio_label: str = ""

    @property
    def items(self) -> int:
        return sum(s.items for s in self.samples)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.samples)

    @property
    def rate(self) -> float:
        return self.items / self.seconds

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.samples)

    def cells(self, number: int) -> list[str]:
        rates = [s.items / s.seconds for s in self.samples]
        latencies = [x for s in self.samples for x in s.latencies]
        per_round = {s.items for s in self.samples}
        items = f"{len(self.samples)} x {per_round.pop():,}" if len(per_round) == 1 else f"{self.items:,}"
        calls = sum(s.calls for s in self.samples)
        if calls:
            items += f" ({calls:,} calls)"
        failed = [f"round {i}: {s.check}" for i, s in enumerate(self.samples, 1) if not s.ok]
        checks = {s.check for s in self.samples}
        if failed:
            check = "; ".join(failed)
        elif all(s.rows is not None for s in self.samples):
            check = f"{sum(s.rows or 0 for s in self.samples):,} rows queued in all, as many as sent"
        else:
            check = "; ".join(sorted(checks))
        return [
            str(number),
            self.benchmark,
            self.database,
            str(self.processes),
            items,
            f"{self.seconds:.2f} s",
            f"**{self.rate:,.0f}** {self.unit}",
            f"{min(rates):,.0f}-{max(rates):,.0f}",
            f"{statistics.median(latencies) * 1000:.2f} ms" if latencies else "",
            f"x{self.rate / self.ratio_to.rate:.2f} {self.ratio_label}" if self.ratio_to else "",
            check if not failed else f"**FAILED: {check}**",
        ]


HEADER = (
    "#", "benchmark", "database", "processes", "items", "time", "rate",
    "rounds (min-max)", "median per call", "ratio", "check",
)  # fmt: skip


def render(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] * len(HEADER)) + "|"]
    lines += ["| " + " | ".join(row.cells(number)) + " |" for number, row in enumerate(rows, 1)]
    return "\n".join(lines)


# -- processes ---------------------------------------------------------------------------


def _spawn() -> Any:
    return multiprocessing.get_context("spawn")


def child_main(conn: Any, func: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """A spawned process's target: send ``func(*args)``, or its traceback, on ``conn``."""
    try:
        conn.send(("ok", func(*args)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def in_child(func: Callable[..., Any], *args: Any) -> Any:
    """Run ``func(*args)`` in a fresh spawned process and return what it returns."""
    process, receiver = start_child(func, *args)
    value = child_result(process, receiver, func.__name__)
    process.join()
    return value


def start_child(func: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """Start ``func(*args)`` in a fresh spawned process; return it and the end of the
    pipe its result comes on (``child_result``)."""
    ctx = _spawn()
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=child_main, args=(sender, func, args))
    process.start()
    sender.close()
    return process, receiver


def child_result(process: Any, receiver: Any, name: str) -> Any:
    """Wait for what ``child_main`` sends on ``receiver``; a failure is a BenchError."""
    try:
        status, value = receiver.recv()
    except EOFError:
        process.join()
        raise BenchError(f"{name} died (exit code {process.exitcode}).") from None
    if status != "ok":
        raise BenchError(f"{name} failed:\n{value}")
    return value


def is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://", "unix://"))


def setup_django(database_url: str) -> None:
    """Set up Django with the bench settings on ``database_url`` (once per process).

    A Redis URL sets up the Redis store instead (``BENCH_REDIS_URL``); Django's own
    database is then bench/settings.py's default SQLite file, which nothing reads.
    """
    if is_redis(database_url):
        os.environ["BENCH_REDIS_URL"] = database_url
        os.environ.pop("BENCH_DATABASE_URL", None)
    else:
        os.environ["BENCH_DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    import django

    django.setup()


# -- the queue's tables ----------------------------------------------------------------


def _tables() -> tuple[str, str]:
    from django.db import connection

    from bumail_queue.models import Item, Message

    return connection.ops.quote_name(Item._meta.db_table), connection.ops.quote_name(Message._meta.db_table)


def _redis_store() -> Any:
    """Return the Redis store when this process measures Redis, else ``None``."""
    from bumail_queue.stores import get_store
    from bumail_queue.stores.redis import RedisStore

    store = get_store()
    return store if isinstance(store, RedisStore) else None


def reset_queue() -> None:
    """Empty the queue's two tables (and nothing else), or its Redis keys."""
    from django.db import connection

    if (redis_store := _redis_store()) is not None:
        client = redis_store._redis()
        for chunk in _chunks(list(client.scan_iter(match=f"{REDIS_PREFIX}*", count=1000)), 1000):
            client.delete(*chunk)
        return

    items, messages = _tables()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {messages}, {items} RESTART IDENTITY")
        else:
            cursor.execute(f"DELETE FROM {messages}")
            cursor.execute(f"DELETE FROM {items}")


def settle() -> None:
    """Settle the server between set-up and measurement (PostgreSQL only).

    VACUUM ANALYZE the items table, then CHECKPOINT, so the measurement neither meets
    the set-up's dead rows nor shares the disk with the flush of what it wrote (without
    the checkpoint, a round after a large set-up ran measurably slower).
    """
    from django.db import DatabaseError, connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {_tables()[0]}")
        with contextlib.suppress(DatabaseError):  # needs superuser or pg_checkpoint
            cursor.execute("CHECKPOINT")


def _chunks(values: list[Any], size: int) -> Iterable[list[Any]]:
    return (values[i : i + size] for i in range(0, len(values), size))


def count_rows(**filters: Any) -> int:
    from bumail_queue.models import Item

    if (redis_store := _redis_store()) is not None:
        # Only the counts the enqueue and claim rows check: all items, or the unleased.
        client, keys = redis_store._redis(), redis_store.keys
        total = int(client.zcard(keys.items))
        if tuple(sorted(filters.items())) == ():
            return total
        assert filters == {"lease_owner__isnull": True}, filters
        return total - int(client.zcard(keys.leases))

    return Item.objects.filter(**filters).count()


def database_label() -> str:
    from django.db import connection

    if (redis_store := _redis_store()) is not None:
        return f"Redis {redis_store._redis().info('server')['redis_version']}"

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            version = cursor.fetchone()[0].split()[0]
        return f"PostgreSQL {version}"
    return f"SQLite {sqlite3.sqlite_version} (file)"


def insert_due(count: int, *, due_at: datetime, channels: int = 1, priority: int = 0) -> list[str]:
    """Queue ``count`` items due at ``due_at``, with their messages, in one statement.

    Set-up only (PostgreSQL): the rows are those ``add_many`` writes, made by the server.
    On Redis: the store's own ``add_many``, 1,000 items a call. With ``channels`` above
    1 the items are spread over the channels ``ch-0``, ``ch-1``, ... in turn.
    """
    from django.db import connection

    if (redis_store := _redis_store()) is not None:
        return _insert_due_redis(redis_store, count, due_at=due_at, channels=channels, priority=priority)

    items, messages = _tables()
    channel = "'default'" if channels == 1 else f"'ch-' || mod(i, {channels})"
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH new AS (INSERT INTO {items} (id, sender, recipients, size, created_at, next_attempt_at, "
            "attempts, delay_notified, rev, priority, channel) "
            "SELECT gen_random_uuid(), 'app@example.com', "
            "jsonb_build_array(jsonb_build_object('address', 'user' || i || '@example.com', "
            f"'status', 'pending', 'reply', NULL)), %s, %s, %s, 0, false, 0, %s, {channel} "
            "FROM generate_series(1, %s) AS i RETURNING id) "
            f"INSERT INTO {messages} (item_id, data) SELECT id, %s FROM new RETURNING item_id",
            [len(RAW_MESSAGE), due_at, due_at, priority, count, RAW_MESSAGE],
        )
        return [str(row[0]) for row in cursor.fetchall()]


def _insert_due_redis(store: Any, count: int, *, due_at: datetime, channels: int, priority: int) -> list[str]:
    import uuid

    from bumail_queue.items import NewItem

    ids: list[str] = []
    for chunk in _chunks(list(range(count)), 1000):
        items = [
            NewItem(
                id=str(uuid.uuid4()),
                sender="app@example.com",
                recipients=[f"user{i}@example.com"],
                message=RAW_MESSAGE,
                created_at=due_at,
                next_attempt_at=due_at,
                priority=priority,
                channel="default" if channels == 1 else f"ch-{i % channels}",
            )
            for i in chunk
        ]
        ids += [item.id for item in store.add_many(items)]
    return ids


# -- 1, 2: enqueue through Django's mail API ---------------------------------------------


def _send_mail_loop(count: int) -> list[float]:
    from django.core.mail import send_mail

    latencies = []
    for i in range(count):
        start = time.perf_counter()
        send_mail(f"Your order #{i}", BODY, None, [f"user{i}@example.com"])
        latencies.append(time.perf_counter() - start)
    return latencies


def _mass_datatuple(count: int) -> list[tuple[str, str, None, list[str]]]:
    return [(f"Newsletter #{i}", BODY, None, [f"reader{i}@example.com"]) for i in range(count)]


def enqueue_round(database_url: str, count: int) -> tuple[str, Sample, Sample]:
    """One round: ``count`` send_mail() calls, then one send_mass_mail() of MASS_MESSAGES."""
    setup_django(database_url)
    from django.core.mail import send_mass_mail

    label = database_label()
    reset_queue()
    _send_mail_loop(max(20, count // 20))  # warm-up: connection, imports, caches
    send_mass_mail(_mass_datatuple(MASS_MESSAGES // 10))
    reset_queue()
    settle()

    start = time.perf_counter()
    latencies = _send_mail_loop(count)
    seconds = time.perf_counter() - start
    queued = count_rows()
    loop = Sample(
        items=count, seconds=seconds, latencies=latencies, calls=count, rows=queued,
        ok=queued == count, check=f"{queued:,} rows queued for {count:,} messages sent",
    )  # fmt: skip

    reset_queue()
    settle()
    datatuple = _mass_datatuple(MASS_MESSAGES)
    start = time.perf_counter()
    sent = send_mass_mail(datatuple)
    seconds = time.perf_counter() - start
    queued = count_rows()
    mass = Sample(
        items=MASS_MESSAGES, seconds=seconds, calls=1, rows=queued, ok=sent == queued == MASS_MESSAGES,
        check=f"{queued:,} rows queued for {MASS_MESSAGES:,} messages sent; send_mass_mail() returned {sent:,}",
    )  # fmt: skip
    reset_queue()
    return label, loop, mass


# -- 3, 4: claims -------------------------------------------------------------------------


def claim_worker(database_url: str, owner: str, limit: int, now: datetime, barrier: Any, conn: Any) -> None:
    """Claim with ``limit`` until a claim takes nothing; send back times, latencies and ids."""
    try:
        setup_django(database_url)
        from bumail_queue.stores import get_store

        store = get_store()
        lease_until = now + store.settings.lease
        # Warm-up: the same statement at a time when nothing is due takes nothing.
        for _ in range(5):
            store.claim(owner=owner, now=EPOCH, lease_until=EPOCH + store.settings.lease, limit=limit)
        barrier.wait(timeout=300)
        ids: list[str] = []
        latencies: list[float] = []
        start = time.perf_counter()
        while True:
            before = time.perf_counter()
            claimed = store.claim(owner=owner, now=now, lease_until=lease_until, limit=limit)
            latencies.append(time.perf_counter() - before)
            if not claimed:
                break
            ids.extend(item.id for item in claimed)
        end = time.perf_counter()
        conn.send(("ok", (start, end, latencies, ids)))
    except BaseException:
        barrier.abort()
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_claimers(
    database_url: str, *, processes: int, limit: int, now: datetime
) -> tuple[float, list[float], list[str]]:
    """Start ``processes`` claim workers together; time from the first start to the last end."""
    ctx = _spawn()
    barrier = ctx.Barrier(processes)
    pipes, workers = [], []
    for number in range(processes):
        receiver, sender = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=claim_worker, args=(database_url, f"bench-{number}", limit, now, barrier, sender))
        worker.start()
        sender.close()
        pipes.append(receiver)
        workers.append(worker)
    results, errors = [], []
    for receiver, worker in zip(pipes, workers, strict=True):
        try:
            status, value = receiver.recv()
        except EOFError:
            status, value = "error", f"a claim worker died (exit code {worker.exitcode})"
        (results if status == "ok" else errors).append(value)
    for worker in workers:
        worker.join()
    if errors:
        raise BenchError("claim worker failed:\n" + "\n".join(errors))
    # perf_counter is a system-wide monotonic clock: the workers' readings compare.
    seconds = max(end for _, end, _, _ in results) - min(start for start, _, _, _ in results)
    latencies = [x for _, _, lat, _ in results for x in lat]
    claimed = [item_id for *_, ids in results for item_id in ids]
    return seconds, latencies, claimed


def exactly_once(seeded: Iterable[str], claimed: list[str]) -> tuple[bool, str]:
    """Compare what was claimed with what was seeded: each item once, no other item."""
    expected = set(seeded)
    counts = Counter(claimed)
    twice = sum(1 for c in counts.values() if c > 1)
    never = len(expected - counts.keys())
    strangers = len(counts.keys() - expected)
    if not (twice or never or strangers):
        return True, f"each of {len(expected):,} claimed exactly once, every round"
    return False, f"{twice} claimed more than once, {never} never claimed, {strangers} not due"


def measure_claims(
    database_url: str, *, count: int, processes: int, limit: int, channels: int = 1, waiting: int = 0
) -> Sample:
    """Queue ``count`` due items, claim them all with ``processes`` workers, check the result
    (``waiting``: how many items not due were queued before, and must be left alone)."""
    now = datetime.now(UTC)
    seeded = insert_due(count, due_at=now - timedelta(minutes=5), channels=channels)
    settle()
    seconds, latencies, claimed = run_claimers(database_url, processes=processes, limit=limit, now=now)
    ok, check = exactly_once(seeded, claimed)
    unleased = count_rows(lease_owner__isnull=True)
    if unleased != waiting:
        ok, check = False, f"{check}; {unleased:,} rows left unleased, not {waiting:,}"
    return Sample(items=len(claimed), seconds=seconds, latencies=latencies, calls=len(latencies), ok=ok, check=check)


def claim_phase(database_url: str, n: int, rounds: int) -> list[Row]:
    """Claims by 1 and by 4 processes, with limit=1 and with limit=BATCH_LIMIT."""
    setup_django(database_url)
    label = database_label()
    rows: dict[tuple[int, int], Row] = {}
    for limit in (1, BATCH_LIMIT):
        for processes in CLAIM_PROCESSES:
            rows[limit, processes] = Row(
                benchmark=f"claim(limit={limit}) until none is left",
                database=label, processes=processes, unit="items claimed/s",
            )  # fmt: skip
            if processes != CLAIM_PROCESSES[0]:
                rows[limit, processes].ratio_to = rows[limit, CLAIM_PROCESSES[0]]
                rows[limit, processes].ratio_label = f"of {CLAIM_PROCESSES[0]} process"
    for _ in range(rounds):
        for (limit, processes), row in rows.items():
            reset_queue()
            count = n if limit == 1 else n * BATCH_FACTOR
            row.samples.append(measure_claims(database_url, count=count, processes=processes, limit=limit))
    reset_queue()
    return list(rows.values())


def lease_backlog(count: int, *, now: datetime) -> int:
    """Put ``count`` items in flight: one INSERT ... SELECT generate_series, then one claim."""
    from bumail_queue.stores import get_store

    insert_due(count, due_at=now - timedelta(hours=1))
    # Leased by the store's own claim, as a worker does: one statement for all of them.
    leased = get_store().claim(owner=IN_FLIGHT, now=now, lease_until=now + timedelta(hours=1), limit=count)
    return len(leased)


def backlog_round(database_url: str, n: int, rows: dict[Any, Row]) -> None:
    """One round of every backlog row (and of the control), in order."""
    from django.db import connection

    items, messages = _tables()
    for backlog in BACKLOGS:
        reset_queue()
        now = datetime.now(UTC)
        leased = lease_backlog(backlog, now=now) if backlog else 0
        sample = measure_claims(database_url, count=n, processes=1, limit=1)
        held = count_rows(lease_owner=IN_FLIGHT, lease_expires_at__gt=now)
        if leased != backlog or held != backlog:
            sample = dataclasses.replace(
                sample, ok=False, check=f"{sample.check}; backlog: {leased:,} leased, {held:,} still held"
            )
        rows[backlog].samples.append(sample)

    # The control: the same leases, but each item's next_attempt_at put back to its due
    # time (by hand, as the store never leaves it), so they stay at the front of the due
    # index. This is what the bench would show if a lease did not move next_attempt_at.
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {messages} WHERE item_id IN (SELECT id FROM {items} WHERE lease_owner <> %s)", [IN_FLIGHT]
        )
        cursor.execute(f"DELETE FROM {items} WHERE lease_owner <> %s", [IN_FLIGHT])
        cursor.execute(f"UPDATE {items} SET next_attempt_at = created_at WHERE lease_owner = %s", [IN_FLIGHT])
    sample = measure_claims(database_url, count=max(10, n // 10), processes=1, limit=1)
    rows["control"].samples.append(sample)


def backlog_phase(database_url: str, n: int, rounds: int) -> list[Row]:
    """claim(limit=1) by one process behind 0, 10,000 and 50,000 leased items."""
    setup_django(database_url)
    label = database_label()
    rows: dict[Any, Row] = {}
    for backlog in BACKLOGS:
        rows[backlog] = Row(
            benchmark=f"claim(limit=1) behind {backlog:,} leased items",
            database=label, processes=1, unit="items claimed/s",
        )  # fmt: skip
    top = BACKLOGS[-1]
    rows["control"] = Row(
        benchmark=f"control: behind {top:,} leased items kept at the front of the due index by hand",
        database=label, processes=1, unit="items claimed/s",
    )  # fmt: skip
    for key, row in rows.items():
        if key != BACKLOGS[0]:
            row.ratio_to, row.ratio_label = rows[BACKLOGS[0]], f"of {BACKLOGS[0]:,} leased"
    for _ in range(rounds):
        backlog_round(database_url, n, rows)
    reset_queue()
    return list(rows.values())


def lanes_phase(database_url: str, n: int, rounds: int) -> list[Row]:
    """claim(limit=BATCH_LIMIT) by one process, the due items in 1, 10 and 100 channels,
    and in one channel behind WAITING items not due yet at a higher priority."""
    setup_django(database_url)
    label = database_label()
    count = n * BATCH_FACTOR
    rows: dict[Any, Row] = {}
    for channels in LANE_CHANNELS:
        rows[channels] = Row(
            benchmark=f"claim(limit={BATCH_LIMIT}) until none is left, due items in {channels} channel"
            + ("s" if channels != 1 else ""),
            database=label, processes=1, unit="items claimed/s",
        )  # fmt: skip
    rows["waiting"] = Row(
        benchmark=f"claim(limit={BATCH_LIMIT}), 1 channel, behind {WAITING:,} items due in a day at priority 10",
        database=label, processes=1, unit="items claimed/s",
    )  # fmt: skip
    for key, row in rows.items():
        if key != LANE_CHANNELS[0]:
            row.ratio_to, row.ratio_label = rows[LANE_CHANNELS[0]], "of 1 channel"
    for _ in range(rounds):
        for key, row in rows.items():
            reset_queue()
            if key == "waiting":
                insert_due(WAITING, due_at=datetime.now(UTC) + timedelta(days=1), priority=10)
                settle()
            channels, waiting = (1, WAITING) if key == "waiting" else (key, 0)
            row.samples.append(
                measure_claims(
                    database_url, count=count, processes=1, limit=BATCH_LIMIT, channels=channels, waiting=waiting
                )
            )
    reset_queue()
    return list(rows.values())


# -- databases ----------------------------------------------------------------------------


def migrate(database_url: str) -> None:
    setup_django(database_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def postgres_bench_url(server_url: str, database: str = BENCH_DATABASE) -> str:
    parts = urlsplit(server_url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise BenchError(f"--postgres must be a postgres:// URL; got scheme {parts.scheme!r}.")
    if parts.path.lstrip("/") == database:
        raise BenchError(f"--postgres must name a database other than {database!r} to connect to first.")
    return urlunsplit(parts._replace(path=f"/{database}"))


def _admin_connection(server_url: str) -> Any:
    import psycopg

    parts = urlsplit(server_url)
    try:
        return psycopg.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=parts.username or None,
            password=parts.password or None,
            dbname=parts.path.lstrip("/") or "postgres",
            autocommit=True,
            connect_timeout=10,
        )
    except psycopg.OperationalError as error:
        raise BenchError(f"PostgreSQL at {parts.hostname}:{parts.port or 5432} cannot be reached: {error}") from error


def create_bench_database(server_url: str, database: str = BENCH_DATABASE) -> None:
    """Create ``database`` anew (dropping one an interrupted run left)."""
    from psycopg import sql

    with _admin_connection(server_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(database)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def drop_bench_database(server_url: str, database: str = BENCH_DATABASE) -> None:
    from psycopg import sql

    with _admin_connection(server_url) as conn:
        force = " WITH (FORCE)" if conn.info.server_version >= 130000 else ""
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}" + force).format(sql.Identifier(database)))


# -- the run ------------------------------------------------------------------------------


def enqueue_rows(sqlite_url: str, postgres_url: str, n: int, rounds: int, redis_url: str | None = None) -> list[Row]:
    """Rows 1 and 2 on each store; the rounds alternate SQLite, PostgreSQL (and Redis)."""
    loops: dict[str, Row] = {}
    masses: dict[str, Row] = {}
    sizes = [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]
    urls = (sqlite_url, postgres_url) if redis_url is None else (sqlite_url, postgres_url, redis_url)
    for size in sizes:
        for url in urls:
            label, loop, mass = in_child(enqueue_round, url, size)
            if url not in loops:
                loops[url] = Row(benchmark="send_mail() in a loop", database=label, processes=1, unit="messages/s")
                masses[url] = Row(
                    benchmark=f"send_mass_mail() of {MASS_MESSAGES:,} messages, one call a round",
                    database=label, processes=1, unit="messages/s",
                    ratio_to=loops[url], ratio_label="of the send_mail() loop",
                )  # fmt: skip
            loops[url].samples.append(loop)
            masses[url].samples.append(mass)
    return [row for url in urls for row in (loops[url], masses[url])]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmarks of bumail_queue (see bench/README.md).")
    parser.add_argument(
        "--n", type=int, default=2000,
        help="send_mail() calls per database, and due items per claim round (default 2000)",
    )  # fmt: skip
    parser.add_argument("--only", default=",".join(PHASES), help=f"a comma-separated subset of {','.join(PHASES)}")
    parser.add_argument(
        "--postgres", default=DEFAULT_POSTGRES, metavar="URL",
        help=f"the PostgreSQL server (default {DEFAULT_POSTGRES}); the bench works in its own database {BENCH_DATABASE!r}",
    )  # fmt: skip
    parser.add_argument(
        "--redis", default=os.environ.get("REDIS_URL") or DEFAULT_REDIS, metavar="URL",
        help=f"the Redis of the Redis store's rows (default $REDIS_URL or {DEFAULT_REDIS}; 'none' leaves them out); "
        f"the bench uses and deletes the keys under {REDIS_PREFIX!r}",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measurement (default 3)")
    args = parser.parse_args(argv)
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(args.only) - set(PHASES))
    if unknown or not args.only:
        parser.error(
            f"--only takes a comma-separated subset of {','.join(PHASES)}; got {','.join(unknown) or 'nothing'}"
        )
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if args.n < 10 * args.rounds:
        parser.error("--n must be at least 10 times --rounds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import django

    started = time.perf_counter()
    postgres_url = postgres_bench_url(args.postgres)
    redis_url = None if args.redis == "none" else args.redis
    sqlite_dir = Path(tempfile.mkdtemp(prefix="bumail-bench-"))
    sqlite_url = f"sqlite:///{sqlite_dir / 'bench.sqlite3'}"
    rows: list[Row] = []
    try:
        create_bench_database(args.postgres)
        try:
            in_child(migrate, postgres_url)
            if "enqueue" in args.only:
                in_child(migrate, sqlite_url)
                rows += enqueue_rows(sqlite_url, postgres_url, args.n, args.rounds, redis_url)
            if "claim" in args.only:
                rows += in_child(claim_phase, postgres_url, args.n, args.rounds)
                if redis_url is not None:
                    rows += in_child(claim_phase, redis_url, args.n, args.rounds)
            if "backlog" in args.only:
                rows += in_child(backlog_phase, postgres_url, args.n, args.rounds)
            if "lanes" in args.only:
                rows += in_child(lanes_phase, postgres_url, args.n, args.rounds)
                if redis_url is not None:
                    rows += in_child(lanes_phase, redis_url, args.n, args.rounds)
        finally:
            drop_bench_database(args.postgres)
    except BenchError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(sqlite_dir, ignore_errors=True)

    print(
        f"bumail_queue benchmarks: n={args.n:,}, {args.rounds} rounds; Python {platform.python_version()}, "
        f"Django {django.get_version()}, {os.cpu_count()} CPUs; {time.perf_counter() - started:.0f} s in all.\n"
        "Compare the rows of this table with each other only: timings from another run are not comparable.\n"
    )
    print(render(rows))
    failed = [row for row in rows if not row.ok]
    if failed:
        print(f"\n{len(failed)} row(s) failed their check.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
