"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import email.message
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from email.generator import BytesGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import django.core.mail
from django.db import connection
from django.test import override_settings

from bumail_queue.conf import Route, Timeouts
from bumail_queue.delivery.envelope import Delivery, Envelope, Host
from bumail_queue.items import Outcome, RecipientStatus, Reply

if TYPE_CHECKING:
    from bumail_queue.delivery.smtp import SMTPDelivery, SMTPTransport
    from tests.servers.hostile_smtp import HostileSMTPServer
    from tests.servers.smtp import SMTPTestServer

BACKEND = "bumail_queue.backends.QueueEmailBackend"

ROOT = Path(__file__).resolve().parent.parent


def use_queue_backend() -> override_settings:
    """Make Django's mail API use the queue again (the test runner swaps in locmem).

    Django 6.1 reads ``MAILERS``; older versions read ``EMAIL_BACKEND``.
    """
    if hasattr(django.core.mail, "mailers"):
        return override_settings(MAILERS={"default": {"BACKEND": BACKEND}})
    return override_settings(EMAIL_BACKEND=BACKEND)


def wait_until(predicate: Callable[[], object], seconds: float = 20) -> bool:
    """Wait for ``predicate()`` to hold, up to a bound generous enough for a busy machine.

    Returns whether it held; tests assert on that, never on how long it took.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def as_wire_bytes(message: email.message.Message) -> bytes:
    """Return a message of Django's (compat32 on Django 5.2, ``EmailMessage`` on 6.x) with CRLF lines."""
    # The generator, as neither as_bytes() takes both of the two's arguments.
    buffer = io.BytesIO()
    BytesGenerator(buffer, mangle_from_=False, policy=message.policy.clone(linesep="\r\n")).flatten(message)
    return buffer.getvalue()


class FakeClock:
    """A clock a test moves by hand (``clock.now += 60``): no test waits for time to pass."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedTransport:
    """A worker's transport that answers each recipient from ``replies`` (address ->
    ``Reply``) and ``default`` for the rest, as ``remote_host``; it records each envelope."""

    def __init__(self, replies=None, *, on_deliver=None, default=None, remote_host="relay.example.net"):
        self.replies = replies or {}
        self.default = default or Reply(code=250, status="2.0.0", text="OK queued")
        self.remote_host = remote_host
        self.envelopes = []
        self.reuse = []  # the reuse= of each delivery
        self.on_deliver = on_deliver
        self.lock = threading.Lock()

    def deliver(self, envelope, *, route, hosts, reuse=True):
        with self.lock:
            self.envelopes.append((envelope, route, tuple(hosts)))
            self.reuse.append(reuse)
        if self.on_deliver:
            self.on_deliver(envelope)
        outcomes = {}
        for address in envelope.recipients:
            reply = self.replies.get(address, self.default)
            status = {2: RecipientStatus.DELIVERED, 4: RecipientStatus.DEFERRED, 5: RecipientStatus.FAILED}[
                reply.code // 100
            ]
            outcomes[address] = Outcome(status=status, reply=reply)
        return Delivery(outcomes=outcomes, remote_host=self.remote_host)

    def close_idle(self):
        pass

    def close(self):
        pass


def smarthost(server, **extra):
    """``BUMAIL_QUEUE`` settings that send everything to ``server`` (a loopback SMTP server)."""
    return {
        "HOSTNAME": "mta.example.com",
        "ROUTE": {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": server.port, "TLS": "none"},
        **extra,
    }


# -- the SMTP client against loopback servers -------------------------------------------

MESSAGE = b"From: sender@example.com\r\nTo: ann@example.org\r\nSubject: Hello\r\n\r\nHello.\r\n"
USER, PASSWORD = "mailer", "test-s3cret-Pa55word"


def timeouts(**steps: float) -> Timeouts:
    """``Timeouts`` of 5 s a step and 60 s a session, but for ``steps``."""
    values = {
        "connect": 5,
        "greeting": 5,
        "mail": 5,
        "rcpt": 5,
        "data": 5,
        "data_block": 5,
        "data_end": 5,
        "session": 60,
    }
    return Timeouts(**{**values, **steps})


def mx(server: SMTPTestServer | HostileSMTPServer, name: str = "mx.test") -> Host:
    """The host ``name`` at ``server``'s loopback port."""
    return Host(name=name, address="127.0.0.1", port=server.port)


def envelope(
    *recipients: str, sender: str = "sender@example.com", message: bytes = MESSAGE, item_id: str = "item-1"
) -> Envelope:
    return Envelope(item_id=item_id, sender=sender, recipients=recipients or ("ann@example.org",), message=message)


def only_reply(delivery: Delivery) -> tuple[RecipientStatus, int | None, str, str]:
    """Return the one (status, code, enhanced status, text) every recipient got."""
    found = {(o.status, o.reply.code, o.reply.status, o.reply.text) for o in delivery.outcomes.values()}
    assert len(found) == 1, found
    return found.pop()


class Followers:
    """A ``follow`` that gives the envelopes of a list, one per call, and counts the calls."""

    def __init__(self, *envelopes: Envelope) -> None:
        self.waiting = list(envelopes)
        self.calls = 0

    def __call__(self) -> Envelope | None:
        self.calls += 1
        return self.waiting.pop(0) if self.waiting else None


def chain(
    transport: SMTPTransport, server: SMTPTestServer | HostileSMTPServer, *envelopes: Envelope
) -> list[SMTPDelivery]:
    """Deliver ``envelopes`` as a worker's thread does: each follows the one before it
    when that one's final dot asks for it, else it starts on its own."""
    follow = Followers(*envelopes[1:])
    deliveries = []
    for e in envelopes:
        if e in follow.waiting:  # no dot asked for it: it was never handed on
            follow.waiting.remove(e)
        deliveries.append(transport.deliver(e, route=Route(type="mx"), hosts=[mx(server)], follow=follow))
    return deliveries


@contextlib.contextmanager
def signals_told(*names: str) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Collect the signals ``names`` of ``bumail_queue.signals`` sent meanwhile, in
    order, as (name, kwargs)."""
    from bumail_queue import signals

    events: list[tuple[str, dict[str, Any]]] = []
    receivers = {}
    for name in names:

        def receiver(sender: Any, name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            events.append((name, kwargs))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    try:
        yield events
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)


# -- queue_worker processes -------------------------------------------------------------


def worker_env(settings):
    """The environment of a ``queue_worker`` process on this test's database and ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUMAIL_", "DJANGO_"))}
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["BUMAIL_TEST_QUEUE"] = json.dumps(settings)
    name = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{name}"
    else:
        params = connection.settings_dict
        env["DATABASE_URL"] = (
            f"postgres://{params['USER']}@{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}/{name}"
        )
    env["PYTHONPATH"] = str(ROOT)
    return env


def start_worker(settings, *args, redis_url=None, clock_ahead=None):
    """A ``queue_worker`` process; ``clock_ahead`` (a ``timedelta``) runs its clock that much later."""
    return start_command(settings, "queue_worker", "-v", "2", *args, redis_url=redis_url, clock_ahead=clock_ahead)


def start_command(settings, name, *args, redis_url=None, clock_ahead=None):
    """A ``manage.py`` command's process on this test's database and ``settings``."""
    env = worker_env(settings)
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    if clock_ahead is not None:
        env["BUMAIL_TEST_CLOCK_AHEAD"] = str(clock_ahead.total_seconds())
    return subprocess.Popen(
        [sys.executable, "-m", "django", name, *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def read_all(worker):
    """Collect what a worker prints, as it prints it (a full pipe would stall it).

    Return the list of lines, and the thread that fills it: join it once the worker
    has exited to have every line.
    """
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(worker.stdout), daemon=True)
    reader.start()
    return lines, reader


@contextlib.contextmanager
def running_worker(settings, *args, redis_url=None, clock_ahead=None):
    """A ``queue_worker`` process and the lines it printed; SIGTERM and a wait at the end."""
    worker = start_worker(settings, *args, redis_url=redis_url, clock_ahead=clock_ahead)
    lines, reader = read_all(worker)
    try:
        yield worker, lines
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
        reader.join(5)
    finally:
        if worker.poll() is None:
            worker.kill()


def printed(lines, text):
    """Whether a worker printed ``text`` on one of ``lines`` (for ``wait_until``)."""
    return lambda: any(text in line for line in list(lines))


# -- what a worker is doing, seen from its store ----------------------------------------


def postgres_worker_idle(owner):
    """Whether the worker ``owner`` is idle on PostgreSQL: its last claim has ended and
    its listener waits on ``LISTEN``, so only a notification or its poll wakes it.

    Queries are sent with their values in the text, so a claim's lease names its owner.
    A claim that finds nothing due ends at its first statement, the lanes' counts, which
    names none: for the tests of one worker, such a connection is that worker's.
    """

    def idle():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT query FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'idle'"
            )
            queries = [query for (query,) in cursor.fetchall()]
        claimed = any(("SKIP LOCKED" in query and owner in query) or "due_lanes" in query for query in queries)
        listening = any(query.lstrip().upper().startswith("LISTEN") for query in queries)
        return claimed and listening

    return idle


@contextlib.contextmanager
def redis_monitor(url) -> Iterator[list[str]]:
    """The commands the Redis server at ``url`` runs while the block runs, one line each
    (``MONITOR``): a command's keys and arguments are on its line."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=5)
    sock.sendall(b"MONITOR\r\n")
    stream = sock.makefile("rb")
    if not stream.readline().startswith(b"+OK"):
        raise AssertionError(f"{url} refused MONITOR")
    sock.settimeout(None)
    lines: list[str] = []

    def read():
        with contextlib.suppress(OSError, ValueError):
            for line in stream:
                lines.append(line.decode("utf-8", "replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield lines
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        reader.join(5)
