"""The retry schedule (RFC 5321 §4.5.4.1) and how recipients are grouped by destination."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from bumail_queue.conf import load
from bumail_queue.delivery.retry import has_expired, is_delay_due, retry_delay
from bumail_queue.delivery.routes import group_by_destination

SMARTHOST = {"TYPE": "smarthost", "HOST": "relay.example.net", "PORT": 2525, "TLS": "none"}


def test_the_default_schedule_doubles_from_30_minutes_up_to_4_hours():
    settings = load({"RETRY_JITTER": 0})
    delays = [retry_delay(n, settings) for n in range(1, 8)]
    assert delays == [timedelta(minutes=m) for m in (30, 60, 120, 240, 240, 240, 240)]


def test_jitter_only_lengthens_a_delay_and_spreads_retries():
    settings = load({})
    rng = random.Random(7)
    delays = {retry_delay(1, settings, rng) for _ in range(50)}
    assert min(delays) >= timedelta(minutes=30)  # never sooner than §4.5.4.1's minimum
    assert max(delays) <= timedelta(minutes=33)
    assert len(delays) > 40


def test_every_figure_of_the_schedule_is_a_setting():
    settings = load({"RETRY_MIN_DELAY": 60, "RETRY_MAX_DELAY": 600, "RETRY_FACTOR": 3, "RETRY_JITTER": 0})
    assert [retry_delay(n, settings).total_seconds() for n in (1, 2, 3, 4)] == [60, 180, 540, 600]


def test_max_age_and_delay_warning():
    settings = load({"MAX_AGE": timedelta(days=5), "DELAY_WARNING": timedelta(hours=4)})
    queued = datetime(2026, 1, 1, tzinfo=UTC)
    assert not is_delay_due(queued, queued + timedelta(hours=3, minutes=59), settings)
    assert is_delay_due(queued, queued + timedelta(hours=4), settings)
    assert not has_expired(queued, queued + timedelta(days=4, hours=23), settings)
    assert has_expired(queued, queued + timedelta(days=5), settings)


def test_mx_recipients_group_by_domain_and_smarthost_recipients_share_one_group():
    settings = load({"ROUTES": {"partner.example": SMARTHOST, "other.example": SMARTHOST}})
    groups = group_by_destination(
        ["a@example.org", "b@Example.ORG", "c@partner.example", "d@elsewhere.example", "e@other.example"], settings
    )
    as_lists = {(d.route.type, d.domain): addresses for d, addresses in groups.items()}
    assert as_lists == {
        ("mx", "example.org"): ["a@example.org", "b@Example.ORG"],
        ("mx", "elsewhere.example"): ["d@elsewhere.example"],
        ("smarthost", None): ["c@partner.example", "e@other.example"],
    }
    limit_keys = {d.limit_key for d in groups}
    assert limit_keys == {"example.org", "elsewhere.example", "relay.example.net:2525"}


@pytest.mark.parametrize("address", ["user@bücher.example", "user@xn--bcher-kva.example"])
def test_an_internationalised_domain_is_one_destination_however_written(address):
    settings = load({})
    [destination] = group_by_destination([address], settings)
    assert destination.domain == "xn--bcher-kva.example"
