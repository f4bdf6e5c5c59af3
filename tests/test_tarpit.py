"""Slow SMTP servers (tarpits) ahead in the queue never starve mail to healthy ones."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connections
from django.test import override_settings

from bumail_queue import queue
from bumail_queue.items import RecipientStatus
from bumail_queue.stores import get_store
from bumail_queue.worker import Worker
from bumail_queue.worker import sessions as worker_sessions
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# Sixty bytes at one every two seconds: the greeting cannot end before the test does.
GREETING = b"220 tarpit.test ESMTP " + b"." * 36 + b"\r\n"
BYTE_INTERVAL = 2.0


class Tarpit:
    """SMTP servers on 127.0.0.1 that send their greeting one byte at a time.

    Each of ``destinations`` listening ports is a destination of its own. The servers
    count the connections ``opened``, those ``open`` now (the client has not closed
    its side), the greeting bytes ``sent`` and the ``greetings`` sent whole.
    """

    def __init__(self, destinations: int) -> None:
        self.destinations = destinations
        self.ports: list[int] = []
        self.opened = 0
        self.open = 0
        self.sent = 0
        self.greetings = 0
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tarpit", daemon=True)

    def start(self) -> Tarpit:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        for _ in range(self.destinations):
            server = await asyncio.start_server(self._serve, host="127.0.0.1", port=0)
            self.ports.append(server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.opened += 1
        self.open += 1
        dribbling = asyncio.ensure_future(self._dribble(writer))
        client_gone = asyncio.ensure_future(reader.read())  # b"" once the client closes
        try:
            await asyncio.wait({dribbling, client_gone}, return_when=asyncio.FIRST_COMPLETED)
            if dribbling.done():
                await client_gone  # the whole greeting sent: say nothing more
        except asyncio.CancelledError:
            pass  # hung up on purpose
        finally:
            dribbling.cancel()
            client_gone.cancel()
            self.open -= 1
            writer.transport.abort()
            self._tasks.discard(task)

    async def _dribble(self, writer: asyncio.StreamWriter) -> None:
        for index in range(len(GREETING)):
            writer.write(GREETING[index : index + 1])
            await writer.drain()
            self.sent += 1
            await asyncio.sleep(BYTE_INTERVAL)
        self.greetings += 1

    def hang_up(self) -> None:
        """Close every connection, as a tarpit that gives up would."""

        async def cancel_all() -> None:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(10)

    def stop(self) -> None:
        self.hang_up()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def tarpit() -> Iterator[Callable[[int], Tarpit]]:
    """Start tarpits on demand: ``tarpit(destinations)``; all stopped afterwards."""
    started: list[Tarpit] = []

    def start(destinations: int) -> Tarpit:
        server = Tarpit(destinations)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def tarpit_settings(tarpit: Tarpit, sink) -> dict:
    """Each tarpit port is the smarthost of one domain; all else goes to ``sink``."""
    routes = {
        f"tarpit{n}.test": {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": port, "TLS": "none"}
        for n, port in enumerate(tarpit.ports)
    }
    smarthost = {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": sink.port, "TLS": "none"}
    return {"HOSTNAME": "mta.example.com", "ROUTE": smarthost, "ROUTES": routes}


def enqueue_to_tarpits(tarpit: Tarpit) -> None:
    for n in range(tarpit.destinations):
        queue.enqueue(
            b"Subject: to a tarpit\r\n\r\nHello.\r\n", sender="app@example.com", recipients=[f"user@tarpit{n}.test"]
        )


@contextlib.contextmanager
def worker_in_a_thread(worker: Worker) -> Iterator[threading.Thread]:
    def run() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()  # this thread's own, as a worker process would at exit

    thread = threading.Thread(target=run, name="tarpit-test-worker")
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()


def delivery_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name.startswith("bumail-queue-delivery-"))


def test_mail_to_a_healthy_server_passes_thirty_tarpits_queued_ahead_of_it(tarpit, smtp_server):
    pits = tarpit(30)
    with override_settings(BUMAIL_QUEUE=tarpit_settings(pits, smtp_server)):
        enqueue_to_tarpits(pits)
        raw = b"Subject: to a healthy server\r\n\r\nHello.\r\n"
        for n in range(100):
            queue.enqueue(raw, sender="app@example.com", recipients=[f"user{n}@example.org"])
        worker = Worker()  # the default CONCURRENCY, DOMAIN_CONCURRENCY, CLAIM_BATCH_SIZE and TIMEOUTS
        with worker_in_a_thread(worker) as thread:
            assert wait_until(lambda: len(smtp_server.messages) == 100, seconds=60), (
                f"{len(smtp_server.messages)} of 100 arrived; tarpits open: {pits.open}"
            )
            # Every tarpit session had started, ahead of the healthy mail, and is still waiting.
            assert (pits.opened, pits.open, pits.greetings) == (30, 30, 0)

            worker.stop()
            thread.join(0.5)
            assert thread.is_alive()  # a graceful stop waits for the sessions under way
            pits.hang_up()
            thread.join(60)
            assert not thread.is_alive()
    delivered = sorted(rcpt for m in smtp_server.messages for rcpt in m.rcpt_tos)
    assert delivered == sorted(f"user{n}@example.org" for n in range(100))  # each once
    left = get_store().list(limit=1000)
    assert sorted(r.address for item in left for r in item.recipients) == sorted(
        f"user@tarpit{n}.test" for n in range(30)
    )
    for item in left:  # deferred, to be tried again; no lease held
        assert (item.recipients[0].status, item.attempts, item.lease_owner) == (RecipientStatus.DEFERRED, 1, None)


def test_slow_sessions_have_a_budget_of_their_own_and_the_rest_are_given_back(tarpit, smtp_server, monkeypatch):
    # Two slots and twenty slow sessions beyond them; sessions turn slow sooner, to keep the test short.
    monkeypatch.setattr(worker_sessions, "SLOW_SESSION_SECONDS", 0.1)
    pits = tarpit(30)
    with override_settings(BUMAIL_QUEUE=tarpit_settings(pits, smtp_server)):
        enqueue_to_tarpits(pits)
        worker = Worker(concurrency=2)
        with worker_in_a_thread(worker) as thread:
            assert wait_until(lambda: pits.opened == 22), f"{pits.opened} tarpit sessions opened"
            # Once all of them wait on their peers, the worker has no slot left to start more.
            assert wait_until(lambda: all(s.is_slow(time.monotonic()) for s in list(worker._sessions.values())))
            time.sleep(10 * 0.1)  # several turns of the loop, which would start more if it could
            assert (pits.opened, pits.open) == (22, 22)
            assert delivery_threads() == 22
            worker.stop()
            pits.hang_up()
            thread.join(60)
            assert not thread.is_alive()
    left = get_store().list(limit=1000)
    assert len(left) == 30  # none lost
    tried = [item for item in left if item.attempts == 1]
    given_back = [item for item in left if item.attempts == 0]
    assert (len(tried), len(given_back)) == (22, 8)
    assert all(item.recipients[0].status == RecipientStatus.DEFERRED for item in tried)
    assert all(item.lease_owner is None for item in left)


def test_a_burst_run_delivers_past_the_tarpits_and_ends_once_their_sessions_do(tarpit, smtp_server, monkeypatch):
    monkeypatch.setattr(worker_sessions, "SLOW_SESSION_SECONDS", 0.1)
    pits = tarpit(3)
    stats = []
    with override_settings(BUMAIL_QUEUE={**tarpit_settings(pits, smtp_server), "CONCURRENCY": 2}):
        enqueue_to_tarpits(pits)
        for n in range(10):
            queue.enqueue(
                b"Subject: to a healthy server\r\n\r\nHello.\r\n",
                sender="app@example.com",
                recipients=[f"user{n}@example.org"],
            )

        def burst() -> None:
            try:
                stats.append(queue.deliver_due())
            finally:
                connections.close_all()

        thread = threading.Thread(target=burst, name="tarpit-test-burst")
        thread.start()
        assert wait_until(lambda: len(smtp_server.messages) == 10), f"{len(smtp_server.messages)} of 10 arrived"
        assert (pits.opened, pits.open) == (3, 3)
        thread.join(0.5)
        assert thread.is_alive()  # a burst run ends once every session has
        pits.hang_up()
        thread.join(60)
        assert not thread.is_alive()
    [done] = stats
    assert (done.items, done.delivered, done.deferred) == (13, 10, 3)
