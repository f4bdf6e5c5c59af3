"""``manage.py queue_status``, in text and in JSON, on every store; how ``queue_worker`` runs."""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.items import AttemptResult, Outcome, RecipientStatus, Reply
from bumail_queue.management.commands.queue_worker import Command as WorkerCommand
from bumail_queue.stores import get_store
from tests import processes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_name(request):
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {}
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store}):
        yield request.param


def enqueue(*recipients, at=None):
    raw = b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n"
    return queue.enqueue(raw, sender="app@example.com", recipients=list(recipients), at=at)


def status(*args):
    out = StringIO()
    call_command("queue_status", *args, stdout=out)
    return out.getvalue()


def fill():
    enqueue("a@slow.example", "b@slow.example", "c@fast.example")
    enqueue("d@slow.example", at=timezone.now() + timedelta(hours=1))
    deferred = enqueue("e@other.example")
    store, now = get_store(), timezone.now()
    claimed = store.claim(owner="w", now=now + timedelta(seconds=1), lease_until=now + timedelta(minutes=5), limit=10)
    for item in claimed:
        if item.id != deferred.id:
            store.reschedule(item.id, at=now, owner="w")
    later = Reply(code=451, status="4.3.0", text="later")
    store.complete(
        deferred.id,
        owner="w",
        result=AttemptResult(
            outcomes={"e@other.example": Outcome(status=RecipientStatus.DEFERRED, reply=later)},
            next_attempt_at=now + timedelta(minutes=30),
        ),
    )


def test_queue_status_text(store_name):
    fill()
    text = status()
    lines = text.splitlines()
    assert lines[0] == "3 items queued: 2 queued, 1 deferred, 0 being delivered; 1 due now."
    assert lines[1].startswith("Oldest: queued ")
    assert "5 recipients pending" in text
    header = next(line for line in lines if "total" in line)
    assert header.split() == [
        "total",
        "<5m",
        "5-10m",
        "10-20m",
        "20-40m",
        "40-80m",
        "80-160m",
        "160-320m",
        "320-640m",
        "640-1280m",
        "1280m+",
    ]
    assert lines[-4].split()[:4] == ["all", "domains", "5", "5"]
    assert lines[-3].split()[:3] == ["slow.example", "3", "3"]
    assert {line.split()[0] for line in lines[-2:]} == {"fast.example", "other.example"}


def test_queue_status_shows_each_channel_and_priority(store_name):
    fill()
    raw = b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n"
    for n in range(3):
        queue.enqueue(
            raw, sender="app@example.com", recipients=[f"r{n}@example.org"], channel="newsletter", priority=-10
        )
    queue.enqueue(raw, sender="app@example.com", recipients=["ops@example.org"], channel="alerts", priority=50)
    lines = status().splitlines()
    start = lines.index("Items by channel and priority (channels take turns, the higher priority first in each):")
    table = [line.split() for line in lines[start + 2 : lines.index("", start + 2)]]
    assert table == [
        ["channel", "priority", "items", "due"],
        ["alerts", "50", "1", "1"],
        ["default", "0", "3", "1"],
        ["newsletter", "-10", "3", "3"],
    ]
    data = json.loads(status("--json"))
    assert data["lanes"] == [
        {"channel": "alerts", "priority": 50, "total": 1, "due": 1},
        {"channel": "default", "priority": 0, "total": 3, "due": 1},
        {"channel": "newsletter", "priority": -10, "total": 3, "due": 3},
    ]


def test_queue_status_top_leaves_domains_out(store_name):
    fill()
    text = status("--top", "1")
    assert "slow.example" in text and "fast.example" not in text
    assert "(2 more domains; --top to show more)" in text


def test_queue_status_json(store_name):
    fill()
    data = json.loads(status("--json"))
    assert data["total"] == 3
    assert data["by_state"] == {"queued": 2, "deferred": 1, "delivering": 0, "held": 0}
    assert data["due"] == 1
    assert data["pending_recipients"] == 5
    assert data["age_buckets"][0] == "<5m" and data["age_buckets"][-1] == "1280m+"
    assert data["domains"][0] == {"domain": "slow.example", "total": 3, "buckets": [3] + [0] * 9}
    assert data["bucket_totals"][0] == 5
    assert data["oldest_created_at"] is not None
    assert data["domains_left_out"] == 0


def test_queue_status_of_an_empty_queue(store_name):
    assert status().splitlines() == [
        "0 items queued: 0 queued, 0 deferred, 0 being delivered; 0 due now.",
        "The queue is empty.",
    ]
    assert json.loads(status("--json"))["domains"] == []
    assert json.loads(status("--json"))["lanes"] == []


def test_queue_worker_on_the_command_line_spares_the_collector_its_start_up_objects():
    # On the command line the process ends with the command: what start-up made is
    # frozen out of every collection, and so is the rest at the end. Under
    # call_command the caller goes on, and the collector is left as it was.
    gc.unfreeze()
    try:
        call_command("queue_worker", "--burst", stdout=StringIO())
        assert gc.get_freeze_count() == 0
        WorkerCommand(stdout=StringIO()).run_from_argv(["manage.py", "queue_worker", "--burst"])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


#: What only a delivery, a DSN or a preview needs: a burst run that finds nothing due
#: never imports it (docs/architecture.md, "The worker process").
DELIVERY_ONLY_MODULES = [
    "bumail_queue.delivery.smtp",
    "bumail_queue.delivery.dkim",
    "bumail_queue.delivery.dns",
    "bumail_queue.delivery.mta_sts",
    "smtplib",
    "dkim",
    "dns.resolver",
    "urllib3",
    "nh3",
    "idna",
]


def test_queue_worker_on_an_empty_queue_imports_no_delivery_code():
    # In a process of its own: this one has imported everything already.
    database = {"NAME": connection.settings_dict["NAME"], "TEST": {"NAME": connection.settings_dict["NAME"]}}
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        loaded = pool.apply(processes.modules_an_empty_burst_loads, (database, DELIVERY_ONLY_MODULES))
    assert loaded == []


def test_queue_worker_says_at_start_where_mail_goes_routes_included(caplog):
    routes = {f"d{n}.example": {"TYPE": "smarthost", "HOST": "relay.example.net", "TLS": "none"} for n in range(4)}
    settings = {"ROUTE": {"TYPE": "mx"}, "ROUTES": routes, "HOSTNAME": "mta.example.com"}
    with override_settings(BUMAIL_QUEUE=settings), caplog.at_level(logging.INFO, logger="bumail_queue"):
        call_command("queue_worker", "--burst", stdout=StringIO())

    (start,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("starting ")]
    assert " route=mx routes=4 (d0.example, d1.example, d2.example, ...) " in start
