"""A QUOTA held across three ``queue_worker`` processes, on PostgreSQL and on Redis.

Three workers share one destination's quota of 50 recipients a rolling day through the
store; 80 are queued. What is checked is what the receiving server saw, and what the
queue kept: exactly 50 arrive, the other 30 wait untried until the window has moved;
then workers whose clock runs two days later (the window moved) deliver the 30, each
once.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from datetime import timedelta

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from tests.helpers import running_worker, wait_until
from tests.servers.dns import DNSZone
from tests.test_shaping_end_to_end import said_by, stop_line

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOMAIN = "quota.test"


@pytest.fixture(
    params=[pytest.param("orm", marks=pytest.mark.postgres), pytest.param("redis", marks=pytest.mark.redis)]
)
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {}


@contextlib.contextmanager
def three_workers(settings, clock_ahead=None):
    with contextlib.ExitStack() as stack:
        started = [
            stack.enter_context(running_worker(settings, "--concurrency", "4", clock_ahead=clock_ahead))
            for _ in range(3)
        ]
        yield started
    for worker, lines in started:
        assert worker.returncode == 0, "".join(lines)


def test_three_workers_keep_to_a_daily_quota_and_send_the_rest_when_the_window_moves(
    smtp_server, dns_server, store_settings
):
    dns_server.zone = DNSZone({DOMAIN: {"MX": [(10, f"mx1.{DOMAIN}")]}, f"mx1.{DOMAIN}": {"A": ["127.0.0.1"]}})
    settings = {
        "HOSTNAME": "mta.example.com",
        **dns_server.queue_settings(smtp_server.port),
        "POLL_SECONDS": 0.2,
        "CLAIM_BATCH_SIZE": 5,  # small claims: every worker takes part
        "SHAPING": {DOMAIN: {"QUOTA": "50/d"}},
        **store_settings,
    }
    with override_settings(BUMAIL_QUEUE=settings):
        items = queue.enqueue_many(
            [EmailMessage(f"m{n}", "Body", "app@example.com", [f"user{n}@{DOMAIN}"]) for n in range(80)]
        )
        started_at = timezone.now()

        def waiting_a_day():
            kept = [queue.get(item.id) for item in items]
            later = started_at + timedelta(hours=23)
            return [i for i in kept if i is not None and i.next_attempt_at > later and i.lease_owner is None]

        with three_workers(settings) as started:
            assert wait_until(lambda: len(waiting_a_day()) == 30, 90), (
                f"{len(smtp_server.messages)} arrived, {len(waiting_a_day())} wait:\n" + said_by(started)
            )
        # Every item either went or waits for the window: nothing else can have gone.
        assert len(smtp_server.messages) == 50
        waiting = waiting_a_day()
        assert {i.attempts for i in waiting} == {0}  # held back, never tried
        # Room comes back when what was sent leaves the rolling 24 hours, not before.
        assert min(i.next_attempt_at for i in waiting) >= started_at + timedelta(hours=24)
        stopped = [stop_line(lines) for _, lines in started]
        assert sum(stop["delivered"] for stop in stopped) == 50
        assert sum(1 for stop in stopped if stop["delivered"]) >= 2, stopped  # the quota was shared
        states = {state.key: state for state in queue.destination_states()}
        assert states[DOMAIN].quota_text == "50 of 50 recipients in 24 hours"

        with three_workers(settings, clock_ahead=timedelta(days=2)) as started:
            assert wait_until(lambda: len(smtp_server.messages) >= 80 and queue.count() == 0, 90), (
                f"{len(smtp_server.messages)} of 80 arrived:\n" + said_by(started)
            )
    arrived = Counter(rcpt for message in smtp_server.messages for rcpt in message.rcpt_tos)
    assert arrived == Counter({f"user{n}@{DOMAIN}": 1 for n in range(80)})
