"""The delivery log: written by the worker's outcomes and by cancel, kept, purged by age."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from bumail_queue import delivery_log, queue
from bumail_queue.items import Reply
from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from tests.helpers import ScriptedTransport

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SETTINGS = {
    "HOSTNAME": "mta.example.com",
    "ROUTE": {"TYPE": "smarthost", "HOST": "relay.example.net", "PORT": 2525, "TLS": "none"},
    "RETRY_JITTER": 0,
}
OK = Reply(code=250, status="2.0.0", text="OK queued as 1234")
LATER = Reply(code=451, status="4.3.0", text="Try again later")
UNKNOWN = Reply(code=550, status="5.1.1", text="No such user")


def Transport(replies=None):
    """Answers each recipient from ``replies``; 250 for the rest; from relay.example.net."""
    return ScriptedTransport(replies, default=OK)


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_name(request):
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {}
    with override_settings(BUMAIL_QUEUE={**SETTINGS, **store}):
        yield request.param


def enqueue(recipients, *, at=T0):
    raw = f"From: app@example.com\r\nTo: {', '.join(recipients)}\r\nSubject: Hello\r\n\r\nHi.\r\n".encode()
    return QueueService(clock=lambda: at).enqueue(raw, sender="app@example.com", recipients=recipients)


def deliver(transport, now=T0):
    return QueueService(clock=lambda: now).deliver_due(now=now, transport=transport)


def rows():
    return [
        (e.recipient, e.status, e.reply_code, e.reply_status, e.reply_text, e.remote_host, e.sender)
        for e in DeliveryLog.objects.order_by("id")
    ]


def test_every_outcome_is_logged_with_its_reply_and_remote_host(store_name):
    item = enqueue(["ok@example.org", "later@example.org", "gone@example.org"])
    deliver(Transport({"later@example.org": LATER, "gone@example.org": UNKNOWN}))
    logged = [r for r in rows() if r[0] != "app@example.com"]  # leave out the DSN's own delivery
    assert logged == [
        ("ok@example.org", "delivered", 250, "2.0.0", "OK queued as 1234", "relay.example.net", "app@example.com"),
        ("later@example.org", "deferred", 451, "4.3.0", "Try again later", "relay.example.net", "app@example.com"),
        ("gone@example.org", "failed", 550, "5.1.1", "No such user", "relay.example.net", "app@example.com"),
    ]
    entries = DeliveryLog.objects.filter(item_id=item.id)
    assert {e.domain for e in entries} == {"example.org"}
    deferred = entries.get(status="deferred")
    assert deferred.next_attempt_at == queue.get(item.id).next_attempt_at
    assert deferred.logged_at is not None


def test_the_log_outlives_the_item(store_name):
    item = enqueue(["ok@example.org"])
    deliver(Transport())
    assert queue.get(item.id) is None
    assert [(e.recipient, e.status) for e in delivery_log.history(item.id)] == [("ok@example.org", "delivered")]


def test_a_deferral_past_max_age_is_logged_as_expired(store_name):
    item = enqueue(["later@example.org"])
    deliver(Transport({"later@example.org": LATER}), now=T0 + timedelta(days=6))
    [entry] = DeliveryLog.objects.filter(item_id=item.id)
    assert (entry.status, entry.reply_status) == ("expired", "4.4.7")
    assert "Delivery time expired" in entry.reply_text


def test_cancel_through_the_service_logs_each_pending_recipient(store_name):
    item = enqueue(["a@example.org", "b@example.net"])
    assert queue.cancel(item.id) is not None
    assert sorted((e.recipient, e.status, e.sender, e.domain) for e in delivery_log.history(item.id)) == [
        ("a@example.org", "cancelled", "app@example.com", "example.org"),
        ("b@example.net", "cancelled", "app@example.com", "example.net"),
    ]
    assert queue.cancel(item.id) is None
    assert DeliveryLog.objects.count() == 2  # a second cancel finds nothing and logs nothing


def test_delivery_log_false_turns_it_off():
    with override_settings(BUMAIL_QUEUE={**SETTINGS, "DELIVERY_LOG": False}):
        item = enqueue(["ok@example.org", "x@example.org"])
        deliver(Transport({"x@example.org": LATER}))
        queue.cancel(item.id)
    assert DeliveryLog.objects.count() == 0


def test_a_log_that_cannot_be_written_never_stops_delivery(store_name, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("the log's database is down")

    item = enqueue(["ok@example.org"])
    monkeypatch.setattr(DeliveryLog, "save", broken)
    monkeypatch.setattr(delivery_log, "write", broken)  # how the worker writes a batch's entries
    stats = deliver(Transport())
    assert stats.delivered == 1 and queue.get(item.id) is None
    assert f"a delivery log entry could not be written item={item.id}" in caplog.text


def test_reply_line():
    entry = DeliveryLog(reply_code=550, reply_status="5.1.1", reply_text="5.1.1 No such user")
    assert entry.reply_line == "550 5.1.1 No such user"
    assert (
        DeliveryLog(reply_code=None, reply_status="4.4.1", reply_text="Connection refused").reply_line
        == "4.4.1 Connection refused"
    )
    assert DeliveryLog(reply_code=None, reply_status="", reply_text="").reply_line == ""


# -- purging --------------------------------------------------------------------------------


def log_at(when, n=1):
    for i in range(n):
        delivery_log.record(
            item_id="00000000-0000-4000-8000-000000000001", recipient=f"r{i}@example.org", status="delivered", at=when
        )


def test_purge_deletes_old_entries_in_batches():
    now = datetime.now(tz=UTC)
    log_at(now - timedelta(days=40), n=7)
    log_at(now - timedelta(days=10), n=2)
    assert delivery_log.purge(older_than=timedelta(days=30), now=now, batch_size=3) == 7
    assert DeliveryLog.objects.count() == 2
    assert delivery_log.purge(older_than=timedelta(days=30), now=now) == 0


def test_queue_purge_command():
    now = datetime.now(tz=UTC)
    log_at(now - timedelta(days=40), n=3)
    log_at(now - timedelta(hours=2))
    out = StringIO()
    call_command("queue_purge", "--older-than", "30d", "--dry-run", stdout=out)
    assert out.getvalue().startswith("Would delete 3 delivery log entries older than 30 days (before ")
    assert DeliveryLog.objects.count() == 4
    out = StringIO()
    call_command("queue_purge", "--older-than", "1h", "--batch-size", "2", stdout=out)
    assert out.getvalue().startswith("Deleted 4 delivery log entries older than 1 hour (before ")


def test_queue_purge_defaults_to_the_retention_setting():
    now = datetime.now(tz=UTC)
    log_at(now - timedelta(days=31))
    log_at(now - timedelta(days=29))
    call_command("queue_purge", stdout=StringIO())  # DELIVERY_LOG_RETENTION: 30 days
    assert DeliveryLog.objects.count() == 1
    with override_settings(BUMAIL_QUEUE={**SETTINGS, "DELIVERY_LOG_RETENTION": timedelta(days=7)}):
        call_command("queue_purge", stdout=StringIO())
    assert DeliveryLog.objects.count() == 0


def test_queue_purge_without_a_retention_needs_older_than():
    with (
        override_settings(BUMAIL_QUEUE={**SETTINGS, "DELIVERY_LOG_RETENTION": None}),
        pytest.raises(CommandError, match="--older-than"),
    ):
        call_command("queue_purge", stdout=StringIO())


@pytest.mark.parametrize("value", ["30", "0d", "3x", "d", "-1d", "1d 2h", "999999d", "99999999999999999999w"])
def test_queue_purge_refuses_a_duration_it_cannot_read(value):
    with pytest.raises(CommandError, match=r"duration|longer than"):
        call_command("queue_purge", f"--older-than={value}", stdout=StringIO())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("2w", timedelta(weeks=2)),
        ("90m", timedelta(minutes=90)),
        ("45S", timedelta(seconds=45)),
    ],
)
def test_durations(value, expected):
    from bumail_queue.management.arguments import duration

    assert duration(value) == expected


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(days=30), "30 days"),
        (timedelta(days=31), "31 days"),
        (timedelta(days=1, hours=12, minutes=5), "1 day, 12 hours"),
        (timedelta(hours=1), "1 hour"),
        (timedelta(minutes=2, seconds=1), "2 minutes, 1 second"),
        (timedelta(0), "0 seconds"),
    ],
)
def test_durations_are_described_without_a_calendar(span, text):
    from bumail_queue.management.arguments import describe_duration

    assert describe_duration(span) == text


# -- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"DELIVERY_LOG": "yes"}, "DELIVERY_LOG"),
        ({"DELIVERY_LOG": 1}, "DELIVERY_LOG"),
        ({"DELIVERY_LOG_RETENTION": 0}, "DELIVERY_LOG_RETENTION"),
        ({"DELIVERY_LOG_RETENTION": "30d"}, "DELIVERY_LOG_RETENTION"),
        ({"DELIVERY_LOG_RETENTION": timedelta(days=-1)}, "DELIVERY_LOG_RETENTION"),
    ],
)
def test_wrong_log_settings_are_e020(raw, key):
    from bumail_queue.conf import validate

    assert [(p.id, p.key) for p in validate({"HOSTNAME": "mta.example.com", **raw})] == [("bumail_queue.E020", key)]


def test_log_settings_are_loaded():
    from bumail_queue.conf import load

    host = {"HOSTNAME": "mta.example.com"}
    default = load(host)
    assert (default.delivery_log, default.delivery_log_retention) == (True, timedelta(days=30))
    loaded = load({**host, "DELIVERY_LOG": False, "DELIVERY_LOG_RETENTION": None})
    assert (loaded.delivery_log, loaded.delivery_log_retention) == (False, None)
    assert load({**host, "DELIVERY_LOG_RETENTION": 3600}).delivery_log_retention == timedelta(hours=1)
