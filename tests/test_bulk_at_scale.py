"""A bulk hold of 100,000 items while three workers drain other mail, on PostgreSQL and
on Redis.

The hold's clock is its hook between batches: at each of its steps, each of the three
workers claims one item of the other mail and records it delivered before the hold
goes on. So the test asserts, without a clock, that no claim ever waits for more than
the batch in progress: every worker gets an item between any two batches, and the
hold ends having held every one of the 100,000. ``bench/bulk.py`` measures the same
with the workers running freely.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.items import AttemptResult, Outcome, RecipientStatus, Reply
from bumail_queue.models import BulkAction
from bumail_queue.operations.bulk import BATCH, BulkFilter
from bumail_queue.queries import ItemState
from bumail_queue.service import QueueService
from bumail_queue.stores import QueueStore, get_store

pytestmark = pytest.mark.django_db(transaction=True)

HELD = 100_000
WORKERS = 3
#: The other mail: more than the workers claim while the hold runs.
OTHER = 1000
ACCEPTED = Reply(code=250, status="2.0.0", text="OK")
RAW = b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n"


# What is at stake is PostgreSQL's row locks and Redis's scripts; SQLite has one writer
# at a time anyway. The Redis case runs with the PostgreSQL settings only: it is the
# same server whatever the database, and once per run is enough for a minute's test.
@pytest.fixture(
    params=[
        pytest.param("orm", marks=pytest.mark.postgres),
        pytest.param("redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[QueueStore]:
    chosen = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": "orm"}
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **chosen}):
        yield get_store()


def queue_for_later(store: QueueStore, count: int) -> None:
    """``count`` items to hold, due in an hour: the workers only see the other mail."""
    model = queue.prepare(
        RAW, sender="app@example.com", recipients=["r@bulk.example"], at=timezone.now() + timedelta(hours=1)
    )
    for start in range(0, count, 5000):
        batch = [
            dataclasses.replace(model, id=str(uuid.uuid4()), recipients=[f"r{n}@bulk.example"])
            for n in range(start, min(start + 5000, count))
        ]
        store.add_many(batch)


class Worker(threading.Thread):
    """A worker in lockstep with the hold: one claim and its delivery each turn."""

    def __init__(self, store: QueueStore, name: str) -> None:
        super().__init__(name=name)
        self.store = store
        self.turn = threading.Semaphore(0)
        self.done = threading.Semaphore(0)
        self.stopping = False
        self.delivered: list[str] = []
        self.empty_claims = 0

    def run(self) -> None:
        try:
            while self.turn.acquire(timeout=120) and not self.stopping:
                self.drain_one()
                self.done.release()
        finally:
            connection.close()

    def drain_one(self) -> None:
        now = timezone.now()
        claimed = self.store.claim(owner=self.name, now=now, lease_until=now + timedelta(minutes=5), limit=1)
        if not claimed:
            self.empty_claims += 1
            return
        (item,) = claimed
        outcomes = {r.address: Outcome(status=RecipientStatus.DELIVERED, reply=ACCEPTED) for r in item.recipients}
        result = AttemptResult(outcomes=outcomes, next_attempt_at=now)
        assert self.store.complete(item.id, owner=self.name, result=result) is not None
        self.delivered.append(item.id)


def test_a_hold_of_100_000_items_lets_three_workers_drain_other_mail_between_every_two_batches(store):
    queue_for_later(store, HELD)
    other = {
        queue.enqueue(RAW, sender="app@example.com", recipients=[f"o{n}@other.example"], channel="alerts").id
        for n in range(OTHER)
    }
    workers = [Worker(store, f"worker-{n}") for n in range(WORKERS)]
    steps = 0

    def clock():
        """The hold's clock, read once per batch: each worker drains one item first."""
        nonlocal steps
        steps += 1
        for worker in workers:
            worker.turn.release()
        for worker in workers:
            assert worker.done.acquire(timeout=120), f"{worker.name}'s claim did not return"
        return timezone.now()

    for worker in workers:
        worker.start()
    try:
        result = QueueService(clock=clock).hold(BulkFilter(domain="bulk.example"), by="ops")
    finally:
        for worker in workers:
            worker.stopping = True
            worker.turn.release()
        for worker in workers:
            worker.join()

    assert (result.count, result.skipped) == (HELD, 0)
    assert result.batches >= HELD // BATCH
    # At the hold's start and at least once in each batch, every worker had an item
    # of the other mail, and no claim came back empty.
    assert steps >= result.batches + 1
    delivered = [item_id for worker in workers for item_id in worker.delivered]
    assert [len(worker.delivered) for worker in workers] == [steps] * WORKERS
    assert sorted(delivered) == sorted(set(delivered)) and set(delivered) <= other
    assert sum(worker.empty_claims for worker in workers) == 0

    summary = queue.summary()
    assert summary.by_state[ItemState.HELD] == HELD
    assert summary.by_state[ItemState.QUEUED] == len(other) - len(delivered)
    audit = BulkAction.objects.get()
    assert (audit.by, audit.action, audit.filter, audit.changed) == ("ops", "hold", {"domain": "bulk.example"}, HELD)
