"""Worker processes sharing one Redis queue, delivering to a real SMTP server on loopback.

Each test keeps its queue under a key prefix of its own. The test that stops Redis
starts a ``redis-server`` of its own (append-only file, ``appendfsync always``) and
points the worker at it through ``REDIS_URL``.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.conf import settings as django_settings
from django.core.mail import EmailMessage
from django.test import override_settings
from django_redis import get_redis_connection

from bumail_queue import queue
from tests.conftest import REDIS_ALIAS
from tests.helpers import (
    printed,
    read_all,
    redis_monitor,
    running_worker,
    smarthost,
    start_worker,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def messages(count, first=0):
    return [
        EmailMessage(f"m{n}", "Body", "app@example.com", [f"user{n}@example.org"]) for n in range(first, first + count)
    ]


def recipients(server):
    return Counter(rcpt for message in server.messages for rcpt in message.rcpt_tos)


def test_two_workers_deliver_a_thousand_messages_each_exactly_once(smtp_server, redis_settings):
    settings = smarthost(smtp_server, POLL_SECONDS=0.2, **redis_settings)
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue_many(messages(1000))
        workers = [start_worker(settings, "--concurrency", "4", "--burst") for _ in range(2)]
        outputs = [read_all(worker) for worker in workers]
        # SCRIPT FLUSH under them, as a Redis restart or failover would: each script
        # is sent by its text once, and nothing else changes.
        client = get_redis_connection(REDIS_ALIAS)
        for delivered in (100, 400, 700):
            wait_until(lambda: len(smtp_server.messages) >= delivered or all(w.poll() is not None for w in workers), 30)  # noqa: B023
            client.script_flush()
        for worker, (output, reader) in zip(workers, outputs, strict=True):
            worker.wait(timeout=120)
            reader.join(5)
            assert worker.returncode == 0, "".join(output)
        assert queue.count() == 0
    assert recipients(smtp_server) == Counter({f"user{n}@example.org": 1 for n in range(1000)})


def test_a_worker_killed_mid_delivery_has_its_items_delivered_by_another_after_the_lease(smtp_servers, redis_settings):
    server = smtp_servers(stall_at="DATA_END", stall_seconds=30)
    settings = smarthost(server, POLL_SECONDS=0.2, LEASE_SECONDS=2, **redis_settings)
    with override_settings(BUMAIL_QUEUE=settings):
        items = queue.enqueue_many(messages(3))
        killed = start_worker(settings)
        read_all(killed)
        try:
            assert wait_until(lambda: server.verbs().count("DATA") == 3), "the sessions did not start"
            killed.kill()
            killed.wait(timeout=10)
        finally:
            if killed.poll() is None:
                killed.kill()
        held = [queue.get(item.id) for item in items]
        assert all(item.lease_owner is not None and item.attempts == 0 for item in held)  # nothing recorded
        server.stall_at = None  # the next sessions go through
        with running_worker(settings) as (worker, _):
            assert wait_until(lambda: queue.count() == 0), "the items did not come back"
    assert worker.returncode == 0
    assert recipients(server) == Counter({f"user{n}@example.org": 1 for n in range(3)})


def test_redis_restarted_under_a_running_worker_loses_nothing(smtp_servers, redis_servers, redis_prefix):
    redis = redis_servers("--appendonly", "yes", "--appendfsync", "always")
    # Each delivery takes a moment, so some are under way when Redis goes.
    smtp = smtp_servers(stall_at="DATA_END", stall_seconds=0.05)
    settings = smarthost(
        smtp,
        POLL_SECONDS=0.2,
        LEASE_SECONDS=2,
        STORE="redis",
        REDIS_CONNECTION=REDIS_ALIAS,
        REDIS_KEY_PREFIX=redis_prefix,
    )
    caches = {
        **django_settings.CACHES,
        REDIS_ALIAS: {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis.url},
    }
    with override_settings(BUMAIL_QUEUE=settings, CACHES=caches):
        queue.enqueue_many(messages(20))
        # What Redis acknowledged survives a crash: appendfsync always.
        redis.kill()
        redis.start()
        assert queue.count() == 20
        with running_worker(settings, "--concurrency", "4", redis_url=redis.url) as (worker, lines):
            assert wait_until(lambda: len(smtp.messages) >= 5), "the worker did not deliver"
            redis.kill()
            # The worker finds it gone before it comes back.
            assert wait_until(printed(lines, "STORE_UNAVAILABLE")), (
                f"the lost connection was not reported:\n{''.join(lines)}"
            )
            redis.start()
            queue.enqueue_many(messages(20, first=20))
            expected = {f"user{n}@example.org" for n in range(40)}
            assert wait_until(lambda: set(recipients(smtp)) == expected and queue.count() == 0, 60), (
                f"{len(set(recipients(smtp)))} of 40 delivered; queue {queue.count()}; worker said:\n{''.join(lines)}"
            )
    assert worker.returncode == 0, "".join(lines)
    assert any("STORE_UNAVAILABLE" in line for line in lines), "the lost connection was not reported"


def test_an_idle_worker_is_woken_by_redis_not_by_its_poll(smtp_server, redis_settings):
    # The poll is a minute away: mail that arrives sooner came through Pub/Sub.
    settings = smarthost(smtp_server, POLL_SECONDS=60, **redis_settings)
    channel = f"{redis_settings['REDIS_KEY_PREFIX']}wake"
    client = get_redis_connection(REDIS_ALIAS)
    url = django_settings.CACHES[REDIS_ALIAS]["LOCATION"]
    with redis_monitor(url) as commands, running_worker(settings, "--owner", "idle-worker") as (worker, lines):
        assert wait_until(lambda: dict(client.pubsub_numsub(channel)).get(channel.encode()) == 1), (
            f"the worker did not subscribe:\n{''.join(lines)}"
        )
        # Its claim names the owner and this test's prefix: once it has run and found
        # nothing, only a wake-up or the poll starts the next.
        claimed = f'"{redis_settings["REDIS_KEY_PREFIX"]}" "idle-worker"'
        assert wait_until(lambda: any(claimed in line for line in list(commands))), "the worker did not claim"
        with override_settings(BUMAIL_QUEUE=settings):
            queue.enqueue(EmailMessage("Wake", "Body", "app@example.com", ["a@example.org"]))
            started = time.monotonic()
            assert wait_until(lambda: len(smtp_server.messages) == 1, seconds=20)
            took = time.monotonic() - started
    assert took < 5
    assert worker.returncode == 0
