"""Mail from send_mail() to a real SMTP server on loopback, through the worker."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.core.mail import EmailMessage, send_mail
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.items import RecipientStatus
from bumail_queue.stores import get_store
from tests.helpers import (
    postgres_worker_idle,
    printed,
    read_all,
    running_worker,
    smarthost,
    start_worker,
    use_queue_backend,
    wait_until,
)
from tests.servers.dns import DNSZone

pytestmark = pytest.mark.django_db(transaction=True)


def test_send_mail_then_deliver_due_reaches_the_smarthost_over_one_connection(smtp_server):
    # One session at a time to the smarthost, so each transaction can reuse the last one's connection.
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, DOMAIN_CONCURRENCY=1)), use_queue_backend():
        for n in range(3):
            EmailMessage(
                f"Note {n}", "Hello.", "app@example.com", [f"user{n}@example.org"], bcc=["audit@example.com"]
            ).send()
        stats = queue.deliver_due()
    assert (stats.items, stats.delivered) == (3, 6)
    assert queue.count() == 0
    assert [m.rcpt_tos for m in smtp_server.messages] == [
        [f"user{n}@example.org", "audit@example.com"] for n in range(3)
    ]
    assert all(m.mail_from == "app@example.com" for m in smtp_server.messages)
    assert all(b"audit@example.com" not in m.data for m in smtp_server.messages)  # Bcc: envelope only
    assert b"Subject: Note 0" in smtp_server.messages[0].data
    assert smtp_server.connections == 1  # reused for the three transactions


def test_direct_to_mx_with_per_recipient_outcomes_and_a_dsn(smtp_servers, dns_server):
    mx = smtp_servers(
        rcpt_replies={"gone@example.test": "550 5.1.1 No such user", "later@example.test": "451 4.3.0 Busy"}
    )
    dns_server.zone = DNSZone({
        "example.test": {"MX": [(10, "mx1.example.test")]},
        "mx1.example.test": {"A": ["127.0.0.1"]},
        "sender.test": {"MX": [(10, "mx1.example.test")]},
    })  # fmt: skip
    settings = {"HOSTNAME": "mta.example.com", **dns_server.queue_settings(mx.port), "RETRY_JITTER": 0}
    with override_settings(BUMAIL_QUEUE=settings):
        item = queue.enqueue(
            EmailMessage("Hi", "Body", "me@sender.test", ["ok@example.test", "gone@example.test", "later@example.test"])
        )
        now = timezone.now()
        queue.deliver_due(now=now)
        kept = queue.get(item.id)
    assert [(r.address, r.status, r.reply.code) for r in kept.recipients] == [
        ("ok@example.test", RecipientStatus.DELIVERED, 250),
        ("gone@example.test", RecipientStatus.FAILED, 550),
        ("later@example.test", RecipientStatus.DEFERRED, 451),
    ]
    assert kept.next_attempt_at == now + timedelta(minutes=30)
    original, dsn = smtp_server_messages = mx.messages
    assert original.rcpt_tos == ["ok@example.test"]
    assert (dsn.mail_from, dsn.rcpt_tos) == ("", ["me@sender.test"])
    assert b"gone@example.test" in dsn.data and b"multipart/report" in dsn.data
    assert len(smtp_server_messages) == 2


def test_a_null_mx_domain_fails_at_once_without_a_connection(smtp_server, dns_server):
    dns_server.zone = DNSZone({"nomail.test": {"MX": [(0, ".")]}})
    settings = {"HOSTNAME": "mta.example.com", **dns_server.queue_settings(smtp_server.port)}
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue(b"Subject: x\r\n\r\nx\r\n", sender="", recipients=["a@nomail.test"])
        stats = queue.deliver_due()
    assert stats.failed == 1
    assert smtp_server.connections == 0
    assert queue.count() == 0


def test_a_crashed_workers_items_are_delivered_once_its_lease_expires(smtp_server):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, LEASE_SECONDS=60)):
        item = queue.enqueue(EmailMessage("Hi", "Body", "app@example.com", ["a@example.org"]))
        now = timezone.now()
        get_store().claim(owner="crashed-worker", now=now, lease_until=now + timedelta(seconds=60), limit=10)
        assert queue.deliver_due(now=now).items == 0  # the lease still holds
        assert queue.deliver_due(now=now + timedelta(seconds=60)).delivered == 1
    assert [m.rcpt_tos for m in smtp_server.messages] == [["a@example.org"]]
    assert queue.get(item.id) is None


@pytest.mark.slow
def test_queue_worker_delivers_and_stops_on_sigterm_with_status_0(smtp_server):
    settings = smarthost(smtp_server, POLL_SECONDS=0.2)
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend():
        for n in range(20):
            send_mail(f"n{n}", "Body", "app@example.com", [f"user{n}@example.org"])
    worker = start_worker(settings, "--concurrency", "4")
    try:
        assert wait_until(lambda: len(smtp_server.messages) == 20), "the worker did not deliver"
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=20)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, output
    assert "starting owner=" in output
    assert "stopped items=20 delivered=20" in output
    assert "status=delivered" in output
    assert get_store().count() == 0


@pytest.mark.slow
def test_queue_worker_does_not_start_on_a_setting_its_checks_refuse(smtp_server):
    worker = start_worker(smarthost(smtp_server, CONCURRENCY=0), "--burst")
    output, _ = worker.communicate(timeout=30)
    assert worker.returncode == 1, output
    assert "bumail_queue.E010" in output
    assert "CONCURRENCY" in output
    assert smtp_server.connections == 0


@pytest.mark.slow
def test_a_second_signal_exits_at_once_with_status_1(smtp_servers):
    server = smtp_servers(stall_at="DATA_END", stall_seconds=30)
    settings = smarthost(server, POLL_SECONDS=0.2)
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue(EmailMessage("Hi", "Body", "app@example.com", ["a@example.org"]))
    with running_worker(settings) as (worker, lines):
        assert wait_until(lambda: any(c.verb == "DATA" for c in server.commands)), "the session did not start"
        worker.send_signal(signal.SIGTERM)
        assert wait_until(printed(lines, "stopping after the deliveries under way")), "the first signal was not seen"
        assert worker.poll() is None  # still finishing its session
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=10)
    assert worker.returncode == 1


@pytest.mark.slow
def test_a_worker_killed_mid_delivery_has_its_item_delivered_by_another_after_its_lease(smtp_servers):
    server = smtp_servers(stall_at="DATA_END", stall_seconds=30)
    settings = smarthost(server, POLL_SECONDS=0.2, LEASE_SECONDS=2)
    with override_settings(BUMAIL_QUEUE=settings):
        item = queue.enqueue(EmailMessage("Hi", "Body", "app@example.com", ["a@example.org"]))
    killed = start_worker(settings)
    try:
        assert wait_until(lambda: "DATA" in server.verbs()), "the session did not start"
        killed.kill()
        killed.wait(timeout=10)
    finally:
        if killed.poll() is None:
            killed.kill()
    assert killed.returncode == -signal.SIGKILL
    held = get_store().get(item.id)
    assert (held.lease_owner is not None, held.attempts) == (True, 0)  # nothing recorded
    server.stall_at = None  # the next session goes through
    with running_worker(settings) as (worker, _lines):
        assert wait_until(lambda: len(server.messages) == 1), "the item did not come back"
        assert wait_until(lambda: get_store().get(item.id) is None), "the delivery was not recorded"
    assert worker.returncode == 0
    assert [m.rcpt_tos for m in server.messages] == [["a@example.org"]]
    assert server.connections == 2


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_deliver_a_thousand_messages_each_exactly_once(smtp_server):
    settings = smarthost(smtp_server, POLL_SECONDS=0.2)
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue_many(
            [EmailMessage(f"m{n}", "Body", "app@example.com", [f"user{n}@example.org"]) for n in range(1000)]
        )
    workers = [start_worker(settings, "--concurrency", "4", "--burst") for _ in range(2)]
    for worker in workers:
        output, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0, output
    received = [rcpt for m in smtp_server.messages for rcpt in m.rcpt_tos]
    assert sorted(received) == sorted(f"user{n}@example.org" for n in range(1000))
    assert get_store().count() == 0


@pytest.mark.slow
@pytest.mark.postgres
def test_an_idle_worker_is_woken_by_notify_not_by_its_poll(smtp_server):
    # The poll is a minute away: mail that arrives sooner came through LISTEN/NOTIFY.
    settings = smarthost(smtp_server, POLL_SECONDS=60)
    with running_worker(settings, "--owner", "idle-worker") as (worker, lines):
        assert wait_until(postgres_worker_idle("idle-worker")), f"the worker did not go idle:\n{''.join(lines)}"
        with override_settings(BUMAIL_QUEUE=settings):
            queue.enqueue(EmailMessage("Wake", "Body", "app@example.com", ["a@example.org"]))
        assert wait_until(lambda: len(smtp_server.messages) == 1, seconds=20)
    assert worker.returncode == 0


@pytest.mark.slow
@pytest.mark.postgres
def test_a_worker_whose_database_connections_drop_reconnects_and_keeps_delivering(smtp_server):
    settings = smarthost(smtp_server, POLL_SECONDS=0.2)
    with running_worker(settings) as (worker, lines), override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue(EmailMessage("First", "Body", "app@example.com", ["a@example.org"]))
        assert wait_until(lambda: len(smtp_server.messages) == 1)
        with connection.cursor() as cursor:  # as a database restart would
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        queue.enqueue(EmailMessage("Second", "Body", "app@example.com", ["b@example.org"]))
        assert wait_until(lambda: len(smtp_server.messages) == 2), "the worker stopped delivering"
    assert worker.returncode == 0
    assert any("STORE_UNAVAILABLE" in line for line in lines), "the dropped connection was not reported"


def settled(count, quiet_seconds=1.0):
    """For ``wait_until``: whether ``count()`` has not changed for ``quiet_seconds``."""
    import time

    last = [count(), time.monotonic()]

    def check():
        now = count()
        if now != last[0]:
            last[:] = [now, time.monotonic()]
            return False
        return time.monotonic() - last[1] >= quiet_seconds

    return check


@pytest.mark.slow
@pytest.mark.postgres
def test_delivery_stops_while_outcomes_cannot_be_recorded_and_a_kill_resends_only_those(smtp_server):
    # The delivery log's table is locked, so the recorder blocks on its first batch; the
    # worker then starts no session once a claim's worth of outcomes waits. Killed
    # there, it leaves to be sent again only what it had delivered and not recorded.
    import psycopg

    concurrency, claim = 4, 20
    backlog = max(concurrency, claim)  # Worker._record_backlog_limit
    settings = smarthost(
        smtp_server, POLL_SECONDS=0.2, LEASE_SECONDS=2, CONCURRENCY=concurrency, CLAIM_BATCH_SIZE=claim
    )
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue_many(
            [EmailMessage(f"m{n}", "Body", "app@example.com", [f"u{n}@example.org"]) for n in range(300)]
        )
    params = connection.settings_dict
    dsn = f"postgresql://{params['USER']}@{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}/{params['NAME']}"
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE bumail_queue_delivery_log IN ACCESS EXCLUSIVE MODE")
        killed = start_worker(settings)
        lines, _ = read_all(killed)
        try:
            assert wait_until(lambda: len(smtp_server.messages) > 0), "nothing was delivered"
            assert wait_until(settled(lambda: len(smtp_server.messages)), 60), "delivery did not stop"
            sent_while_locked = len(smtp_server.messages)
            killed.kill()
            killed.wait(timeout=10)
        finally:
            if killed.poll() is None:
                killed.kill()
        locker.rollback()

    # At most the backlog and the sessions that were under way when it filled.
    assert sent_while_locked <= backlog + concurrency, "".join(lines)
    with override_settings(BUMAIL_QUEUE=settings):
        stats = queue.deliver_due(now=timezone.now() + timedelta(seconds=5))  # past the leases
        assert queue.count() == 0
    received = [m.rcpt_tos[0] for m in smtp_server.messages]
    assert set(received) == {f"u{n}@example.org" for n in range(300)}
    duplicates = len(received) - 300
    assert 0 < duplicates <= backlog + concurrency
    assert stats.delivered == 300 - (sent_while_locked - duplicates)
