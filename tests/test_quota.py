"""QUOTA and WARMUP without processes: the settings, the schedule, what a worker sends
day by day under an injected clock, and what operators see (queue_status, the admin's
overview, the metrics). The store's side is ``ShapingContract``; three worker processes
sharing one quota: test_quota_end_to_end.py."""

from __future__ import annotations

import datetime as dt
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from bumail_queue.conf import load, validate
from bumail_queue.metrics.queue import QueueCollector
from bumail_queue.quota import Quota, parse_quota
from bumail_queue.service import QueueService
from bumail_queue.shaping import Limits, PermitRequest
from bumail_queue.stores import get_store
from tests.helpers import ScriptedTransport
from tests.metrics.test_queue_gauges import scraped
from tests.test_shaping import MX, MXResolver, message, queue_status

DAY = timedelta(days=1)
START = datetime(2026, 3, 1, tzinfo=UTC)


# -- the settings --------------------------------------------------------------------------


def test_a_quota_and_its_warm_up_load_from_the_settings():
    settings = load(
        {
            "SHAPING": {
                "postmark": {"QUOTA": "50000/d", "WARMUP": [[3, 50], [4, 200]], "WARMUP_START": "2026-03-01"},
                "example.com": {"QUOTA": "100/h", "COUNT": "messages", "RATE": "1/s"},
                "example.org": {"WARMUP": [[1, 10]], "WARMUP_START": dt.date(2026, 3, 1)},
            }
        }
    )
    assert settings.shaping["postmark"].quota == Quota(
        count=50000, period=86400.0, warmup=((3, 50), (4, 200)), warmup_start=START
    )
    assert settings.shaping["example.com"].quota == Quota(count=100, period=3600.0, counts_recipients=False)
    assert settings.shaping["example.org"].quota == Quota(count=None, warmup=((1, 10),), warmup_start=START)
    assert load({"SHAPING": {"example.com": {"RATE": "1/s"}}}).shaping["example.com"].quota is None


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        ({"QUOTA": "50000/w"}, "QUOTA that is not 'N/d' (a rolling 24 hours) or 'N/h' (a rolling hour)"),
        ({"QUOTA": 50000}, "QUOTA that is not 'N/d'"),
        ({"QUOTA": "0/d"}, "QUOTA that is not 'N/d'"),
        ({"QUOTA": "10/d", "COUNT": "bytes"}, "COUNT that is not 'recipients' or 'messages': 'bytes'"),
        ({"COUNT": "messages"}, "COUNT without QUOTA or WARMUP"),
        ({"WARMUP": [[3, 50]]}, "WARMUP without WARMUP_START"),
        ({"WARMUP": [[3, 0]], "WARMUP_START": "2026-03-01"}, "WARMUP that is not a list of [days, quota] steps"),
        ({"WARMUP": [50, 100], "WARMUP_START": "2026-03-01"}, "WARMUP that is not a list"),
        ({"WARMUP": [], "WARMUP_START": "2026-03-01"}, "WARMUP that is not a list"),
        ({"WARMUP": [[3, 50]], "WARMUP_START": "March 1st"}, "WARMUP_START that is not a date or 'YYYY-MM-DD'"),
        ({"WARMUP_START": "2026-03-01"}, "WARMUP_START without WARMUP"),
    ],
)
def test_a_wrong_quota_is_e028_saying_what_is_wrong(limits, says):
    problems = validate({"SHAPING": {"example.com": limits}})
    assert [p.id for p in problems] == ["bumail_queue.E028"]
    assert says in problems[0].message


def test_quotas_are_counted_per_day_or_hour():
    assert parse_quota("50000/d") == (50000, 86400.0)
    assert parse_quota(" 200 / h ") == (200, 3600.0)
    assert parse_quota("10/m") is None


def test_the_warm_up_gives_each_day_its_steps_quota_then_the_full_quota():
    quota = Quota(count=1000, warmup=((2, 50), (3, 200), (1, 5000)), warmup_start=START)
    by_day = [quota.allowed_at(START + n * DAY + timedelta(hours=12)) for n in range(8)]
    # Two days of 50, three of 200, one of 5000 capped by QUOTA, then QUOTA.
    assert by_day == [50, 50, 200, 200, 200, 1000, 1000, 1000]
    assert quota.allowed_at(START - DAY) == 50  # before its start: the first step's
    assert Quota(count=None, warmup=((1, 10),), warmup_start=START).allowed_at(START + 2 * DAY) is None


def test_the_quota_next_rises_at_the_start_of_a_higher_step():
    quota = Quota(count=1000, warmup=((2, 50), (3, 200), (1, 200)), warmup_start=START)
    assert quota.next_rise(START + timedelta(hours=5)) == START + 2 * DAY
    assert quota.next_rise(START + 3 * DAY) == START + 6 * DAY  # the step of the same quota is no rise
    assert quota.next_rise(START + 7 * DAY) is None  # warmed up
    assert Quota(count=50).next_rise(START) is None


# -- what a worker sends, day by day ----------------------------------------------------------


def deliver(service, now, transport):
    return service.deliver_due(now=now, transport=transport, resolver=MXResolver())


def delivered_to(transport):
    return sorted(address for envelope, _, _ in transport.envelopes for address in envelope.recipients)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("store", ["memory", "orm"])
def test_a_worker_keeps_to_the_warm_up_day_by_day(store):
    day_one = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    shaping = {"warm.example": {"WARMUP": [[1, 2], [1, 4]], "WARMUP_START": "2026-03-01", "QUOTA": "100/d"}}
    with override_settings(BUMAIL_QUEUE={**MX, "STORE": store, "SHAPING": shaping}):
        service = QueueService(clock=lambda: day_one)
        for n in range(10):
            service.enqueue(message(f"u{n}@warm.example"))
        transport = ScriptedTransport()
        stats = deliver(service, day_one + timedelta(seconds=1), transport)
        assert (stats.delivered, len(delivered_to(transport))) == (2, 2)
        assert service.count() == 8
        # Nothing more that day, whenever a worker looks.
        deliver(service, day_one + timedelta(hours=10), transport)
        assert len(delivered_to(transport)) == 2
        # The second day allows four in any 24 hours: the items held come back at its
        # start, half an hour apart (a bin's length over the quota), and two more fit
        # beside the first day's two, which still count until 10:00.
        deliver(service, day_one + DAY - timedelta(hours=8), transport)  # 01:00
        assert len(delivered_to(transport)) == 2 + 2
        # Once the first day's two have left the window, two more; all are due by 14:00.
        deliver(service, day_one + DAY + timedelta(hours=5), transport)
        assert len(delivered_to(transport)) == 2 + 4
        deliver(service, day_one + DAY + timedelta(hours=14), transport)
        assert len(delivered_to(transport)) == 2 + 4  # four in 24 hours, whenever a worker looks
        # The warm-up is over: QUOTA's 100, for the items due again once the second day's
        # four leave the window.
        deliver(service, day_one + 2 * DAY + timedelta(hours=11), transport)
        assert service.count() == 0
    assert delivered_to(transport) == sorted(f"u{n}@warm.example" for n in range(10))


@pytest.mark.django_db(transaction=True)
def test_a_quota_counts_recipients_unless_it_counts_messages():
    now = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    for count, expected in (("recipients", 1), ("messages", 3)):
        shaping = {"many.example": {"QUOTA": "3/d", "COUNT": count}}
        with override_settings(BUMAIL_QUEUE={**MX, "STORE": "memory", "SHAPING": shaping}):
            service = QueueService(clock=lambda: now)
            for n in range(3):
                service.enqueue(message(f"a{n}@many.example", f"b{n}@many.example", f"c{n}@many.example"))
            transport = ScriptedTransport()
            for minutes in (1, 2, 3):  # the three items go on parallel threads: give each its turn
                deliver(service, now + timedelta(minutes=minutes), transport)
            assert len(transport.envelopes) == expected, count


# -- what operators see ---------------------------------------------------------------------------


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def counted(request, settings):
    """A store on which ``quota.example`` counted 30 recipients of its daily 50 just now."""
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}
    settings.BUMAIL_QUEUE = {**MX, **store, "SHAPING": {"quota.example": {"QUOTA": "50/d"}}}
    from django.utils import timezone

    now = timezone.now()
    limits = load(settings.BUMAIL_QUEUE).shaping["quota.example"]
    assert get_store().take_permit(PermitRequest(key="quota.example", limits=limits, now=now, cost=30)).granted
    return now


@pytest.mark.django_db(transaction=True)
def test_queue_status_shows_each_quotas_use(counted):
    assert "  quota.example: 0 sessions; quota 30 of 50 recipients in 24 hours" in queue_status()
    (shown,) = json.loads(queue_status("--json"))["shaped_destinations"]
    assert (shown["quota_used"], shown["quota"], shown["quota_counts"]) == (30, 50, "recipients")


@pytest.mark.django_db(transaction=True)
def test_the_admin_overview_shows_each_quotas_use(counted, admin_client):
    from django.urls import reverse

    page = admin_client.get(reverse("admin:bumail_queue_item_overview")).content.decode()
    assert '<th scope="col">Quota used</th>' in page
    assert "<td>30 of 50 recipients in 24 hours</td>" in page


@pytest.mark.django_db(transaction=True)
def test_the_metrics_show_each_quotas_use_and_limit(counted):
    samples = scraped(QueueCollector(clock=lambda: counted))
    assert samples[("bumail_queue_quota_used", (("destination", "quota.example"),))] == 30
    assert samples[("bumail_queue_quota_limit", (("destination", "quota.example"),))] == 50


@pytest.mark.django_db
def test_the_metrics_leave_quotas_out_without_one():
    with override_settings(BUMAIL_QUEUE={**MX, "STORE": "memory", "SHAPING": {"*": {"CONCURRENCY": 2}}}):
        samples = scraped(QueueCollector())
    assert not any(name.startswith("bumail_queue_quota") for name, _ in samples)


def test_a_state_without_a_quota_in_force_says_none():
    from bumail_queue.shaping import DestinationState

    state = DestinationState(key="x", sessions=0, window=None, suspended_until=None, held=0, held_until=None)
    assert state.with_quota(Limits(), START).quota_text is None
    assert state.with_quota(Limits(quota=Quota(count=7)), START).quota_text == "0 of 7 recipients in 24 hours"
