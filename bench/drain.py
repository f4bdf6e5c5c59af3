"""How fast one worker drains the queue to a local SMTP sink, and to a distant one.

    python bench/drain.py [--n N] [--concurrency C] [--postgres URL] [--redis URL] [--smtp-sink PATH] [--dkim]
                          [--suppression] [--shaping] [--only local,distant] [--n-remote N] [--remote-delay-ms MS]

``local``: one Markdown table: for SQLite, PostgreSQL and Redis (with PostgreSQL as
Django's database, which keeps the delivery log), ``queue.deliver_due()`` (the
worker's own loop, claims, sessions and records) with connection reuse on and off,
and, as the ceiling, plain ``smtplib`` sending the same messages over one connection
with no queue at all. Each worker row also says how fast its messages were enqueued,
one ``enqueue()`` each, as ``send_mail()`` makes them. ``--dkim`` adds SQLite rows whose mail is signed with an
RSA-2048 or an Ed25519 key; ``--suppression`` adds, for each store, a row with
``SUPPRESSION`` off beside the default (on), the suppression list's cost.
``--shaping`` adds, for each store, the rows of a ``SHAPING`` entry whose limits are
never reached, so that what they cost is the store's round trips alone: ``RATE`` (one
per session) beside the row with connection reuse on, ``CONCURRENCY`` (one before and
one after each session, and no reuse) beside the row with reuse off. The sink is
Postfix's ``smtp-sink`` on a loopback port.

``distant``: a second table, on PostgreSQL, with the worker's default settings, to
``bench/distant_sink.py`` (aiosmtpd, in a process of its own): a smarthost that waits
``--remote-delay-ms`` before each reply to a final dot (the peer harness's S6), and a
server that far away on every round trip, each with and without PIPELINING. Its rows
say what bounds a worker where waiting, not CPU, decides; the rows of two workers
(two processes sharing the queue, as the harness's S6w2) say how that scales. Every
worker is timed from the moment all of them are ready to deliver, so what a row
measures is delivery, without a process's start-up.

Compare the rows of one table with each other only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import os
import shutil
import smtplib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402 - the path above comes first
    DEFAULT_POSTGRES,
    DEFAULT_REDIS,
    child_result,
    create_bench_database,
    database_label,
    drop_bench_database,
    in_child,
    migrate,
    postgres_bench_url,
    reset_queue,
    settle,
    setup_django,
    start_child,
)

SINK_PORT = 52700

# SHAPING entries whose limits a drain never reaches: what is measured is the cost of
# asking the store, by the rows with connection reuse on (RATE: one round trip per
# session, reuse kept) and off (CONCURRENCY: one round trip before and one after,
# and a counted session keeps no connection anyway).
SHAPED = {
    True: ("worker, reuse on, SHAPING RATE never reached", {"*": {"RATE": "1000000/s"}}),
    False: ("worker, reuse off, SHAPING CONCURRENCY never reached", {"*": {"CONCURRENCY": 1000}}),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def smtp_sink(path: str, port: int) -> Iterator[None]:
    """Run Postfix's smtp-sink on 127.0.0.1:port; stop it (by its pid) afterwards."""
    process = subprocess.Popen([path, "-u", "root", f"127.0.0.1:{port}", "256"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.05)
        yield
    finally:
        process.terminate()
        process.wait(10)


def messages(n: int) -> list[object]:
    from django.core.mail import EmailMessage

    body = "Hello,\n\n" + "A line of an ordinary notification mail, for the bench.\n" * 35
    return [EmailMessage(f"drain-{i}", body, "app@example.com", [f"rcpt-{i}@example.test"]) for i in range(n)]


def drain_round(
    database_url: str,
    n: int,
    concurrency: int,
    reuse: float,
    port: int,
    redis_url: str | None = None,
    dkim: list[dict[str, str]] | None = None,
    extra: dict[str, object] | None = None,
) -> tuple[str, float, int, float]:
    """Enqueue n one by one, as ``send_mail()`` does, then time one burst of the worker;
    return (store, seconds of the burst, delivered, seconds of the enqueues)."""
    if redis_url is not None:
        os.environ["BENCH_REDIS_URL"] = redis_url  # the queue in Redis, Django's database beside it
    setup_django(database_url)
    from django.conf import settings as django_settings
    from django.test.utils import override_settings

    from bumail_queue.service import QueueService

    reset_queue()
    settings = {
        **django_settings.BUMAIL_QUEUE,
        "HOSTNAME": "bench.example.com",
        "ROUTE": {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": port, "TLS": "none"},
        "CONNECTION_REUSE_SECONDS": reuse,
        "CONCURRENCY": concurrency,
        "DKIM": dkim or [],
        **(extra or {}),
    }
    with override_settings(BUMAIL_QUEUE=settings):
        service = QueueService()
        batch = messages(n)
        began = time.perf_counter()
        for message in batch:
            service.enqueue(message)
        enqueued = time.perf_counter() - began
        settle()
        started = time.perf_counter()
        stats = service.deliver_due()
        seconds = time.perf_counter() - started
    return database_label(), seconds, stats.delivered, enqueued


def dkim_signer(algorithm: str) -> dict[str, str]:
    """A signer of the bench's From domain with a key made now: RSA of 2,048 bits or Ed25519."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    key = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if algorithm == "rsa-sha256"
        else ed25519.Ed25519PrivateKey.generate()
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {"DOMAIN": "example.com", "SELECTOR": "bench", "KEY": pem, "ALGORITHM": algorithm}


def smtplib_round(n: int, port: int) -> float:
    """Send n prepared messages over one smtplib connection; return the seconds."""
    setup_django("sqlite:///" + str(Path(tempfile.gettempdir()) / "bumail-drain-smtplib.sqlite3"))
    from django.core.mail import EmailMessage

    prepared = [(m.from_email, m.to, m.message().as_bytes()) for m in messages(n) if isinstance(m, EmailMessage)]
    started = time.perf_counter()
    with smtplib.SMTP("127.0.0.1", port) as client:
        for sender, recipients, data in prepared:
            client.sendmail(sender, recipients, data)
    return time.perf_counter() - started


@dataclasses.dataclass(frozen=True, kw_only=True)
class Distant:
    """One row of the distant table: how the sink is far, and the worker's settings."""

    what: str
    every_round_trip: bool = False
    pipelining: bool = True
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    share: int = 1  # the row drains n_remote / share messages (one connection is slow)
    workers: int = 1  # worker processes sharing the queue, each with the default settings


def distant_rows(delay_ms: float) -> list[Distant]:
    at_dot = f"{delay_ms:g} ms before each reply to the final dot"
    away = f"{delay_ms:g} ms away (every round trip)"
    return [
        Distant(what=f"{at_dot}, no PIPELINING, DOMAIN_CONCURRENCY 5 (the former default)", pipelining=False,
                settings={"DOMAIN_CONCURRENCY": 5}),
        Distant(what=f"{at_dot}, no PIPELINING (the peer harness's S6)", pipelining=False),
        Distant(what=f"{at_dot}, no PIPELINING, two workers (the peer harness's S6w2)", pipelining=False,
                workers=2),
        Distant(what=f"{at_dot}, PIPELINING"),
        Distant(what=f"{at_dot}, PIPELINING, two workers", workers=2),
        Distant(what=f"{away}, PIPELINING", every_round_trip=True),
        Distant(what=f"{away}, no PIPELINING", every_round_trip=True, pipelining=False),
        Distant(what=f"{away}, PIPELINING, one connection (DOMAIN_CONCURRENCY 1)", every_round_trip=True,
                settings={"DOMAIN_CONCURRENCY": 1}, share=10),
        Distant(what=f"{away}, no PIPELINING, one connection", every_round_trip=True, pipelining=False,
                settings={"DOMAIN_CONCURRENCY": 1}, share=10),
    ]  # fmt: skip


@contextlib.contextmanager
def distant_sink(port: int, row: Distant, delay_ms: float, counts: list[int]) -> Iterator[None]:
    """Run ``bench/distant_sink.py`` on 127.0.0.1:port; stop it (by its pid) and put its counts in ``counts``."""
    count_file = Path(tempfile.mkdtemp(prefix="bumail-distant-")) / "count"
    command = [sys.executable, str(ROOT / "bench" / "distant_sink.py"), "--port", str(port)]
    command += ["--delay-ms", str(delay_ms), "--count-file", str(count_file)]
    command += ["--every-round-trip"] * row.every_round_trip + ["--no-pipelining"] * (not row.pipelining)
    process = subprocess.Popen(command)
    try:
        wait_for_port(port)
        yield
    finally:
        process.terminate()
        process.wait(10)
        counts.extend(int(x) for x in count_file.read_text().split())
        shutil.rmtree(count_file.parent)


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)


def enqueue_distant(database_url: str, n: int) -> None:
    """Empty the queue and enqueue n messages, one ``enqueue()`` each (set-up, not timed)."""
    setup_django(database_url)
    from bumail_queue.service import QueueService

    reset_queue()
    QueueService().enqueue_many(messages(n))
    settle()


def distant_worker(database_url: str, port: int, extra: dict[str, Any], ready: Any) -> tuple[float, int]:
    """Set up, wait at ``ready`` (a barrier the parent times from), then run one burst of
    the worker with its default settings but ``extra``; return (CPU seconds, delivered)."""
    try:
        setup_django(database_url)
        from django.conf import settings as django_settings
        from django.test.utils import override_settings

        from bumail_queue.service import QueueService

        settings = {
            **django_settings.BUMAIL_QUEUE,
            "HOSTNAME": "bench.example.com",
            "ROUTE": {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": port, "TLS": "none"},
            **extra,
        }
        with override_settings(BUMAIL_QUEUE=settings):
            service = QueueService()
            ready.wait(timeout=120)
            cpu = time.process_time()
            stats = service.deliver_due()
            cpu = time.process_time() - cpu
    except BaseException:
        ready.abort()  # the parent stops waiting and reports this traceback
        raise
    return cpu, stats.delivered


def distant_round(database_url: str, n: int, port: int, row: Distant) -> tuple[float, float, int]:
    """Enqueue n, then time ``row.workers`` worker processes draining them together;
    return (seconds, the workers' CPU seconds, delivered).

    The seconds run from the moment every worker is set up and ready to the last one's
    result: the drain alone, which is what two workers share.
    """
    in_child(enqueue_distant, database_url, n)
    ready = multiprocessing.get_context("spawn").Barrier(row.workers + 1)
    workers = [start_child(distant_worker, database_url, port, row.settings, ready) for _ in range(row.workers)]
    try:
        try:
            ready.wait(timeout=120)
        except threading.BrokenBarrierError:
            for process, receiver in workers:
                child_result(process, receiver, "distant_worker")  # raises the failed one's traceback
            raise
        started = time.perf_counter()
        results = [child_result(process, receiver, "distant_worker") for process, receiver in workers]
        seconds = time.perf_counter() - started
    finally:
        for process, _ in workers:
            process.join(10)
    return seconds, sum(cpu for cpu, _ in results), sum(delivered for _, delivered in results)


def distant_table(postgres_url: str, n: int, delay_ms: float) -> list[str]:
    lines = [
        f"| distant sink, worker defaults, PostgreSQL, {n:,} messages | messages/s | of one worker "
        "| workers' CPU per message | check |",
        "|---|---|---|---|---|",
    ]
    one_worker: dict[tuple[bool, bool], float] = {}  # (every round trip, PIPELINING) -> rate
    for row in distant_rows(delay_ms):
        port, counts, count = free_port(), [], max(1, n // row.share)
        with distant_sink(port, row, delay_ms, counts):
            seconds, cpu, delivered = distant_round(postgres_url, count, port, row)
        check = "ok" if delivered == count and counts == [count, count] else f"delivered {delivered}, sink {counts}"
        what = row.what + (f", {count:,} messages" if row.share > 1 else "")
        rate, way = delivered / seconds, (row.every_round_trip, row.pipelining)
        if row.workers == 1 and row.share == 1 and not row.settings:
            one_worker[way] = rate
        scaling = f"x{rate / one_worker[way]:.2f}" if row.workers > 1 and way in one_worker else "-"
        cpu_each = f"{cpu / max(delivered, 1) * 1000:.2f} ms"
        lines.append(f"| {what} | {rate:,.0f} | {scaling} | {cpu_each} | {check} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES)
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL") or DEFAULT_REDIS, help="'none' leaves Redis out")
    parser.add_argument("--smtp-sink", default=shutil.which("smtp-sink") or "/usr/sbin/smtp-sink")
    parser.add_argument(
        "--dkim", action="store_true", help="add rows signed with RSA-2048 and Ed25519 (SQLite, reuse on; extra dkim)"
    )
    parser.add_argument(
        "--suppression", action="store_true", help="add rows with SUPPRESSION off (reuse on), for the list's cost"
    )
    parser.add_argument(
        "--shaping", action="store_true", help="add rows with a SHAPING entry never reached: its round trips' cost"
    )
    parser.add_argument("--only", default="local,distant", help="the tables to make: local, distant or both")
    parser.add_argument("--n-remote", type=int, default=1000, help="messages of each distant row (default 1000)")
    parser.add_argument("--remote-delay-ms", type=float, default=50, help="how far the distant sink is (default 50)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only <= {"local", "distant"}:
        print(f"--only takes local, distant or both; got {args.only!r}", file=sys.stderr)
        return 2
    if "local" in only and not Path(args.smtp_sink).exists():
        print("smtp-sink not found (Debian: apt-get install postfix); give --smtp-sink PATH", file=sys.stderr)
        return 2
    port = free_port()
    sqlite_url = "sqlite:///" + str(Path(tempfile.mkdtemp(prefix="bumail-drain-")) / "queue.sqlite3")
    postgres_url = postgres_bench_url(args.postgres)
    create_bench_database(args.postgres)
    rows = []
    distant: list[str] = []
    try:
        if "distant" in only:
            in_child(migrate, postgres_url)
            distant = distant_table(postgres_url, args.n_remote, args.remote_delay_ms)
        if "local" not in only:
            print("\n".join(distant))
            return 0
        for url in (sqlite_url, postgres_url):
            in_child(migrate, url)
        with smtp_sink(args.smtp_sink, port):
            baseline = in_child(smtplib_round, args.n, port)
            rows.append(("plain smtplib, one connection, no queue", "-", 1, args.n / baseline, None, ""))
            stores = [(sqlite_url, None), (postgres_url, None)]
            if args.redis != "none":
                stores.append((postgres_url, args.redis))
            for url, redis_url in stores:
                for reuse in (10.0, 0.0):
                    label, seconds, delivered, enqueued = in_child(
                        drain_round, url, args.n, args.concurrency, reuse, port, redis_url
                    )
                    check = "ok" if delivered == args.n else f"only {delivered} delivered"
                    rows.append(
                        (
                            f"worker, connection reuse {'on' if reuse else 'off'}",
                            label,
                            args.concurrency,
                            delivered / seconds,
                            args.n / enqueued,
                            check,
                        )
                    )
                    if args.shaping:
                        what, shaping = SHAPED[reuse > 0]
                        label, seconds, delivered, enqueued = in_child(
                            drain_round,
                            url,
                            args.n,
                            args.concurrency,
                            reuse,
                            port,
                            redis_url,
                            None,
                            {"SHAPING": shaping},
                        )
                        check = "ok" if delivered == args.n else f"only {delivered} delivered"
                        rows.append((what, label, args.concurrency, delivered / seconds, args.n / enqueued, check))
            if args.suppression:
                for url, redis_url in stores:
                    label, seconds, delivered, enqueued = in_child(
                        drain_round, url, args.n, args.concurrency, 10.0, port, redis_url, None, {"SUPPRESSION": False}
                    )
                    check = "ok" if delivered == args.n else f"only {delivered} delivered"
                    rows.append(
                        (
                            "worker, reuse on, SUPPRESSION off",
                            label,
                            args.concurrency,
                            delivered / seconds,
                            args.n / enqueued,
                            check,
                        )
                    )
            if args.dkim:
                for algorithm in ("rsa-sha256", "ed25519-sha256"):
                    signer = dkim_signer(algorithm)
                    label, seconds, delivered, enqueued = in_child(
                        drain_round, sqlite_url, args.n, args.concurrency, 10.0, port, None, [signer]
                    )
                    check = "ok" if delivered == args.n else f"only {delivered} delivered"
                    what = f"worker, reuse on, DKIM {algorithm}"
                    rows.append((what, label, args.concurrency, delivered / seconds, args.n / enqueued, check))
    finally:
        drop_bench_database(args.postgres)
    best = rows[0][3]
    print(f"drain of {args.n} messages to smtp-sink on loopback; compare rows of this table only\n")
    print("| what | store | concurrency | messages/s | of plain smtplib | enqueued/s | check |")
    print("|---|---|---|---|---|---|---|")
    for what, database, concurrency, rate, enqueue_rate, check in rows:
        enqueues = "-" if enqueue_rate is None else f"{enqueue_rate:,.0f}"
        print(f"| {what} | {database} | {concurrency} | {rate:,.0f} | x{rate / best:.2f} | {enqueues} | {check} |")
    if distant:
        print()
        print("\n".join(distant))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
