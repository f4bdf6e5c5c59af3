"""The worker on a reused connection: the next item's MAIL, RCPT and DATA go with the
final dot of the one before (RFC 2920), so each message after the first costs one round
trip. Counted from the server's side, as the reads of its connection, never timed."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.mail import EmailMessage
from django.db import connections
from django.test import override_settings
from django.utils import timezone
from prometheus_client import CollectorRegistry

from bumail_queue import queue
from bumail_queue.items import RecipientStatus
from bumail_queue.metrics.worker import WorkerMetrics
from bumail_queue.models import DeliveryLog
from bumail_queue.worker import Worker
from tests.helpers import smarthost, wait_until
from tests.servers.dns import DNSZone

pytestmark = pytest.mark.django_db(transaction=True)

N = 10


def enqueue(n: int, domain: str = "example.org") -> list[str]:
    return [
        queue.enqueue(EmailMessage(f"Note {i}", "Hello.", "app@example.com", [f"user{i}@{domain}"])).id
        for i in range(n)
    ]


def test_a_worker_sends_each_message_after_the_first_in_one_round_trip(smtp_server):
    # One session at a time to the smarthost: every item goes over the one connection.
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, DOMAIN_CONCURRENCY=1)):
        enqueue(N)
        stats = queue.deliver_due()

    assert (stats.items, stats.delivered) == (N, N)
    assert queue.count() == 0
    assert DeliveryLog.objects.filter(status=RecipientStatus.DELIVERED).count() == N
    assert sorted(m.rcpt_tos[0] for m in smtp_server.messages) == sorted(f"user{i}@example.org" for i in range(N))
    assert smtp_server.connections == 1
    assert smtp_server.verbs() == ["EHLO"] + ["MAIL", "RCPT", "DATA"] * N + ["QUIT"]
    mails = [c.read for c in smtp_server.commands if c.verb == "MAIL"]
    dots = [m.read for m in smtp_server.messages]
    # Each message's final dot came in one read with the next item's MAIL, RCPT and DATA,
    # and each message took one read of its own: N reads, one round trip each.
    assert mails[1:] == dots[:-1]
    assert dots == list(range(dots[0], dots[0] + N))
    assert len({c.read for c in smtp_server.commands}) == 2 + (N - 1) + 1  # EHLO, the first group, the rest, QUIT


def test_without_pipelining_a_reused_connection_needs_no_rset_between_messages(smtp_servers):
    server = smtp_servers(pipelining=False)
    with override_settings(BUMAIL_QUEUE=smarthost(server, DOMAIN_CONCURRENCY=1)):
        enqueue(3)
        stats = queue.deliver_due()

    assert stats.delivered == 3
    assert server.connections == 1
    assert server.verbs() == ["EHLO"] + ["MAIL", "RCPT", "DATA"] * 3 + ["QUIT"]
    assert len({c.read for c in server.commands}) == len(server.commands)  # each command waited for its reply


def test_a_follower_on_an_mx_route_goes_to_its_predecessors_host_without_a_lookup_of_its_own(smtp_server, dns_server):
    dns_server.zone = DNSZone({
        "example.test": {"MX": [(10, "mx1.example.test")]},
        "mx1.example.test": {"A": ["127.0.0.1"]},
    })  # fmt: skip
    settings = {"HOSTNAME": "mta.example.com", **dns_server.queue_settings(smtp_server.port), "DOMAIN_CONCURRENCY": 1}
    with override_settings(BUMAIL_QUEUE=settings):
        enqueue(3, domain="example.test")
        stats = queue.deliver_due()

    assert stats.delivered == 3
    assert smtp_server.connections == 1
    assert [c.read for c in smtp_server.commands if c.verb == "MAIL"][1:] == [m.read for m in smtp_server.messages][:-1]
    assert dns_server.queries.count(("example.test", "MX")) == 1  # the first item's


def two_smarthosts(first, second):
    """Settings that send example.net's mail to ``second`` and the rest to ``first``, one session at a time."""
    route = {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": second.port, "TLS": "none"}
    return smarthost(first, DOMAIN_CONCURRENCY=1, ROUTES={"example.net": route})


def test_only_mail_to_the_same_destination_follows(smtp_servers):
    first, second = smtp_servers(), smtp_servers()
    with override_settings(BUMAIL_QUEUE=two_smarthosts(first, second)):
        for i in range(4):
            domain = "example.org" if i % 2 == 0 else "example.net"
            queue.enqueue(EmailMessage(f"Note {i}", "Hello.", "app@example.com", [f"user{i}@{domain}"]))
        stats = queue.deliver_due()

    assert stats.delivered == 4
    assert [m.rcpt_tos for m in first.messages] == [["user0@example.org"], ["user2@example.org"]]
    assert [m.rcpt_tos for m in second.messages] == [["user1@example.net"], ["user3@example.net"]]
    for server in (first, second):
        assert server.connections == 1
        assert [c.read for c in server.commands if c.verb == "MAIL"][1] == server.messages[0].read


def test_an_item_with_recipients_at_two_destinations_is_not_a_follower(smtp_servers):
    first, second = smtp_servers(), smtp_servers()
    with override_settings(BUMAIL_QUEUE=two_smarthosts(first, second)):
        queue.enqueue(EmailMessage("One", "Hello.", "app@example.com", ["a@example.org"]))
        queue.enqueue(EmailMessage("Two", "Hello.", "app@example.com", ["b@example.org", "c@example.net"]))
        stats = queue.deliver_due()

    assert stats.delivered == 3
    assert [m.rcpt_tos for m in first.messages] == [["a@example.org"], ["b@example.org"]]
    assert [m.rcpt_tos for m in second.messages] == [["c@example.net"]]
    # The second item went on its own, after the first's session was back in the pool.
    assert [c.read for c in first.commands if c.verb == "MAIL"][1] != first.messages[0].read
    assert first.connections == 1


def test_the_default_settings_give_one_destination_twenty_sessions_at_once(smtp_server):
    # Postfix's default_destination_concurrency_limit: a worker's default reaches a
    # distant smarthost on 20 sessions, where 5 capped it at about 100 messages a second.
    smtp_server.hold_dots = True
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server)):
        enqueue(25)
        passes: list[object] = []

        def deliver() -> None:
            try:
                passes.append(queue.deliver_due())
            finally:
                connections.close_all()  # this thread's own

        delivering = threading.Thread(target=deliver)
        delivering.start()
        try:
            assert wait_until(lambda: smtp_server.held == 20)
        finally:
            smtp_server.hold_dots = False
            delivering.join(30)

    assert passes[0].delivered == 25
    # Every item was claimed at once, so each session the limit allowed began at once on
    # a connection of its own; the other five went on those connections afterwards.
    assert smtp_server.connections == 20
    assert smtp_server.most_held == 20


def followed(server) -> list[bool]:
    """For each MAIL after the first, whether it came in one read with the final dot before it."""
    mails = [c.read for c in server.commands if c.verb == "MAIL"]
    dots = [m.read for m in server.messages]
    return [mail == dot for mail, dot in zip(mails[1:], dots, strict=False)]


def drain_shaped(dns_server, server, pattern):
    """Queue 12 messages to example.test, whose MX host is ``server``, one session at a
    time, with a RATE of 5/s on ``pattern``; drain them once with the clock still and
    return the stats and how many items are left."""
    dns_server.zone = DNSZone(
        {"example.test": {"MX": [(10, "mx1.example.test")]}, "mx1.example.test": {"A": ["127.0.0.1"]}}
    )
    settings = {
        "HOSTNAME": "mta.example.com",
        **dns_server.queue_settings(server.port),
        "DOMAIN_CONCURRENCY": 1,
        "SHAPING": {pattern: {"RATE": "5/s"}},
    }
    with override_settings(BUMAIL_QUEUE=settings):
        enqueue(12, domain="example.test")
        stats = queue.deliver_due(now=timezone.now() + timedelta(seconds=1))
        return stats, queue.count()


def test_no_follower_goes_to_a_destination_shaping_limits_and_its_rate_holds(smtp_server, dns_server):
    # RATE is a token a session: a follower would go on its predecessor's session without
    # one. With the clock still, the bucket's 5 tokens are all there is: 5 messages go,
    # each asking for its own, though the server offers PIPELINING and 7 more wait.
    stats, left = drain_shaped(dns_server, smtp_server, "example.test")

    assert (stats.items, stats.delivered, stats.held, left) == (5, 5, 7, 7)
    assert len(smtp_server.messages) == 5
    assert smtp_server.connections == 1  # the connection is reused, each message on its own permit
    assert followed(smtp_server) == [False] * 4


def test_without_shaping_at_that_destination_its_items_follow(smtp_server, dns_server):
    # The same, shaping another destination: the session passes from item to item.
    stats, left = drain_shaped(dns_server, smtp_server, "elsewhere.test")

    assert (stats.items, stats.delivered, stats.held, left) == (12, 12, 0, 0)
    assert followed(smtp_server) == [True] * 11


def test_an_item_with_a_suppressed_recipient_follows_and_that_recipient_still_fails_at_once(smtp_servers):
    server, senders = smtp_servers(), smtp_servers()
    to_senders = {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": senders.port, "TLS": "none"}
    settings = smarthost(server, DOMAIN_CONCURRENCY=1, ROUTES={"sender.test": to_senders})
    with override_settings(BUMAIL_QUEUE=settings):
        queue.suppress("gone@example.org", note="bounced elsewhere")
        for i in range(4):
            to = [f"user{i}@example.org", "gone@example.org"]
            queue.enqueue(EmailMessage(f"Note {i}", "Hello.", "app@sender.test", to))
        queue.deliver_due()
        assert queue.count() == 0

    assert sorted(m.rcpt_tos[0] for m in server.messages) == [f"user{i}@example.org" for i in range(4)]
    assert all(len(m.rcpt_tos) == 1 for m in server.messages)
    assert not [c for c in server.commands if "gone@" in c.arg]
    assert server.connections == 1
    assert followed(server) == [True] * 3  # the suppressed recipient kept none from following
    failed = DeliveryLog.objects.filter(recipient="gone@example.org")
    assert [(entry.status, entry.reply_code, entry.reply_status) for entry in failed] == [("failed", None, "5.7.1")] * 4
    assert all("Recipient address suppressed until" in entry.reply_text for entry in failed)
    assert len(senders.messages) == 4  # a failure DSN for each


def test_a_followers_session_and_its_claim_are_measured(smtp_server):
    registry = CollectorRegistry()
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, DOMAIN_CONCURRENCY=1)):
        enqueue(N)
        stats = Worker(meter=WorkerMetrics(registry=registry)).run_until_idle()

    assert stats.delivered == N
    assert followed(smtp_server) == [True] * (N - 1)
    assert registry.get_sample_value("bumail_queue_session_duration_seconds_count") == N
    assert registry.get_sample_value("bumail_queue_claim_batch_size_sum") == N
    delivered = {"outcome": "delivered", "reply_class": "2xx", "domain": "other"}
    assert registry.get_sample_value("bumail_queue_attempts_total", delivered) == N


def test_a_follower_that_leaves_too_few_waiting_has_the_next_batch_claimed_at_once(smtp_server, monkeypatch):
    # A claim of two and one session: the first item's follower leaves nothing waiting, so
    # the worker claims its next two at once, while the first dot's reply is still held.
    # Nothing else would wake it meanwhile: no outcome is recorded and no session ends
    # before that reply, and POLL_SECONDS and the time a session takes to turn slow are
    # an hour each.
    monkeypatch.setattr("bumail_queue.worker.sessions.SLOW_SESSION_SECONDS", 3600.0)
    # A claim of two would also make two outcomes waiting to be recorded hold the next
    # follower back (the recording backlog's limit), which this test is not about.
    monkeypatch.setattr(Worker, "_record_backlog_limit", 10)
    smtp_server.hold_dots = True
    settings = smarthost(smtp_server, CONCURRENCY=1, DOMAIN_CONCURRENCY=1, CLAIM_BATCH_SIZE=2, POLL_SECONDS=3600)
    with override_settings(BUMAIL_QUEUE=settings):
        ids = enqueue(6)
        worker = Worker()
        stats = []

        def run():
            try:
                stats.append(worker.run_until_idle())
            finally:
                connections.close_all()

        def leased() -> int:
            return sum(1 for item in map(queue.get, ids) if item is not None and item.lease_owner == worker.owner)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            assert wait_until(lambda: smtp_server.held == 1)
            assert wait_until(lambda: leased() == 4)
            assert len(smtp_server.messages) == 0  # still the first message's reply held back
        finally:
            smtp_server.hold_dots = False
            thread.join(30)
        assert not thread.is_alive()

    assert (stats[0].items, stats[0].delivered) == (6, 6)
    assert queue.count() == 0
    # The items of the second claim went with their predecessors' final dots; the third
    # claim's race a loopback server's replies, which no deployment's distance lets win.
    assert followed(smtp_server)[:3] == [True] * 3


def test_a_stopping_worker_takes_no_follower_and_gives_the_rest_back(smtp_server):
    smtp_server.hold_dots = True
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, DOMAIN_CONCURRENCY=1)):
        ids = enqueue(5)
        worker = Worker()

        def run():
            try:
                worker.run()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run)
        thread.start()
        try:
            # The first dot went with the next item's commands, and waits for its reply.
            assert wait_until(lambda: smtp_server.held == 1)
            worker.stop()
        finally:
            smtp_server.hold_dots = False
            thread.join(30)
        assert not thread.is_alive()
        left = [item for item in map(queue.get, ids) if item is not None]

    # The follower taken before the stop was delivered; its own dot went alone.
    assert len(smtp_server.messages) == 2
    assert followed(smtp_server) == [True]
    assert smtp_server.verbs() == ["EHLO"] + ["MAIL", "RCPT", "DATA"] * 2 + ["QUIT"]
    assert len(left) == 3
    assert [(item.attempts, item.lease_owner) for item in left] == [(0, None)] * 3
