"""The queue's gauges: the collector on every store, and the samples of large queues."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bumail_queue import delivery_log
from bumail_queue.conf import get_settings
from bumail_queue.items import RecipientStatus as S
from bumail_queue.metrics.queue import QueueCollector
from bumail_queue.queries import ItemState
from bumail_queue.stores.orm import ORMStore
from bumail_queue.stores.redis import RedisStore
from bumail_queue.testing import LATER, LEASE, OK, T0, claim_one, new_item, result
from tests.servers.smtp import closed_port

pytestmark = pytest.mark.django_db(transaction=True)


def scraped(collector: QueueCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_collector_serves_the_stores_gauges(store):
    leased = store.add(new_item(recipients=["d@one.example"]))
    claim_one(store, "w1")
    tried = store.add(new_item(recipients=["x@one.example", "y@two.example"], created_at=T0 - timedelta(hours=2)))
    claim_one(store, "w2")
    store.complete(
        tried.id,
        owner="w2",
        result=result(
            T0 + timedelta(minutes=30), **{"x@one.example": (S.DELIVERED, OK), "y@two.example": (S.DEFERRED, LATER)}
        ),
    )
    store.add(new_item(recipients=["q@one.example", "r@one.example"], created_at=T0 - timedelta(minutes=3)))
    now = T0 + timedelta(minutes=1)
    samples = scraped(QueueCollector(store=lambda: store, clock=lambda: now))

    def gauge(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    assert gauge("bumail_queue_store_up") == 1
    assert {state: gauge("bumail_queue_items", state=state) for state in ("queued", "deferred", "delivering")} == {
        "queued": 1,
        "deferred": 1,
        "delivering": 1,
    }
    assert (gauge("bumail_queue_recipients", state="pending"), gauge("bumail_queue_recipients", state="deferred")) == (
        3,
        1,
    )
    assert gauge("bumail_queue_oldest_item_age_seconds", state="deferred") == 2 * 3600 + 60
    assert gauge("bumail_queue_oldest_item_age_seconds", state="queued") == 4 * 60
    assert gauge("bumail_queue_oldest_item_age_seconds", state="delivering") == 60
    assert gauge("bumail_queue_items_due") == 1  # the queued one, due since it was added
    assert gauge("bumail_queue_due_wait_seconds") == 4 * 60
    assert gauge("bumail_queue_counts_exact") == 1
    assert leased.id  # held by w1 throughout


def test_an_empty_queue_reads_zero_everywhere(store):
    samples = scraped(QueueCollector(store=lambda: store, clock=lambda: T0))
    gauges = {name: value for (name, _), value in samples.items() if name.startswith("bumail_queue_")}
    assert gauges.pop("bumail_queue_store_up") == 1
    assert gauges.pop("bumail_queue_counts_exact") == 1
    assert not any(name != "bumail_queue_delivery_log_entries_last_hour" and value for name, value in gauges.items())


def channel_series(samples, name="bumail_queue_channel_items"):
    """``{(channel, state): value}`` of one of the families by channel."""
    return {
        (dict(labels)["channel"], dict(labels)["state"]): value
        for (family, labels), value in samples.items()
        if family == name
    }


def test_the_collector_serves_each_channels_items_and_oldest(store):
    store.add(new_item(channel="alerts", created_at=T0 - timedelta(minutes=9)))
    claim_one(store, "w1")
    store.add_many(
        [
            new_item(channel="news", created_at=T0 - timedelta(minutes=3)),
            new_item(channel="news", created_at=T0 - timedelta(minutes=1)),
            new_item(created_at=T0 - timedelta(minutes=2)),
        ]
    )
    now = T0 + timedelta(minutes=1)
    unsubscribe = {"digest": {"URL": "https://www.example.com/mail/unsubscribe/"}}
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "UNSUBSCRIBE": unsubscribe}):
        samples = scraped(QueueCollector(store=lambda: store, clock=lambda: now))
    items = channel_series(samples)
    assert {channel for channel, _ in items} == {"default", "alerts", "news", "digest"}
    assert {key: n for key, n in items.items() if n} == {
        ("alerts", "delivering"): 1,
        ("news", "queued"): 2,
        ("default", "queued"): 1,
    }
    # A channel the settings name is always there, at zero while it holds nothing.
    assert not any(n for (channel, _), n in items.items() if channel == "digest")
    # Summed over the channels: the queue's own gauges, series by series.
    for state in ItemState:
        assert (
            sum(n for (_, s), n in items.items() if s == state) == samples[("bumail_queue_items", (("state", state),))]
        )
    oldest = channel_series(samples, "bumail_queue_channel_oldest_item_age_seconds")
    assert oldest[("news", "queued")] == 4 * 60
    assert oldest[("alerts", "delivering")] == 10 * 60
    assert oldest[("news", "deferred")] == 0


def test_channels_beyond_the_bound_are_summed_under_other(store):
    store.add_many([new_item(channel="big") for _ in range(3)])
    store.add_many([new_item(channel=f"ch{n:02}") for n in range(1, 23)])
    samples = scraped(QueueCollector(store=lambda: store, clock=lambda: T0))
    queued = {channel: n for (channel, state), n in channel_series(samples).items() if state == "queued"}
    # default (always), the largest, then the rest by name up to 20, and the others summed.
    assert list(queued) == ["default", "big", *[f"ch{n:02}" for n in range(1, 19)], "other"]
    assert (queued["default"], queued["big"], queued["ch01"], queued["other"]) == (0, 3, 1, 4)
    assert sum(queued.values()) == samples[("bumail_queue_items", (("state", "queued"),))] == 25


def test_the_delivery_logs_last_hour_counts_each_status():
    now = T0 + timedelta(hours=5)
    for status, minutes_ago in [
        ("delivered", 5),
        ("delivered", 59),
        ("failed", 10),
        ("expired", 30),
        ("delivered", 61),
    ]:
        delivery_log.record(
            item_id="00000000-0000-4000-8000-000000000001",
            recipient="a@example.org",
            status=status,
            at=now - timedelta(minutes=minutes_ago),
        )
    samples = scraped(QueueCollector(clock=lambda: now))
    log = {
        labels[0][1]: value
        for (name, labels), value in samples.items()
        if name == "bumail_queue_delivery_log_entries_last_hour"
    }
    assert log == {"delivered": 2, "deferred": 0, "failed": 1, "expired": 1, "cancelled": 0, "bounced": 0}
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "DELIVERY_LOG": False}):
        assert not any(
            name.startswith("bumail_queue_delivery_log") for name, _ in scraped(QueueCollector(clock=lambda: now))
        )


@pytest.mark.redis
def test_a_store_that_cannot_be_read_is_said_down_and_the_rest_still_served(settings):
    settings.CACHES = {
        **settings.CACHES,
        "down": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://127.0.0.1:{closed_port()}/0"},
    }
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "STORE": "redis", "REDIS_CONNECTION": "down"}):
        samples = scraped(QueueCollector(clock=lambda: T0))
    names = {name for name, _ in samples}
    assert samples[("bumail_queue_store_up", ())] == 0
    assert "bumail_queue_items" not in names
    assert "bumail_queue_delivery_log_entries_last_hour" in names  # the log is in the database, which answers


# -- a large queue: estimated from a sample, whose size the tests shrink -------------------


#: What ``fill(store, 3000)`` makes: every third item deferred, every sixtieth from
#: the second leased, the rest queued (given back untried).
FILLED = {ItemState.QUEUED: 1950, ItemState.DEFERRED: 1000, ItemState.DELIVERING: 50}


def fill(store, count):
    """``count`` items, a second apart: a third deferred (tried once), a sixtieth
    leased, the rest queued. They are recorded in one batch in their order, so that
    every part of a table holds each kind alike (an update writes a row anew)."""
    store.add_many(
        [new_item(recipients=[f"r{n}@example.org"], created_at=T0 + timedelta(seconds=n)) for n in range(count)]
    )
    later = T0 + timedelta(hours=1)
    claimed = []
    for _ in range(0, count, 500):
        claimed += store.claim(owner="w", now=later, lease_until=later + LEASE, limit=500)
    outcomes = []
    for n, item in enumerate(claimed):
        if n % 3 == 0:
            deferred = {item.recipients[0].address: (S.DEFERRED, LATER)}
            outcomes.append((item.id, result(later + timedelta(hours=2), **deferred)))
        elif n % 60 != 1:
            outcomes.append((item.id, result(item.created_at, count=False)))  # given back, due since it was added
    store.complete_many(outcomes, owner="w")
    return later


def assert_near(actual, expected, share=0.2):
    assert abs(actual - expected) <= share * expected, (actual, expected)


@pytest.mark.postgres
def test_a_large_queue_on_postgresql_is_estimated_from_a_sample_with_its_oldest_and_first_due_exact():
    store = ORMStore(get_settings())
    later = fill(store, 3000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE bumail_queue_items")
    exact = store.gauges(now=later)
    store.gauge_sample_rows = 600
    sampled = store.gauges(now=later)
    assert exact.exact and not sampled.exact
    assert exact.items == FILLED | {ItemState.HELD: 0}
    for state in (ItemState.QUEUED, ItemState.DEFERRED):
        assert_near(sampled.items[state], exact.items[state])
    assert_near(sampled.total, 3000, 0.02)  # the planner's count, after ANALYZE
    assert_near(sampled.recipients[S.DEFERRED], 1000)
    assert_near(sampled.due, exact.due)
    # Read exactly whatever the sample: the oldest item (among the oldest by seq) and the first due.
    assert sampled.oldest[ItemState.QUEUED] == exact.oldest[ItemState.QUEUED] == T0 + timedelta(seconds=2)
    assert sampled.oldest[ItemState.DEFERRED] == exact.oldest[ItemState.DEFERRED] == T0
    assert sampled.first_due_at == exact.first_due_at == T0 + timedelta(seconds=2)


@pytest.mark.redis
def test_a_large_queue_on_redis_is_counted_on_its_sorted_sets_and_split_from_a_draw(redis_store: RedisStore):
    later = fill(redis_store, 3000)
    redis_store.gauge_sample_rows = 5000
    exact = redis_store.gauges(now=later)
    redis_store.gauge_sample_rows = 600
    sampled = redis_store.gauges(now=later)
    assert exact.exact and not sampled.exact
    assert exact.items == FILLED | {ItemState.HELD: 0}
    # What the sorted sets count is exact at any size; the split and the recipients are drawn.
    assert sampled.items[ItemState.DELIVERING] == 50
    assert sampled.total == 3000
    assert (sampled.due, sampled.first_due_at) == (exact.due, exact.first_due_at) == (1950, T0 + timedelta(seconds=2))
    assert_near(sampled.items[ItemState.DEFERRED], 1000)
    assert_near(sampled.recipients[S.DEFERRED], 1000)
    assert_near(sampled.recipients[S.PENDING], 2000)


def filled_by_channel(store, later):
    """Each channel's gauges of ``fill`` exact, and with a sample of 600 items."""
    store.gauge_sample_rows = 10_000
    exact = store.channel_gauges(now=later)
    store.gauge_sample_rows = 600
    return exact, store.channel_gauges(now=later)


@pytest.mark.postgres
def test_a_large_queue_by_channel_on_postgresql_is_estimated_from_a_sample():
    store = ORMStore(get_settings())
    later = fill(store, 3000)
    store.add_many([new_item(channel="alerts") for _ in range(5)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE bumail_queue_items")
    exact, sampled = filled_by_channel(store, later)
    assert exact["default"].exact and {state: n for state, n in exact["default"].items.items() if n} == FILLED
    assert exact["alerts"].total == 5
    assert not sampled["default"].exact
    assert_near(sum(channel.total for channel in sampled.values()), 3005, 0.02)  # the planner's count
    assert_near(sampled["default"].items[ItemState.DEFERRED], 1000)


@pytest.mark.redis
def test_a_large_queue_by_channel_on_redis_is_split_from_a_draw(redis_store: RedisStore):
    later = fill(redis_store, 3000)
    redis_store.add_many([new_item(channel="alerts") for _ in range(5)])
    exact, sampled = filled_by_channel(redis_store, later)
    assert exact["default"].exact and {state: n for state, n in exact["default"].items.items() if n} == FILLED
    assert exact["alerts"].total == 5
    assert not sampled["default"].exact
    assert_near(sum(channel.total for channel in sampled.values()), 3005, 0.01)  # scaled to the count
    assert_near(sampled["default"].items[ItemState.DEFERRED], 1000)


# -- shaping: the destinations that hold mail back -------------------------------------------


@pytest.mark.parametrize("store_name", ["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_each_shaped_destination_says_whether_it_holds_mail_back(store_name, request, settings):
    from bumail_queue.shaping import Limits, PermitRequest
    from bumail_queue.stores import get_store

    store = request.getfixturevalue("redis_settings") if store_name == "redis" else {"STORE": store_name}
    settings.BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com", **store, "SHAPING": {"*": {"CONCURRENCY": 2}}}
    now = T0 + timedelta(days=1)
    shaped = get_store()
    limits = Limits(concurrency=2)
    shaped.release_permit("slow.example", slot=None, now=now, suspend_until=now + timedelta(minutes=5))
    shaped.take_permit(PermitRequest(key="busy.example", limits=limits, now=now, held=4, held_until=now + LEASE))
    shaped.take_permit(PermitRequest(key="calm.example", limits=limits, now=now, slot="s1", slot_until=now + LEASE))

    samples = scraped(QueueCollector(clock=lambda: now))
    throttled = {
        dict(labels)["destination"]: value
        for (name, labels), value in samples.items()
        if name == "bumail_queue_destination_throttled"
    }
    assert throttled == {"slow.example": 1, "busy.example": 1, "calm.example": 0}
    # Once the suspension and the held items' last due time are past, none is.
    later = scraped(QueueCollector(clock=lambda: now + timedelta(minutes=30)))
    assert {
        dict(labels)["destination"]: value
        for (name, labels), value in later.items()
        if name == "bumail_queue_destination_throttled"
    } == {"slow.example": 0, "busy.example": 0, "calm.example": 0}


def test_without_shaping_no_destination_is_reported():
    samples = scraped(QueueCollector(clock=lambda: T0))
    assert not any(name == "bumail_queue_destination_throttled" for name, _ in samples)
