"""The Redis store beyond the contract: its keys, its scripts, and Redis's own failures.

Each test keeps its keys under a prefix of its own (``redis_prefix``) in the test
Redis, or starts a throwaway ``redis-server`` (``redis_servers``) when it must fill,
stop or misconfigure one.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections import Counter
from datetime import date, timedelta

import pytest
from django.core import checks
from django.core.mail import EmailMessage, send_mass_mail
from django.db import transaction
from django.test import override_settings
from django_redis import get_redis_connection

from bumail_queue import queue, signals
from bumail_queue.conf import get_settings
from bumail_queue.errors import QueueConfigurationError, QueueError
from bumail_queue.items import Recipient, RecipientStatus
from bumail_queue.queries import ItemState
from bumail_queue.shaping import Limits, PermitRequest
from bumail_queue.stores.redis import RedisStore
from bumail_queue.stores.redis.layout import micros, recipients_json
from bumail_queue.suppression import SuppressionChange
from bumail_queue.testing import LEASE, OK, T0, claim_one, result, sts_policy, suppression, tls_count, tried_once
from bumail_queue.testing import new_item as new
from tests.conftest import REDIS_ALIAS
from tests.helpers import use_queue_backend
from tests.servers.smtp import closed_port

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def redis_client():
    return get_redis_connection(REDIS_ALIAS)


def store_at(prefix: str, alias: str = REDIS_ALIAS) -> RedisStore:
    return RedisStore(
        dataclasses.replace(get_settings(), store="redis", redis_connection=alias, redis_key_prefix=prefix)
    )


def caches_with(**aliases: str) -> override_settings:
    """Add django-redis aliases at the given URLs to the test's CACHES."""
    from django.conf import settings

    extra = {alias: {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url} for alias, url in aliases.items()}
    return override_settings(CACHES={**settings.CACHES, **extra})


# -- the keys ---------------------------------------------------------------------------


def test_the_keys_are_laid_out_under_the_prefix(redis_store, redis_prefix, redis_client):
    added = redis_store.add(new(key="order-1", recipients=["a@example.org"]))
    item_key = f"{redis_prefix}item:{added.id}"
    assert {k.decode() for k in redis_client.scan_iter(match=f"{redis_prefix}*")} == {
        item_key, f"{redis_prefix}message:{added.id}", f"{redis_prefix}items", f"{redis_prefix}ready:0:default",
        f"{redis_prefix}lanes", f"{redis_prefix}seq", f"{redis_prefix}schema", f"{redis_prefix}keys",
    }  # fmt: skip
    fields = redis_client.hgetall(item_key)
    assert set(fields) == {
        b"id",
        b"from",
        b"recipients",
        b"size",
        b"created",
        b"next",
        b"attempts",
        b"delay",
        b"member",
        b"rev",
        b"key",
        b"priority",
        b"channel",
    }
    member = fields[b"member"].decode()
    # Sixteen digits of sequence, so that items equally due come oldest first.
    assert re.fullmatch(rf"\d{{16}}:{added.id}", member)
    assert redis_client.zscore(f"{redis_prefix}ready:0:default", member) == int(fields[b"next"])
    assert redis_client.smembers(f"{redis_prefix}lanes") == {b"0:default"}
    assert redis_client.get(f"{redis_prefix}schema") == b"2"
    assert redis_client.hget(f"{redis_prefix}keys", "order-1") == added.id.encode()

    claim_one(redis_store)
    assert redis_client.exists(f"{redis_prefix}ready:0:default", f"{redis_prefix}lanes") == 0
    assert redis_client.zscore(f"{redis_prefix}leases", member) == int(redis_client.hget(item_key, "expires"))


def test_a_message_of_every_byte_value_is_kept_byte_for_byte(redis_store, redis_prefix, redis_client):
    data = bytes(range(256)) * 3 + b"\r\n.\r\n\x00"
    added = redis_store.add(new(message=data))
    assert redis_client.get(f"{redis_prefix}message:{added.id}") == data
    assert redis_store.read_message(added.id) == data


def test_two_prefixes_are_two_queues(redis_prefix, redis_client):
    first, second = store_at(redis_prefix + "a:"), store_at(redis_prefix + "b:")
    mine = first.add(new(key="same-key"))
    theirs = second.add(new(key="same-key"))
    assert mine.id != theirs.id
    assert [i.id for i in first.list()] == [mine.id]
    assert second.get(mine.id) is None
    assert second.read_message(mine.id) is None
    assert [i.id for i in second.claim(owner="w", now=T0, lease_until=T0 + LEASE, limit=10)] == [theirs.id]
    assert first.claim(owner="w", now=T0, lease_until=T0 + LEASE, limit=10)[0].id == mine.id
    assert second.cancel(mine.id) is None
    assert first.count() == second.count() == 1


@pytest.mark.parametrize(
    ("found", "text"),
    [("not a version", "the prefix is another application's"), ("3", "newer version of bumail_queue")],
)
def test_a_prefix_holding_another_schema_is_refused_at_the_first_call(
    redis_store, redis_prefix, redis_client, found, text
):
    redis_client.set(f"{redis_prefix}schema", found)
    with pytest.raises(QueueConfigurationError) as error:
        redis_store.count()
    assert text in error.value.message
    with pytest.raises(QueueConfigurationError):
        redis_store.add(new())
    assert redis_client.exists(f"{redis_prefix}items") == 0


def layout_1_item(redis_client, prefix, item_id, seq):
    """Write an item as bumail_queue before lanes did: no priority, no channel, one "ready" set."""
    member, due = f"{seq:016d}:{item_id}", micros(T0)
    redis_client.hset(
        f"{prefix}item:{item_id}",
        mapping={
            "id": item_id, "from": "app@example.com", "recipients": recipients_json([Recipient(address=f"r{seq}@example.org")]),
            "size": "5", "created": due, "next": due, "attempts": "0", "delay": "0", "member": member, "rev": "0",
        },
    )  # fmt: skip
    redis_client.set(f"{prefix}message:{item_id}", b"hello")
    redis_client.zadd(f"{prefix}items", {member: int(due)})
    redis_client.zadd(f"{prefix}ready", {member: int(due)})


def test_a_queue_of_layout_1_is_brought_to_layout_2_at_the_first_call(redis_store, redis_prefix, redis_client):
    # As bumail_queue before lanes left it: one "ready" set, items without priority or channel.
    ids = ["00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"]
    for seq, item_id in enumerate(ids, start=1):
        layout_1_item(redis_client, redis_prefix, item_id, seq)
    redis_client.set(f"{redis_prefix}seq", 2)
    redis_client.set(f"{redis_prefix}schema", "1")

    assert [(i.id, i.priority, i.channel) for i in redis_store.list()] == [
        (ids[0], 0, "default"),
        (ids[1], 0, "default"),
    ]
    assert redis_client.get(f"{redis_prefix}schema") == b"2"
    assert redis_client.exists(f"{redis_prefix}ready") == 0
    assert redis_client.zcard(f"{redis_prefix}ready:0:default") == 2
    assert redis_store.lanes() == [("default", 0)]
    urgent = redis_store.add(new(priority=5))
    claimed = redis_store.claim(owner="w", now=T0, lease_until=T0 + LEASE, limit=3)
    assert [i.id for i in claimed] == [urgent.id, *ids]


def test_the_upgrade_to_layout_2_keeps_the_suppression_list_the_policies_and_the_shaping_buckets(
    redis_store, redis_prefix, redis_client
):
    # A queue of layout 1 that already kept what came with it: the suppression list,
    # MTA-STS policies, TLS counts and shaping buckets, none of which the upgrade touches.
    entry = suppression("gone@example.org")
    redis_store.update_suppressions(SuppressionChange(add=(entry,)), now=T0)
    policy = sts_policy("example.org", id="one")
    redis_store.put_sts_policy(policy)
    counted = tls_count(date(2026, 1, 1), result=None)
    redis_store.count_tls_sessions([counted])
    two_at_once = Limits(concurrency=2)
    slot = PermitRequest(key="example.net", limits=two_at_once, now=T0, slot="s1", slot_until=T0 + LEASE)
    assert redis_store.take_permit(slot).granted
    ids = ["00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"]
    for seq, item_id in enumerate(ids, start=1):
        layout_1_item(redis_client, redis_prefix, item_id, seq)
    redis_client.set(f"{redis_prefix}seq", 2)
    redis_client.set(f"{redis_prefix}schema", "1")

    store = store_at(redis_prefix)  # a process of this version starting on it
    claimed = store.claim_items([ids[1]], owner="task", now=T0, lease_until=T0 + LEASE)
    assert [(i.id, i.priority, i.channel) for i in claimed] == [(ids[1], 0, "default")]
    assert redis_client.get(f"{redis_prefix}schema") == b"2"
    assert redis_client.zrange(f"{redis_prefix}ready:0:default", 0, -1) == [f"{1:016d}:{ids[0]}".encode()]
    assert store.suppressions_of(["gone@example.org"], now=T0) == {"gone@example.org": entry}
    assert store.get_sts_policy("example.org") == policy
    assert store.tls_session_counts(date(2026, 1, 1)) == [counted]
    [state] = store.destination_states(now=T0)
    assert (state.key, state.sessions) == ("example.net", 1)
    taken = PermitRequest(key="example.net", limits=two_at_once, now=T0, slot="s2", slot_until=T0 + LEASE)
    assert store.take_permit(taken).granted
    assert not store.take_permit(dataclasses.replace(taken, slot="s3")).granted
    # The claim takes the other item only, from its lane; the gauges read the lanes too.
    assert [i.id for i in store.claim(owner="w", now=T0, lease_until=T0 + LEASE, limit=5)] == [ids[0]]
    gauges = store.gauges(now=T0)
    assert (gauges.items[ItemState.DELIVERING], gauges.due) == (2, 0)


def test_the_gauges_of_a_large_queue_count_the_due_items_of_every_lane(redis_store):
    lanes = [("bulk", -5), ("alerts", 9), ("default", 0)]
    redis_store.add_many(
        [
            new(channel=lanes[n % 3][0], priority=lanes[n % 3][1], created_at=T0 + timedelta(seconds=n))
            for n in range(90)
        ]
    )
    redis_store.add_many([new(channel="alerts", priority=9, next_attempt_at=T0 + timedelta(hours=1)) for _ in range(5)])
    now = T0 + timedelta(minutes=5)
    leased = redis_store.claim(owner="w", now=now, lease_until=now + LEASE, limit=10)
    waiting = [i for i in redis_store.list(limit=200) if i.lease_owner is None and i.next_attempt_at <= now]
    assert len(leased) == 10
    exact = redis_store.gauges(now=now)
    redis_store.gauge_sample_rows = 20
    sampled = redis_store.gauges(now=now)
    assert exact.exact and not sampled.exact
    assert (exact.total, exact.items[ItemState.DELIVERING]) == (95, 10)
    # Counted on every lane's ready set, exactly, whatever the draw.
    assert sampled.total == 95
    assert sampled.items[ItemState.DELIVERING] == 10
    assert (sampled.due, sampled.first_due_at) == (exact.due, exact.first_due_at)
    assert (exact.due, exact.first_due_at) == (80, min(i.next_attempt_at for i in waiting))


def test_a_schema_key_of_another_type_is_refused(redis_store, redis_prefix, redis_client):
    redis_client.hset(f"{redis_prefix}schema", "someone", "else")
    with pytest.raises(QueueConfigurationError, match="another application's"):
        redis_store.get("00000000-0000-4000-8000-000000000000")


# -- ids and text -----------------------------------------------------------------------


@pytest.mark.parametrize("item_id", ["schema", "*", "../items", "1:2", "0000000000000001:x", "items", ""])
def test_an_id_the_store_did_not_make_is_unknown_and_reaches_no_key(redis_store, redis_prefix, redis_client, item_id):
    added = redis_store.add(new())
    claim_one(redis_store)
    before = {k: redis_client.type(k) for k in redis_client.scan_iter(match=f"{redis_prefix}*")}
    assert redis_store.get(item_id) is None
    assert redis_store.read_message(item_id) is None
    assert redis_store.renew(item_id, owner="w1", lease_until=T0) is False
    assert redis_store.reschedule(item_id, at=T0) is False
    assert redis_store.cancel(item_id) is None
    assert {k: redis_client.type(k) for k in redis_client.scan_iter(match=f"{redis_prefix}*")} == before
    assert redis_store.get(added.id).lease_owner == "w1"


def test_an_id_in_another_spelling_of_its_uuid_finds_the_item(redis_store):
    added = redis_store.add(new())
    assert redis_store.get(added.id.upper()) == added
    assert redis_store.get(added.id.replace("-", "")) == added


def test_an_item_id_that_is_not_a_uuid_is_refused(redis_store):
    with pytest.raises(QueueError) as error:
        redis_store.add(new(id="my-own-id"))
    assert error.value.code == "INVALID"
    assert redis_store.count() == 0


@pytest.mark.parametrize("bad", ["nul\x00here@example.org", "lone\ud800@example.org"])
def test_text_redis_cannot_keep_is_refused_before_anything_is_sent(redis_prefix, bad):
    # A Redis nobody listens on: INVALID, not STORE_UNAVAILABLE, proves nothing was sent.
    with caches_with(nowhere=f"redis://127.0.0.1:{closed_port()}/0"):
        store = store_at(redis_prefix, "nowhere")
        with pytest.raises(QueueError) as error:
            store.add(new(recipients=[bad]))
        assert error.value.code == "INVALID"
        with pytest.raises(QueueError) as error:
            store.claim(owner="w\x00", now=T0, lease_until=T0 + LEASE)
        assert error.value.code == "INVALID"
        assert store.get("nul\x00id") is None


# -- damage: keys evicted or deleted ------------------------------------------------------


def test_an_item_whose_hash_is_gone_is_dropped_by_the_next_claim(redis_store, redis_prefix, redis_client):
    gone, kept = redis_store.add(new(key="k")), redis_store.add(new())
    redis_client.delete(f"{redis_prefix}item:{gone.id}")
    assert [i.id for i in redis_store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=10)] == [kept.id]
    assert redis_store.count() == 1
    assert redis_client.exists(f"{redis_prefix}message:{gone.id}") == 0
    # Its idempotency key is free again.
    assert redis_store.add(new(key="k")).id != gone.id


def test_a_leased_item_whose_hash_is_gone_is_dropped_once_its_lease_ends(redis_store, redis_prefix, redis_client):
    added = redis_store.add(new())
    claim_one(redis_store, "w1")
    redis_client.delete(f"{redis_prefix}item:{added.id}")
    assert redis_store.list() == []
    assert claim_one(redis_store, "w2", now=T0 + LEASE) is None
    assert redis_store.count() == 0
    assert redis_client.exists(f"{redis_prefix}message:{added.id}") == 0


def test_an_item_whose_message_alone_is_gone_fails_as_unreadable(redis_settings, redis_prefix, redis_client):
    errors = []

    def on_error(sender, error, item_id, **kwargs):
        errors.append((error.code, item_id))

    signals.error.connect(on_error)
    try:
        with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **redis_settings}):
            # The null sender: no DSN, so the pass needs no network at all.
            item = queue.enqueue(b"Subject: lost\r\n\r\nbody\r\n", sender="", recipients=["a@example.org"])
            redis_client.delete(f"{redis_prefix}message:{item.id}")
            assert queue.store.read_message(item.id) is None
            assert queue.get(item.id) is not None
            stats = queue.deliver_due()
            assert queue.count() == 0
    finally:
        signals.error.disconnect(on_error)
    assert (stats.items, stats.failed) == (1, 1)
    assert errors == [("MESSAGE_UNREADABLE", item.id)]


# -- scripts ------------------------------------------------------------------------------


def test_script_flush_changes_nothing(redis_store, redis_client):
    first = redis_store.add(new())
    redis_client.script_flush()
    second = redis_store.add(new())  # EVALSHA finds nothing: EVAL, which caches it again
    assert [i.id for i in redis_store.claim(owner="w", now=T0, lease_until=T0 + LEASE, limit=5)] == [
        first.id,
        second.id,
    ]
    redis_client.script_flush()
    assert redis_store.renew(first.id, owner="w", lease_until=T0 + 2 * LEASE) is True
    assert redis_store.reschedule(second.id, at=T0, owner="w") is True
    assert redis_store.cancel(second.id).id == second.id
    assert [i.id for i in redis_store.list()] == [first.id]


def test_max_items_holds_across_concurrent_adds(redis_store):
    refused = Counter()

    def add_many_times():
        for _ in range(20):
            try:
                redis_store.add(new(), max_items=30)
            except QueueError as error:
                refused[error.code] += 1

    threads = [threading.Thread(target=add_many_times) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert redis_store.count() == 30
    assert refused == {"FULL": 50}


def test_concurrent_claimers_never_share_an_item(redis_store):
    ids = [item.id for item in redis_store.add_many([new() for _ in range(200)])]
    claimed: list[str] = []

    def claim_until_empty(owner):
        while batch := redis_store.claim(owner=owner, now=T0, lease_until=T0 + LEASE, limit=3):
            claimed.extend(item.id for item in batch)

    threads = [threading.Thread(target=claim_until_empty, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == sorted(ids)


def test_a_batch_with_one_key_twice_adds_it_once(redis_store):
    first, again = redis_store.add_many([new(key="twice"), new(key="twice")])
    assert first.id == again.id
    assert first is not again and first.recipients is not again.recipients
    assert redis_store.count() == 1


def test_an_add_sent_again_after_a_lost_reply_adds_nothing(redis_store):
    item = new()
    redis_store.add(item)
    assert redis_store.add(item).id == item.id
    assert redis_store.count() == 1


def test_a_leased_item_retried_later_than_its_lease_waits_for_that_time(redis_store):
    added = redis_store.add(new())
    claim_one(redis_store, "w1")
    later = T0 + 2 * LEASE
    assert redis_store.reschedule(added.id, at=later) is True
    assert claim_one(redis_store, "w2", now=T0 + LEASE) is None  # the lease ended, the retry is not due
    assert claim_one(redis_store, "w2", now=later).id == added.id


# -- Redis out of memory, out of reach ------------------------------------------------------


def squeeze(client):
    """Lower ``maxmemory`` below what Redis holds, so that every write that adds is refused."""
    client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) // 2))


def test_a_full_redis_refuses_the_enqueue_and_keeps_nothing_half_written(redis_servers, redis_prefix):
    server = redis_servers("--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
    with caches_with(full=server.url):
        store = store_at(redis_prefix, "full")
        kept = []
        with pytest.raises(QueueError) as error:
            for _ in range(200):
                kept.append(store.add(new(message=b"x" * 100_000)).id)
        assert error.value.code == "STORE_FULL"
        assert "maxmemory" in error.value.message and "nothing was written" in error.value.message
        assert 0 < len(kept) < 200
        assert store.count() == len(kept)
        client = server.client()
        # The refused add's own bytes may be what crossed the line: hold Redis past it.
        squeeze(client)
        with pytest.raises(QueueError, match="maxmemory") as error:
            store.add_many([new(), new()])
        assert error.value.code == "STORE_FULL"
        client.config_set("maxmemory", "4mb")
        assert len(list(client.scan_iter(match=f"{redis_prefix}item:*"))) == len(kept)
        assert len(list(client.scan_iter(match=f"{redis_prefix}message:*"))) == len(kept)
        # Workers still claim and record what is queued: delivering frees the memory.
        now = T0 + timedelta(days=1)
        claimed = store.claim(owner="w", now=now, lease_until=now + LEASE, limit=10)
        assert [item.id for item in claimed] == kept[:10]
        assert store.renew(kept[0], owner="w", lease_until=now + 2 * LEASE) is True
        delivered = {claimed[0].recipients[0].address: (RecipientStatus.DELIVERED, OK)}
        assert store.complete(kept[0], owner="w", result=result(now, **delivered)).is_finished
        for item in claimed[1:]:
            assert store.reschedule(item.id, at=now, owner="w") is True
            assert store.cancel(item.id) is not None
        assert store.add(new()).id not in kept
        assert len(list(client.scan_iter(match=f"{redis_prefix}message:*"))) == len(kept) - 10 + 1
        client.close()


def test_enqueue_into_a_full_redis_raises_store_full_and_writes_nothing(redis_servers, redis_prefix):
    server = redis_servers("--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
    raw = {
        "HOSTNAME": "mta.example.com",
        "STORE": "redis",
        "REDIS_CONNECTION": "full",
        "REDIS_KEY_PREFIX": redis_prefix,
    }
    client = server.client()
    with caches_with(full=server.url), override_settings(BUMAIL_QUEUE=raw):
        body = b"From: app@example.com\r\nSubject: Hi\r\n\r\n" + b"x" * 100_000 + b"\r\n"
        queued = 0
        with pytest.raises(QueueError) as error:
            for _ in range(200):
                queue.enqueue(body, sender="app@example.com", recipients=["user@example.org"])
                queued += 1
        assert error.value.code == "STORE_FULL"
        assert "CACHES['full']" in error.value.message
        assert 0 < queued < 200
        squeeze(client)
        before = sorted(client.scan_iter(match=f"{redis_prefix}*"))
        # A batch of three, one of them small: refused whole, not one key of it written.
        messages = [EmailMessage("Hi", "x" * n, "app@example.com", ["user@example.org"]) for n in (10, 100_000, 10)]
        with pytest.raises(QueueError) as error:
            queue.enqueue_many(messages)
        assert error.value.code == "STORE_FULL"
        assert sorted(client.scan_iter(match=f"{redis_prefix}*")) == before
        assert queue.count() == queued
    client.close()


def allkeys_lru_server(redis_servers):
    return redis_servers("--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru")


def test_a_redis_that_may_evict_is_refused_before_anything_is_written(redis_servers, redis_prefix):
    server = allkeys_lru_server(redis_servers)
    with caches_with(evicting=server.url):
        store = store_at(redis_prefix, "evicting")
        with pytest.raises(QueueConfigurationError) as error:
            store.add(new())
        assert "maxmemory-policy 'allkeys-lru'" in error.value.message
        assert "noeviction" in error.value.message
        client = server.client()
        assert client.dbsize() == 0  # not an item, not a message, not the layout key
        # Fixed while the process runs: the store works from the next call.
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
        assert store.add(new()).id


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "noeviction"])
def test_a_policy_that_never_evicts_the_queues_keys_is_accepted(redis_servers, redis_prefix, policy):
    # The volatile-* policies evict only keys with a time to live; the store sets none.
    server = redis_servers("--maxmemory", "4mb", "--maxmemory-policy", policy)
    with caches_with(q=server.url):
        store = store_at(redis_prefix, "q")
        assert store.check() == []
        assert store.add(new()).id


def test_the_store_check_reports_a_redis_that_may_evict_as_e022(redis_servers, redis_prefix):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    server = allkeys_lru_server(redis_servers)
    with caches_with(evicting=server.url):
        messages = store_at(redis_prefix, "evicting").check()
        assert [(type(m), m.id) for m in messages] == [(checks.Error, "bumail_queue.E022")]
        assert "maxmemory-policy 'allkeys-lru'" in messages[0].msg
        raw = {
            "HOSTNAME": "mta.example.com",
            "STORE": "redis",
            "REDIS_CONNECTION": "evicting",
            "REDIS_KEY_PREFIX": redis_prefix,
        }
        with override_settings(BUMAIL_QUEUE=raw), pytest.raises(SystemCheckError, match=r"bumail_queue\.E022"):
            call_command("check")


def test_the_policy_is_read_from_info_where_config_is_refused(redis_servers, redis_prefix):
    # Managed Redis services forbid CONFIG; INFO memory still says the policy.
    server = allkeys_lru_server(redis_servers)
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config")
    admin.close()
    with caches_with(managed=f"redis://app:pw@127.0.0.1:{server.port}/0"):
        messages = store_at(redis_prefix, "managed").check()
        assert [m.id for m in messages] == ["bumail_queue.E022"]
        with pytest.raises(QueueConfigurationError, match="allkeys-lru"):
            store_at(redis_prefix, "managed").count()


def test_a_policy_nobody_may_read_is_a_warning_and_the_store_works(redis_servers, redis_prefix):
    server = redis_servers()
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config", "-info")
    admin.close()
    with caches_with(locked=f"redis://app:pw@127.0.0.1:{server.port}/0"):
        store = store_at(redis_prefix, "locked")
        messages = store.check()
        assert [(type(m), m.id) for m in messages] == [(checks.Warning, "bumail_queue.W003")]
        assert "refused both CONFIG GET and INFO" in messages[0].msg
        assert store.add(new()).id


def test_a_redis_out_of_reach_is_a_check_warning_not_a_crash(redis_prefix):
    with caches_with(nowhere=f"redis://:not-a-real-password@127.0.0.1:{closed_port()}/0"):
        messages = store_at(redis_prefix, "nowhere").check()
    assert [(type(m), m.id) for m in messages] == [(checks.Warning, "bumail_queue.W003")]
    assert "could not be reached through CACHES['nowhere']" in messages[0].msg
    assert "not-a-real-password" not in messages[0].msg


def test_a_redis_out_of_reach_is_store_unavailable_and_never_shows_the_password(redis_prefix):
    with caches_with(nowhere=f"redis://:not-a-real-password@127.0.0.1:{closed_port()}/0"):
        store = store_at(redis_prefix, "nowhere")
        with pytest.raises(QueueError) as error:
            store.count()
    assert error.value.code == "STORE_UNAVAILABLE"
    assert "CACHES['nowhere']" in error.value.message
    assert "not-a-real-password" not in str(error.value)


# -- enqueue on commit ------------------------------------------------------------------------


def test_an_enqueue_inside_a_transaction_happens_on_commit(redis_settings):
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **redis_settings}):
        with transaction.atomic():
            item = queue.enqueue(EmailMessage("Hi", "Body", "app@example.com", ["a@example.org"]))
            assert queue.count() == 0
        assert queue.get(item.id) == item
        with pytest.raises(RuntimeError), transaction.atomic():
            queue.enqueue(EmailMessage("Hi", "Body", "app@example.com", ["b@example.org"]))
            raise RuntimeError("rolled back")
        assert queue.count() == 1


def scripts_run(client) -> int:
    """How many Lua scripts the Redis server has run since it started."""
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("eval", "evalsha"))


def test_send_mass_mail_and_enqueue_many_are_one_script_whatever_the_batch(redis_servers):
    server = redis_servers()  # a server of its own: no other test's scripts are counted
    queue_settings = {"HOSTNAME": "mta.example.com", "STORE": "redis", "REDIS_CONNECTION": "own"}
    with caches_with(own=server.url), override_settings(BUMAIL_QUEUE=queue_settings), use_queue_backend():
        queue.enqueue(EmailMessage("warm-up", "Body", "app@example.com", ["w@example.org"]))  # checks the server once
        client = server.client()
        before = scripts_run(client)
        send_mass_mail([(f"m{n}", "Hello.", "app@example.com", [f"m{n}@example.org"]) for n in range(200)])
        queue.enqueue_many(
            [EmailMessage(f"n{n}", "Body", "app@example.com", [f"n{n}@example.org"]) for n in range(200)]
        )
        assert scripts_run(client) - before == 2
        assert queue.count() == 401
        client.close()


def test_a_view_whose_transaction_rolls_back_queues_nothing_in_redis(client, redis_settings):
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **redis_settings}), use_queue_backend():
        client.raise_request_exception = False
        assert client.get("/send-then-fail/").status_code == 500
        assert queue.count() == 0
        assert client.get("/send-many/", {"n": "3"}).status_code == 200
        assert queue.count() == 3


# -- waking idle workers ----------------------------------------------------------------------


def test_an_idle_listener_wakes_within_milliseconds_of_an_enqueue(redis_store):
    listener = redis_store.listener()
    try:
        assert listener.wait(0.05) is False
        threading.Timer(0.2, lambda: redis_store.add(new())).start()
        started = time.monotonic()
        assert listener.wait(10) is True
        assert time.monotonic() - started < 1
        # A retry and a give-back announce too.
        added = redis_store.add(new())
        listener.wait(0.1)
        redis_store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=10)
        assert redis_store.reschedule(added.id, at=T0, owner="w1") is True
        assert listener.wait(1) is True
    finally:
        listener.close()


# -- checks -------------------------------------------------------------------------------------


def test_the_test_settings_redis_alias_passes_the_store_check(redis_store):
    assert redis_store.check() == []


@pytest.mark.parametrize(
    ("caches", "text"),
    [
        ({}, "CACHES has no such alias"),
        ({"q": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}, "not django-redis's RedisCache"),
        (
            {"q": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:6379/0",
                   "OPTIONS": {"CONNECTION_POOL_KWARGS": {"decode_responses": True}}}},
            "decode_responses",
        ),
        (
            {"q": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": ["redis://127.0.0.1:6379/0"],
                   "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient"}}},
            "shards keys",
        ),
    ],
    ids=["missing", "locmem", "decoding", "sharded"],
)  # fmt: skip
def test_a_redis_connection_the_store_cannot_use_is_e018(redis_prefix, caches, text):
    with override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}, **caches}):
        messages = store_at(redis_prefix, "q").check()
    assert [(type(m), m.id) for m in messages] == [(checks.Error, "bumail_queue.E018")]
    assert text in messages[0].msg


def test_the_check_command_runs_the_redis_store_check(redis_prefix):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    raw = {
        "HOSTNAME": "mta.example.com",
        "STORE": "redis",
        "REDIS_CONNECTION": "missing",
        "REDIS_KEY_PREFIX": redis_prefix,
    }
    with override_settings(BUMAIL_QUEUE=raw), pytest.raises(SystemCheckError, match=r"bumail_queue\.E018"):
        call_command("check")


def test_a_delivered_item_leaves_nothing_behind(redis_store, redis_prefix, redis_client):
    added = redis_store.add(new(key="done", recipients=["a@example.org"]))
    claim_one(redis_store)
    recorded = redis_store.complete(
        added.id, owner="w1", result=result(T0, **{"a@example.org": (RecipientStatus.DELIVERED, OK)})
    )
    assert recorded.is_finished
    # The layout, the sequence and where the channels' round-robin stands: no item.
    assert sorted(k.decode() for k in redis_client.scan_iter(match=f"{redis_prefix}*")) == [
        f"{redis_prefix}schema",
        f"{redis_prefix}seq",
        f"{redis_prefix}turn",
    ]


def test_store_redis_is_a_setting_that_builds_the_redis_store(redis_settings):
    from bumail_queue.checks import check_settings, check_store
    from bumail_queue.stores import get_store

    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **redis_settings}):
        assert isinstance(get_store(), RedisStore)
        assert check_settings(None) == []
        assert check_store(None) == []


def test_the_store_works_under_the_acl_user_the_docs_give(redis_servers, settings):
    from pathlib import Path

    docs = (Path(settings.BASE_DIR).parent / "docs" / "redis.md").read_text()
    (acl,) = [line for line in docs.splitlines() if line.startswith("ACL SETUSER ")]
    server = redis_servers()
    admin = server.client()
    admin.execute_command(*acl.split())
    admin.close()
    with caches_with(limited=f"redis://bumail-worker:a-long-secret@127.0.0.1:{server.port}/0"):
        store = store_at("myapp:mail:", "limited")
        assert store.check() == []  # the eviction policy is read through INFO
        listener = store.listener()
        try:
            first, second = store.add_many([new(key="k"), new()], max_items=10)
            assert listener.wait(5) is True
            assert [i.id for i in store.list()] == [first.id, second.id]
            assert (store.count(), store.get(first.id).id, store.read_message(first.id)[:5]) == (2, first.id, b"From:")
            assert [m[:5] for m in store.read_messages([first.id]).values()] == [b"From:"]
            assert [h[:5] for h in store.read_message_heads([first.id], size=5).values()] == [b"From:"]
            assert store.lanes() == [("default", 0)]
            store.gauge_sample_rows = 1  # counted on the sorted sets, split from a draw
            assert store.gauges(now=T0).total == 2
            by_id = store.add(new(priority=5, channel="alerts"))
            assert [i.id for i in store.claim_items([by_id.id], owner="t", now=T0, lease_until=T0 + LEASE)] == [
                by_id.id
            ]
            assert store.cancel(by_id.id).id == by_id.id
            claimed = store.claim(owner="w", now=T0, lease_until=T0 + LEASE, limit=2)
            assert store.renew(first.id, owner="w", lease_until=T0 + 2 * LEASE) is True
            delivered = {claimed[0].recipients[0].address: (RecipientStatus.DELIVERED, OK)}
            assert store.complete(first.id, owner="w", result=result(T0, **delivered)).is_finished
            assert store.reschedule(second.id, at=T0, owner="w") is True
            assert claim_one(store, "w2").id == second.id
            later = {second.recipients[0].address: (RecipientStatus.DEFERRED, OK)}
            assert store.complete(second.id, owner="w2", result=result(T0 + LEASE, **later)).attempts == 1
            assert store.cancel(second.id).id == second.id
            assert store.count() == 0
            policy = sts_policy("example.org", id="one")
            store.put_sts_policy(policy)
            assert store.get_sts_policy("example.org") == policy
            counted = tls_count(date(2026, 1, 1), result=None)
            store.count_tls_sessions([counted])
            assert store.tls_session_counts(date(2026, 1, 1)) == [counted]
            assert store.purge_tls_session_counts(before=date(2026, 1, 2)) == 1
            entry = suppression("gone@example.org")
            store.update_suppressions(SuppressionChange(add=(entry,)), now=T0)
            assert store.suppressions_of(["gone@example.org"], now=T0) == {"gone@example.org": entry}
            assert (store.search_suppressions(now=T0, text="gone"), store.count_suppressions(now=T0)) == ([entry], 1)
            assert store.purge_suppressions(now=entry.expires_at) == 1
            slot = PermitRequest(
                key="example.net", limits=Limits(concurrency=1), now=T0, slot="s1", slot_until=T0 + LEASE
            )
            assert store.take_permit(slot).granted
            assert store.renew_permit("example.net", slot="s1", now=T0, until=T0 + 2 * LEASE) is True
            store.release_permit("example.net", slot="s1", now=T0)
            assert [s.key for s in store.destination_states(now=T0)] == ["example.net"]
            assert store.forget_idle_destinations(before=T0 + LEASE, now=T0 + LEASE) == 1
        finally:
            listener.close()
        # A key outside the prefix is out of the user's reach.
        with pytest.raises(QueueError, match="ACL"):
            store_at("other:", "limited").count()


def test_complete_many_records_a_batch_after_redis_lost_its_scripts(redis_store, redis_client):
    added = redis_store.add_many([new(recipients=[f"r{n}@example.org"]) for n in range(3)])
    redis_store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=3)
    redis_client.script_flush()  # every script of the pipeline answers NOSCRIPT: each is sent by its text
    done = redis_store.complete_many(
        owner="w1",
        results=[
            (item.id, result(T0 + LEASE, **{item.recipients[0].address: (RecipientStatus.DEFERRED, OK)}))
            for item in added
        ],
    )
    assert [(d.attempts, d.lease_owner) for d in done] == [(1, None)] * 3
    assert [redis_store.get(item.id) for item in added] == done


def test_message_heads_are_read_in_one_round_trip(redis_store, redis_prefix, redis_client):
    first, second, lost = redis_store.add_many([new(message=b"Subject: one\r\n\r\n" + b"x" * 100), new(), new()])
    redis_client.delete(f"{redis_prefix}message:{lost.id}")
    heads = redis_store.read_message_heads([first.id, second.id, lost.id, "not-an-id"], size=12)
    assert heads == {first.id: b"Subject: one", second.id: redis_store.read_message(second.id)[:12]}


def test_a_retry_reads_the_waiting_items_a_page_at_a_time(redis_store, monkeypatch):
    # Pages of 3 over items all due at one time: each page goes on past the items of
    # its last score that it kept, and none is passed over or moved twice.
    monkeypatch.setattr("bumail_queue.stores.redis.items.RETRY_PAGE", 3)
    slow = [tried_once(redis_store, [f"s{n}@slow.example"]).id for n in range(5)]
    fast = [tried_once(redis_store, [f"f{n}@fast.example"]).id for n in range(5)]
    leased = tried_once(redis_store, ["l@slow.example"], until=T0 + timedelta(minutes=20))
    claim_one(redis_store, "w2", now=leased.next_attempt_at)  # its lease ends as the others fall due: one score
    now = T0 + timedelta(minutes=1)
    assert redis_store.retry_deferred(now=now, domain="slow.example") == 5
    assert redis_store.retry_deferred(now=now) == 5
    assert {item.id for item in redis_store.list() if item.next_attempt_at == now} == {*slow, *fast}
    assert redis_store.get(leased.id).lease_owner == "w2"
