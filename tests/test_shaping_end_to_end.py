"""SHAPING held across three ``queue_worker`` processes, on PostgreSQL and on Redis.

The workers send straight to the MX host of ``shaped.test`` (the loopback SMTP server,
found through the test DNS server), each with more sessions of its own than the limit
allows, so only the store's shared bucket keeps them to it. What is checked is what the
receiving server saw: when each message arrived, how many sessions it had open at once.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from datetime import timedelta

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings

from bumail_queue import queue
from bumail_queue.stores import get_store
from tests.helpers import printed, running_worker, wait_until
from tests.servers.dns import DNSZone

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKERS = 3
DOMAIN = "shaped.test"


@pytest.fixture(
    params=[pytest.param("orm", marks=pytest.mark.postgres), pytest.param("redis", marks=pytest.mark.redis)]
)
def store_settings(request):
    """The ``BUMAIL_QUEUE`` keys of the store the workers share: PostgreSQL, or Redis."""
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {}


def mx_settings(dns_server, server, store_settings, **extra):
    dns_server.zone = DNSZone({DOMAIN: {"MX": [(10, f"mx1.{DOMAIN}")]}, f"mx1.{DOMAIN}": {"A": ["127.0.0.1"]}})
    return {
        "HOSTNAME": "mta.example.com",
        **dns_server.queue_settings(server.port),
        "POLL_SECONDS": 0.2,
        **store_settings,
        **extra,
    }


def enqueue(count, *, first=0):
    return queue.enqueue_many(
        [EmailMessage(f"m{n}", "Body", "app@example.com", [f"user{n}@{DOMAIN}"]) for n in range(first, first + count)]
    )


def recipients(server):
    return Counter(rcpt for message in server.messages for rcpt in message.rcpt_tos)


@contextlib.contextmanager
def workers(settings, *args):
    """Three ``queue_worker`` processes on ``settings``, stopped (SIGTERM) at the end."""
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(running_worker(settings, "--concurrency", "8", *args)) for _ in range(WORKERS)]
        yield started
    for worker, lines in started:
        assert worker.returncode == 0, "".join(lines)


def test_a_rate_holds_at_the_receiver_across_three_workers(smtp_server, dns_server, store_settings):
    # Small claims, so that every worker holds some of the mail and the bucket is shared.
    settings = mx_settings(
        dns_server, smtp_server, store_settings, SHAPING={DOMAIN: {"RATE": "10/s"}}, CLAIM_BATCH_SIZE=5
    )
    with override_settings(BUMAIL_QUEUE=settings):
        enqueue(100)
        with workers(settings) as started:
            assert wait_until(lambda: len(smtp_server.messages) >= 100, 90), (
                f"{len(smtp_server.messages)} of 100 arrived:\n" + said_by(started)
            )
            assert wait_until(lambda: queue.count() == 0)
    assert recipients(smtp_server) == Counter({f"user{n}@{DOMAIN}": 1 for n in range(100)})
    arrivals = sorted(message.received_at for message in smtp_server.messages)
    # A bucket of 10 tokens, refilled 10 a second: the first 10 at once, 90 over 9 s.
    assert arrivals[-1] - arrivals[0] >= 8
    # Within any second, the bucket and one second's refill (20), and room for a busy
    # machine to have delayed a few sessions' replies into the same second.
    assert max(sum(1 for t in arrivals if start <= t < start + 1) for start in arrivals) <= 30
    # Items held back were given back without an attempt: every item was tried once.
    stopped = [stop_line(lines) for _, lines in started]
    assert sum(stop["items"] for stop in stopped) == 100
    assert sum(stop["held"] for stop in stopped) > 0  # the workers did hold items back
    # The rate held with more than one worker sending, each asking the one bucket.
    assert sum(1 for stop in stopped if stop["delivered"]) >= 2, stopped


def test_concurrency_is_never_exceeded_at_the_receiver(smtp_servers, dns_server, store_settings):
    # Each session lasts a moment, so the workers' sessions would overlap without the limit.
    server = smtp_servers(stall_at="DATA_END", stall_seconds=0.2)
    settings = mx_settings(dns_server, server, store_settings, SHAPING={DOMAIN: {"CONCURRENCY": 2}})
    with override_settings(BUMAIL_QUEUE=settings):
        enqueue(30)
        with workers(settings) as started:
            assert wait_until(lambda: len(server.messages) >= 30, 90), (
                f"{len(server.messages)} of 30 arrived:\n" + said_by(started)
            )
    assert recipients(server) == Counter({f"user{n}@{DOMAIN}": 1 for n in range(30)})
    assert server.most_sessions == 2  # reached, never passed
    assert server.connections == 30  # a counted session keeps no idle connection


def test_a_slow_down_reply_suspends_the_destination_for_every_worker(smtp_servers, dns_server, store_settings):
    # The sixth message is answered "slow down"; one session at a time, so none is
    # under way when that reply comes.
    server = smtp_servers(
        message_reply=["250 2.0.0 Queued"] * 5 + ["421 4.7.0 Try again later, closing connection", "250 2.0.0 Queued"]
    )
    suspend = 6
    settings = mx_settings(
        dns_server,
        server,
        store_settings,
        SHAPING={DOMAIN: {"CONCURRENCY": 1, "SUSPEND": suspend}},
        RETRY_MIN_DELAY=1,
        RETRY_MAX_DELAY=1,
        RETRY_JITTER=0,
        # Small claims, so that every worker holds some of the mail while it is suspended.
        CLAIM_BATCH_SIZE=2,
    )
    with override_settings(BUMAIL_QUEUE=settings):
        enqueue(20)
        with workers(settings) as started:
            assert wait_until(lambda: server.verbs().count("DATA") >= 6, 60), "the sixth message was not sent"
            refused_at = [c.at for c in server.commands if c.verb == "DATA"][5]
            # Seen from the store while it lasts: the destination is suspended.
            assert wait_until(lambda: suspended_until() is not None, 5)
            # Mail that comes while it lasts wakes every worker at once. Fifteen claims'
            # worth: the one worker that knows of the suspension cannot take them all
            # before the others claim some and ask the store for room.
            enqueue(30, first=20)
            ends = suspended_until()
            assert ends is not None and ends > _now(), "the suspension ended before the new mail came"
            assert wait_until(lambda: len(recipients(server)) >= 50, 90), (
                f"{len(recipients(server))} of 50 arrived:\n" + said_by(started)
            )
    assert recipients(server) == Counter({f"user{n}@{DOMAIN}": 1 for n in range(50)})
    later = [c.at for c in server.commands if c.verb == "EHLO" and c.at > refused_at]
    assert later, "nothing was sent after the suspension"
    assert min(later) - refused_at >= suspend  # no worker started a session before it ended
    suspending = [n for n, (_, lines) in enumerate(started) if printed(lines, f"suspended destination={DOMAIN}")()]
    assert len(suspending) == 1
    # The other workers learnt of the suspension from the store, not from a reply of their own.
    told = [n for n, (_, lines) in enumerate(started) if printed(lines, f"destination={DOMAIN} reason=suspended")()]
    assert set(told) - set(suspending), "no other worker was held back by the stored suspension\n" + said_by(started)


def suspended_until():
    """When the store says the suspension of ``DOMAIN`` ends, or ``None``."""
    ends = [s.suspended_until for s in get_store().destination_states(now=_now()) if s.suspended_until]
    return max(ends, default=None)


def said_by(started):
    """What every worker printed so far, each under a line of its own."""
    return "".join(f"--- worker {n}\n" + "".join(list(lines)) for n, (_, lines) in enumerate(started))


def stop_line(lines):
    """The counts of a worker's ``stopped`` line."""
    said = "".join(lines)
    found = re.search(r"stopped items=(\d+) delivered=(\d+) deferred=(\d+) failed=(\d+) held=(\d+)", said)
    assert found, said
    return dict(zip(("items", "delivered", "deferred", "failed", "held"), map(int, found.groups()), strict=True))


def _now():
    from django.utils import timezone

    return timezone.now()


def test_a_suspension_is_a_stored_state_every_worker_reads(smtp_server, dns_server, store_settings):
    """The store's view: suspended in one place, refused everywhere (no worker needed)."""
    settings = mx_settings(dns_server, smtp_server, store_settings, SHAPING={DOMAIN: {}})
    with override_settings(BUMAIL_QUEUE=settings):
        enqueue(3)
        now = _now()
        get_store().release_permit(DOMAIN, slot=None, now=now, suspend_until=now + timedelta(minutes=5))
        stats = queue.deliver_due(now=now)
        held = queue.list()
    assert (stats.items, stats.held, smtp_server.connections) == (0, 3, 0)
    # Due again when the suspension ends, spread out; no attempt counted.
    assert min(item.next_attempt_at for item in held) == now + timedelta(minutes=5)
    assert [item.attempts for item in held] == [0, 0, 0]


def test_a_killed_workers_slot_comes_back_when_its_lease_ends(smtp_servers, dns_server, store_settings):
    # One slot; the first session stalls after its message, and its worker is killed there.
    server = smtp_servers(stall_at="DATA_END", stall_seconds=30)
    settings = mx_settings(dns_server, server, store_settings, SHAPING={DOMAIN: {"CONCURRENCY": 1}}, LEASE_SECONDS=3)
    with override_settings(BUMAIL_QUEUE=settings):
        enqueue(3)
        with running_worker(settings, "--concurrency", "4") as (killed, _):
            assert wait_until(lambda: server.verbs().count("DATA") == 1), "the first session did not start"
            first = next(c.at for c in server.commands if c.verb == "EHLO")
            killed.kill()
            killed.wait(timeout=10)
        server.stall_at = None
        with workers(settings):
            assert wait_until(lambda: len(recipients(server)) == 3, 60), f"{len(recipients(server))} of 3 arrived"
    assert recipients(server) == Counter({f"user{n}@{DOMAIN}": 1 for n in range(3)})
    later = [c.at for c in server.commands if c.verb == "EHLO" and c.at > first]
    # Nobody took the dead worker's slot before its lease ended (the permit came a
    # moment before its EHLO, hence the margin), and one session at a time even so.
    assert min(later) - first >= 2.5
    assert server.most_sessions == 1
