"""``queue_hold``, ``queue_release``, ``queue_cancel`` and ``queue_retry`` by filter, with
``--dry-run``, on every store: what each prints, what it changes, and its audit entry."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue, signals
from bumail_queue.items import AttemptResult, Outcome, RecipientStatus, Reply
from bumail_queue.models import BulkAction
from bumail_queue.operations.bulk import BulkFilter
from bumail_queue.queries import ItemState, state_of
from bumail_queue.service import QueueService
from bumail_queue.stores import get_store

pytestmark = pytest.mark.django_db(transaction=True)

LATER = Reply(code=451, status="4.7.1", text="Greylisted, try again later")


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_name(request):
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store}):
        yield request.param


def enqueue(*recipients, sender="app@example.com", subject="Hi", channel="default", at=None):
    raw = f"From: {sender}\r\nSubject: {subject}\r\n\r\nHi.\r\n".encode()
    return queue.enqueue(raw, sender=sender, recipients=list(recipients), at=at, channel=channel)


def deferred(*recipients, channel="default"):
    """An item tried once just now, each recipient deferred for half an hour."""
    item = enqueue(*recipients, channel=channel)
    store, now = get_store(), timezone.now()
    (claimed,) = store.claim_items([item.id], owner="earlier", now=now, lease_until=now + timedelta(minutes=5))
    outcomes = {address: Outcome(status=RecipientStatus.DEFERRED, reply=LATER) for address in recipients}
    result = AttemptResult(outcomes=outcomes, next_attempt_at=now + timedelta(minutes=30))
    return store.complete(claimed.id, owner="earlier", result=result)


def being_delivered(*recipients):
    item = enqueue(*recipients)
    now = timezone.now()
    (claimed,) = get_store().claim_items([item.id], owner="busy", now=now, lease_until=now + timedelta(minutes=10))
    return claimed


def run(command, *args):
    """Run the command; return the lines it printed."""
    out = StringIO()
    call_command(command, *args, stdout=out, stderr=StringIO())
    return out.getvalue().splitlines()


def state(item):
    return state_of(queue.get(item.id), timezone.now())


def states(*items):
    return [state(item) for item in items]


def claimable_ids():
    now = timezone.now()
    return {
        item.id for item in get_store().claim(owner="w", now=now, lease_until=now + timedelta(minutes=1), limit=100)
    }


# -- hold and release -----------------------------------------------------------------


def test_hold_by_domain_holds_those_items_and_no_worker_claims_them(store_name):
    held = [enqueue("a@slow.example"), enqueue("b@fast.example", "c@Slow.Example")]
    other = enqueue("d@fast.example")
    lines = run("queue_hold", "--domain", "slow.example", "--by", "ops-ann")
    assert lines[:2] == ["2 items held.", "Among them:"]
    assert sorted(lines[2:]) == sorted(
        f"  {item.id}  {', '.join(r.address for r in item.recipients)}  Hi" for item in held
    )
    assert states(*held) == [ItemState.HELD, ItemState.HELD]
    assert claimable_ids() == {other.id}
    entry = BulkAction.objects.get()
    assert (entry.by, entry.action, entry.filter) == ("ops-ann", "hold", {"domain": "slow.example"})
    assert (entry.matched, entry.changed, entry.skipped, entry.stopped) == (2, 2, 0, "")
    status = StringIO()
    call_command("queue_status", stdout=status)
    assert status.getvalue().splitlines()[0] == (
        "3 items queued: 0 queued, 0 deferred, 1 being delivered, 2 held; 0 due now."
    )


def test_a_dry_run_says_how_many_shows_a_sample_and_changes_nothing(store_name):
    items = [enqueue(f"r{n}@slow.example", subject=f"Offer {n}") for n in range(12)]
    before = [queue.get(item.id) for item in items]
    lines = run("queue_hold", "--recipient", "*@slow.example", "--dry-run")
    assert lines[:2] == ["12 items would be held.", "Sample:"]
    every = {f"  {item.id}  r{n}@slow.example  Offer {n}" for n, item in enumerate(items)}
    assert len(set(lines[2:])) == 10 and set(lines[2:]) <= every
    assert [queue.get(item.id) for item in items] == before
    assert not BulkAction.objects.exists()
    for command in ("queue_release", "queue_cancel", "queue_retry"):
        run(command, "--all", "--dry-run")
    assert [queue.get(item.id) for item in items] == before
    assert not BulkAction.objects.exists()


def test_an_item_being_delivered_is_left_to_its_worker(store_name):
    leased = being_delivered("a@slow.example")
    free = enqueue("b@slow.example")
    assert run("queue_hold", "--domain", "slow.example", "--dry-run")[0] == (
        "1 item would be held; 1 left alone (being delivered, or changed meanwhile)."
    )
    assert run("queue_hold", "--domain", "slow.example")[0] == (
        "1 item held; 1 left alone (being delivered, or changed meanwhile)."
    )
    assert queue.get(leased.id) == leased
    assert state(free) == ItemState.HELD
    assert (BulkAction.objects.get().changed, BulkAction.objects.get().skipped) == (1, 1)


def test_release_makes_held_items_due_now(store_name):
    items = [enqueue("a@slow.example", at=timezone.now() + timedelta(hours=3)), enqueue("b@slow.example")]
    other = enqueue("c@fast.example")
    run("queue_hold", "--all")
    assert claimable_ids() == set()
    assert run("queue_release", "--domain", "slow.example", "--dry-run")[0] == "2 items would be released."
    assert states(*items) == [ItemState.HELD, ItemState.HELD]
    before = timezone.now()
    assert run("queue_release", "--domain", "slow.example")[0] == "2 items released."
    for item in items:
        assert before <= queue.get(item.id).next_attempt_at <= timezone.now()
    assert claimable_ids() == {item.id for item in items}
    assert state(other) == ItemState.HELD
    assert run("queue_release", "--domain", "slow.example")[0] == "0 items released."
    assert [entry.action for entry in BulkAction.objects.order_by("id")] == ["hold", "release", "release"]


# -- cancel and retry by filter ----------------------------------------------------------


def test_cancel_by_filter_cancels_as_the_admin_does(store_name):
    gone = [enqueue("a@example.org", sender="news@shop.example"), enqueue("b@example.org", sender="News@Shop.example")]
    kept = enqueue("c@example.org", sender="alerts@shop.example")
    cancelled = []

    def receiver(sender, item_id, recipients, **kwargs):
        cancelled.append((item_id, recipients))

    signals.cancelled.connect(receiver)
    try:
        assert run("queue_cancel", "--sender", "news@shop.example", "--dry-run")[0] == "2 items would be cancelled."
        assert cancelled == [] and all(queue.get(item.id) for item in gone)
        assert run("queue_cancel", "--sender", "news@shop.example")[0] == "2 items cancelled."
    finally:
        signals.cancelled.disconnect(receiver)
    assert [queue.get(item.id) for item in gone] == [None, None]
    assert queue.read_message(gone[0].id) is None
    assert sorted(cancelled) == sorted((item.id, [item.recipients[0].address]) for item in gone)
    assert queue.get(kept.id) is not None
    assert BulkAction.objects.get().filter == {"sender": "news@shop.example"}


def test_cancel_takes_held_items_too(store_name):
    held, free = enqueue("a@example.org"), enqueue("b@example.org")
    queue.hold(BulkFilter(recipient="a@*"))
    assert run("queue_cancel", "--state", "held")[0] == "1 item cancelled."
    assert queue.get(held.id) is None and state(free) == ItemState.QUEUED


def test_retry_by_filter_makes_matching_items_due_and_leaves_held_ones_held(store_name):
    news = [deferred("a@slow.example", channel="news"), deferred("b@fast.example", channel="news")]
    alerts = deferred("c@slow.example", channel="alerts")
    held = deferred("d@slow.example", channel="news")
    queue.hold(BulkFilter(recipient="d@*"))
    assert run("queue_retry", "--channel", "news", "--dry-run")[0] == "2 items would be made due now."
    assert all(queue.get(item.id).next_attempt_at > timezone.now() for item in news)
    assert run("queue_retry", "--channel", "news", "--state", "deferred")[0] == "2 items made due now."
    assert claimable_ids() == {item.id for item in news}
    assert queue.get(alerts.id).next_attempt_at > timezone.now()
    assert state(held) == ItemState.HELD
    assert queue.get(news[0].id).attempts == 1


def test_older_than_takes_items_queued_longer_ago(store_name):
    old = queue.enqueue(
        b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n", sender="app@example.com", recipients=["a@example.org"]
    )
    assert run("queue_hold", "--older-than", "1h")[0] == "0 items held."  # queued just now
    # Two hours on, by the service's clock: it was queued longer ago than an hour.
    later = QueueService(clock=lambda: timezone.now() + timedelta(hours=2))
    assert later.hold(BulkFilter(older_than=timedelta(hours=3)), dry_run=True).count == 0
    result = later.hold(BulkFilter(older_than=timedelta(hours=1)))
    assert (result.count, [s.id for s in result.sample]) == (1, [old.id])
    assert state(old) == ItemState.HELD


# -- filters checked, and the safety of --all ---------------------------------------------


@pytest.mark.parametrize("command", ["queue_hold", "queue_release", "queue_cancel"])
def test_no_filter_is_refused_without_all(store_name, command):
    item = enqueue("a@example.org")
    with pytest.raises(CommandError, match=r"^Give a filter .*, or --all to act on every item\.$"):
        run(command)
    with pytest.raises(CommandError, match=r"^Give a filter or --all, not both\.$"):
        run(command, "--all", "--channel", "default")
    assert state(item) == ItemState.QUEUED
    assert not BulkAction.objects.exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--domain", "exa mple.com"], "'exa mple.com' is not a domain"),
        (["--sender", " "], "The filter's sender is empty."),
        (["--channel", "no such channel!"], "channel"),
        (["--older-than", "soon"], "'soon' is not a duration"),
        (["--state", "held"], "invalid choice: 'held'"),
    ],
)
def test_a_malformed_filter_is_a_command_error(store_name, args, said):
    item = enqueue("a@example.org")
    with pytest.raises(CommandError, match=said.replace(".", r"\.").replace("(", r"\(")):
        run("queue_hold", *args)
    assert state(item) == ItemState.QUEUED


def test_queue_retry_takes_ids_or_a_filter_not_both(store_name):
    item = deferred("a@example.org")
    with pytest.raises(CommandError, match=r"^Give a filter or item ids, not both\.$"):
        run("queue_retry", item.id, "--channel", "default")


# -- batches: the workers claim between them -------------------------------------------


def test_a_bulk_hold_runs_in_batches_while_a_worker_claims_other_mail(store_name):
    store = get_store()
    raw = b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n"
    # Due in an hour: the worker has only the other mail to claim meanwhile.
    at = timezone.now() + timedelta(hours=1)
    bulk = [queue.prepare(raw, sender="app@example.com", recipients=[f"r{n}@bulk.example"], at=at) for n in range(5000)]
    for start in range(0, len(bulk), 1000):
        store.add_many(bulk[start : start + 1000])
    other = [enqueue(f"o{n}@other.example", channel="alerts") for n in range(40)]
    asked, answered = threading.Semaphore(0), threading.Semaphore(0)
    claims: list[list[str]] = []
    stop = threading.Event()

    def worker():
        try:
            while asked.acquire(timeout=60) and not stop.is_set():
                now = timezone.now()
                got = store.claim(owner="worker", now=now, lease_until=now + timedelta(minutes=5), limit=1)
                claims.append([item.id for item in got])
                answered.release()
        finally:
            connection.close()

    def clock():
        """The bulk action's clock: at each of its steps, the worker claims one item."""
        if threading.current_thread() is not claimer:
            asked.release()
            assert answered.acquire(timeout=60), "the worker's claim did not return"
        return timezone.now()

    claimer = threading.Thread(target=worker)
    claimer.start()
    try:
        result = QueueService(clock=clock).hold(BulkFilter(domain="bulk.example"), by="test", batch=1000)
    finally:
        stop.set()
        asked.release()
        claimer.join()
    assert (result.count, result.skipped) == (5000, 0)
    assert result.batches >= 5
    # A claim between every two batches, each of which got an item of the other mail.
    assert len(claims) >= result.batches
    assert all(len(got) == 1 and got[0] in {item.id for item in other} for got in claims)
    summary = queue.summary()
    assert (summary.by_state[ItemState.HELD], summary.by_state[ItemState.DELIVERING]) == (5000, len(claims))


@pytest.mark.redis
def test_a_large_redis_queue_s_sampled_gauges_count_held_items(redis_store):
    now = timezone.now()
    raw = b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n"
    added = redis_store.add_many(
        [queue.prepare(raw, sender="app@example.com", recipients=[f"r{n}@example.org"], now=now) for n in range(700)]
    )
    leased = redis_store.claim(owner="w", now=now, lease_until=now + timedelta(minutes=5), limit=50)
    assert len(redis_store.hold([item.id for item in added], now=now).changed) == 650
    redis_store.gauge_sample_rows = 100  # beyond it: the counts are split from a draw
    gauges = redis_store.gauges(now=now)
    assert not gauges.exact
    assert gauges.items == {
        ItemState.QUEUED: 0,
        ItemState.DEFERRED: 0,
        ItemState.DELIVERING: len(leased),
        ItemState.HELD: 650,
    }
    assert gauges.due == 0
