"""The suppression list through a real worker, on every store: SMTP servers on loopback
say ``550 5.1.1``, defer until ``MAX_AGE``, or accept; the worker suppresses, fails
suppressed recipients without a session, and takes an address off when mail to it goes.

Recipients' mail goes to one server, the DSNs to the senders' domain to another, so a
test sees both what reached the recipients' server and what the sender was told.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.test import override_settings

from bumail_queue.delivery.smtp import SMTPTransport
from bumail_queue.items import Reply
from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from bumail_queue.stores import get_store
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason
from bumail_queue.worker import Worker
from tests.helpers import signals_told, wait_until
from tests.servers.dns import DNSZone

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
GONE = "gone@mail.example"
NO_SUCH_USER = "550 5.1.1 <gone@mail.example>: Recipient address rejected: User unknown"
SENDER = "app@sender.test"


class Clock:
    """The worker's and the service's clock, moved by the test."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    """The ``BUMAIL_QUEUE`` keys of each store (the ORM store on this run's database)."""
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


@pytest.fixture
def servers(smtp_servers):
    """The recipients' server, which knows no ``gone@``, and the senders' server."""
    return smtp_servers(rcpt_replies={GONE: NO_SUCH_USER}), smtp_servers()


@pytest.fixture
def told():
    """The ``failed`` and ``delivered`` signals, in order, as (name, kwargs)."""
    with signals_told("failed", "delivered") as events:
        yield events


def routed(recipients_server, senders_server, store_settings, **extra):
    """Settings that send the recipients' mail to one server and the DSNs to the other."""

    def to(server):
        return {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": server.port, "TLS": "none"}

    return {
        "HOSTNAME": "mta.example.com",
        "ROUTE": to(recipients_server),
        "ROUTES": {"sender.test": to(senders_server)},
        "POLL_SECONDS": 0.05,
        **store_settings,
        **extra,
    }


def send(clock, *recipients, subject="Hello", channel="default"):
    message = f"From: {SENDER}\r\nTo: {', '.join(recipients)}\r\nSubject: {subject}\r\n\r\nHi.\r\n".encode()
    return QueueService(clock=clock).enqueue(message, sender=SENDER, recipients=list(recipients), channel=channel)


def deliver_at(clock, now):
    clock.now = now
    return QueueService(clock=clock).deliver_due(now=now)


def rcpts(server):
    """The addresses the server was asked to take (RCPT TO), in order."""
    return [c.arg.partition(":")[2].strip().split()[0].strip("<>") for c in server.commands if c.verb == "RCPT"]


def dsns(server):
    """The DSNs the senders' server received, parsed."""
    return [email.message_from_bytes(m.data, policy=email.policy.default) for m in server.messages if m.mail_from == ""]


def recipient_block(report):
    _, status, *_ = report.iter_parts()
    return {name: str(value) for name, value in status.get_payload()[1].items()}


def report_text(report):
    return " ".join(next(report.iter_parts()).get_content().split())


@contextlib.contextmanager
def running_worker(clock):
    """A worker in a thread, as ``queue_worker`` runs it; stopped at the end."""
    worker = Worker(clock=clock)

    def run():
        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(20)
    assert not thread.is_alive()


def test_a_mailbox_that_does_not_exist_is_suppressed_and_its_next_mail_fails_at_once(servers, store_settings, told):
    recipients_server, senders_server = servers
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings)):
        queue = QueueService(clock=clock)
        with running_worker(clock):
            first = send(clock, GONE, "ann@mail.example")
            assert wait_until(lambda: queue.get(first.id) is None and len(dsns(senders_server)) == 1)
            [entry] = queue.suppressed([GONE]).values()
            assert (entry.address, entry.reason) == (GONE, SuppressionReason.FAILED)
            assert (entry.reply.code, entry.reply.status) == (550, "5.1.1")
            assert "User unknown" in entry.reply.text
            assert (entry.created_at, entry.expires_at) == (T0, T0 + timedelta(days=30))
            asked = rcpts(recipients_server)
            assert asked == [GONE, "ann@mail.example"]
            told.clear()

            # The next mail to it: the other recipient gets it, the suppressed one fails at once.
            second = send(clock, GONE, "bob@mail.example", subject="Again")
            assert wait_until(lambda: queue.get(second.id) is None and len(dsns(senders_server)) == 2)
            assert rcpts(recipients_server)[len(asked) :] == ["bob@mail.example"]
            assert [m.rcpt_tos for m in recipients_server.messages] == [["ann@mail.example"], ["bob@mail.example"]]

            # Mail to it alone starts no transaction at all (nor a session: see the null MX test).
            commands = [c.verb for c in recipients_server.commands if c.verb in ("MAIL", "RCPT", "DATA")]
            third = send(clock, GONE, subject="Once more")
            assert wait_until(lambda: queue.get(third.id) is None and len(dsns(senders_server)) == 3)
            assert [c.verb for c in recipients_server.commands if c.verb in ("MAIL", "RCPT", "DATA")] == commands

    failures = [kwargs for name, kwargs in told if name == "failed" and kwargs["envelope_sender"]]
    assert [(f["item_id"], f["recipient"]) for f in failures] == [(second.id, GONE), (third.id, GONE)]
    reply = failures[0]["reply"]
    assert (reply.code, reply.status) == (None, "5.7.1")
    assert reply.text.startswith("Recipient address suppressed until 2026-03-31 09:00 UTC: an earlier delivery failed")
    assert "550 5.1.1" in reply.text
    assert failures[0]["remote_host"] is None
    delivered = [k["recipient"] for n, k in told if n == "delivered" and k["item_id"] in {second.id, third.id}]
    assert delivered == ["bob@mail.example"]

    # The delivery log keeps the failure, with the reply that says why.
    logged = DeliveryLog.objects.get(item_id=second.id, recipient=GONE)
    assert (logged.status, logged.reply_code, logged.reply_status) == ("failed", None, "5.7.1")
    assert "suppressed until 2026-03-31 09:00 UTC" in logged.reply_text

    # The sender is told, as of any failure: not sent, and why.
    report = dsns(senders_server)[1]
    block = recipient_block(report)
    assert (block["Final-Recipient"], block["Action"], block["Status"]) == (f"rfc822; {GONE}", "failed", "5.7.1")
    assert "Diagnostic-Code" not in block and "Remote-MTA" not in block
    assert f"<{GONE}>: failed Not sent (status 5.7.1): Recipient address suppressed until 2026-03-31" in (
        report_text(report)
    )


def test_with_suppression_dsn_off_the_sender_is_not_told_of_a_suppressed_recipient(servers, store_settings, told):
    recipients_server, senders_server = servers
    clock = Clock()
    with override_settings(
        BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings, SUPPRESSION_DSN=False)
    ):
        send(clock, GONE)
        deliver_at(clock, T0)
        assert len(dsns(senders_server)) == 1  # the 5.1.1 itself is told, as always
        item = send(clock, GONE, "bob@mail.example")
        stats = deliver_at(clock, T0 + timedelta(minutes=1))

    assert (stats.failed, stats.delivered) == (1, 1)
    assert len(dsns(senders_server)) == 1
    assert rcpts(recipients_server) == [GONE, "bob@mail.example"]
    assert [(n, k["recipient"]) for n, k in told if k["item_id"] == item.id] == [
        ("failed", GONE),
        ("delivered", "bob@mail.example"),
    ]
    assert DeliveryLog.objects.filter(item_id=item.id, recipient=GONE, status="failed").count() == 1


def test_an_entry_stops_suppressing_when_it_expires(servers, store_settings):
    recipients_server, senders_server = servers
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings)):
        send(clock, GONE)
        deliver_at(clock, T0)
        recipients_server.rcpt_replies = {}  # the mailbox was made since
        clock.now = T0 + timedelta(days=30) - timedelta(seconds=1)
        send(clock, GONE)
        assert deliver_at(clock, clock.now).failed == 1
        assert rcpts(recipients_server) == [GONE]  # still suppressed: not asked
        assert recipients_server.connections == 1  # nor connected to

        clock.now = T0 + timedelta(days=30)
        send(clock, GONE)
        assert deliver_at(clock, clock.now).delivered == 1
        assert QueueService(clock=clock).suppressed([GONE]) == {}
    assert rcpts(recipients_server) == [GONE, GONE]


def suppressed_meanwhile(smtp, write):
    """A transport that runs ``write`` as each session starts, then delivers."""

    class SuppressedMeanwhile:
        def deliver(self, envelope, *, route, hosts):
            write()
            return smtp.deliver(envelope, route=route, hosts=hosts)

        def close_idle(self):
            smtp.close_idle()

        def close(self):
            smtp.close()

    return SuppressedMeanwhile()


def test_a_delivery_takes_its_address_off_the_list(servers, store_settings, caplog):
    # An address suppressed while mail to it was on its way (here by another message's
    # 5.1.1, in the moment the session starts): the server takes it, so the mailbox exists.
    recipients_server, senders_server = servers
    recipients_server.rcpt_replies = {}
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings)):
        queue = QueueService(clock=clock)
        item = send(clock, GONE)
        worker = Worker(clock=clock)
        smtp = worker.transport

        def failed_elsewhere():
            entry = Suppression(
                address=GONE,
                reason=SuppressionReason.FAILED,
                reply=Reply(code=550, status="5.1.1", text=NO_SUCH_USER),
                created_at=clock.now,
                expires_at=clock.now + timedelta(days=30),
            )
            get_store().update_suppressions(SuppressionChange(add=(entry,)), now=clock.now)
            assert queue.suppressed([GONE])

        assert isinstance(smtp, SMTPTransport)
        worker.transport = suppressed_meanwhile(smtp, failed_elsewhere)
        with caplog.at_level(logging.INFO, logger="bumail_queue.worker"):
            stats = worker.run_until_idle()

        assert stats.delivered == 1 and queue.get(item.id) is None
        assert queue.suppressed([GONE]) == {}
        assert queue.count_suppressions() == 0
    assert f"unsuppressed address={GONE} after a delivery" in caplog.text


@pytest.mark.parametrize("reason", [SuppressionReason.BOUNCED, SuppressionReason.MANUAL])
def test_a_delivery_keeps_a_bounce_or_an_operators_entry_written_meanwhile(servers, store_settings, reason):
    # Behind a smarthost, a bounce of this very message can be read back before the
    # recorder writes its delivery: the delivery must not take the bounce off. Nor does
    # it undo an operator who suppressed the address while the session ran.
    recipients_server, senders_server = servers
    recipients_server.rcpt_replies = {}
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings)):
        queue = QueueService(clock=clock)
        item = send(clock, GONE)
        worker = Worker(clock=clock)
        worker.transport = suppressed_meanwhile(
            worker.transport, lambda: queue.suppress(GONE, note="returned", reason=reason)
        )
        stats = worker.run_until_idle()

        assert stats.delivered == 1 and queue.get(item.id) is None
        assert [entry.reason for entry in queue.suppressed([GONE]).values()] == [reason]


MAX_AGE_1_DAY = {"MAX_AGE": timedelta(days=1), "DELAY_WARNING": timedelta(days=2), "RETRY_JITTER": 0}


def test_an_address_whose_delivery_time_expired_twice_within_the_window_is_suppressed(servers, store_settings):
    recipients_server, senders_server = servers
    recipients_server.rcpt_replies = {"busy@mail.example": "451 4.2.1 Mailbox busy, try later"}
    clock = Clock()
    settings = routed(recipients_server, senders_server, store_settings, **MAX_AGE_1_DAY)
    with override_settings(BUMAIL_QUEUE=settings):
        queue = QueueService(clock=clock)
        send(clock, "busy@mail.example")
        assert deliver_at(clock, T0).deferred == 1
        assert deliver_at(clock, T0 + timedelta(days=1)).failed == 1  # 4.4.7: the first expiry
        assert queue.suppressed(["busy@mail.example"]) == {}

        clock.now = T0 + timedelta(days=2)
        send(clock, "busy@mail.example")
        deliver_at(clock, T0 + timedelta(days=2))
        assert deliver_at(clock, T0 + timedelta(days=3)).failed == 1  # the second, within 30 days
        [entry] = queue.suppressed(["busy@mail.example"]).values()
        assert (entry.reason, entry.reply.status) == (SuppressionReason.EXPIRED, "4.4.7")
        assert "451 4.2.1 Mailbox busy" in entry.reply.text
        assert entry.expires_at == T0 + timedelta(days=33)

        asked = len(rcpts(recipients_server))
        clock.now = T0 + timedelta(days=4)
        send(clock, "busy@mail.example")
        assert deliver_at(clock, clock.now).failed == 1
    assert len(rcpts(recipients_server)) == asked  # failed at once: not asked again
    assert [recipient_block(r)["Status"] for r in dsns(senders_server)] == ["4.4.7", "4.4.7", "5.7.1"]


def test_expiries_further_apart_than_the_window_do_not_suppress(servers, store_settings):
    recipients_server, senders_server = servers
    recipients_server.rcpt_replies = {"busy@mail.example": "451 4.2.1 Mailbox busy, try later"}
    clock = Clock()
    settings = routed(
        recipients_server, senders_server, store_settings, SUPPRESSION_EXPIRY_WINDOW=timedelta(days=1), **MAX_AGE_1_DAY
    )
    with override_settings(BUMAIL_QUEUE=settings):
        for day in (0, 2):
            clock.now = T0 + timedelta(days=day)
            send(clock, "busy@mail.example")
            deliver_at(clock, clock.now)
            assert deliver_at(clock, clock.now + timedelta(days=1)).failed == 1
        assert QueueService(clock=clock).suppressed(["busy@mail.example"]) == {}


def test_with_suppression_off_nothing_is_suppressed(servers, store_settings):
    recipients_server, senders_server = servers
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings, SUPPRESSION=False)):
        for minute in (0, 1):
            send(clock, GONE)
            assert deliver_at(clock, T0 + timedelta(minutes=minute)).failed == 1
        assert QueueService(clock=clock).count_suppressions() == 0
    assert rcpts(recipients_server) == [GONE, GONE]


THREE = ("ann@mail.example", "bob@one.example", "cy@two.example")


def test_a_550_5_1_1_to_mail_from_fails_the_recipients_and_suppresses_none(smtp_servers, store_settings):
    # The server says the *sender* is unknown: nothing is known of any recipient.
    refusing = smtp_servers(mail_reply="550 5.1.1 <app@sender.test>: Sender address rejected: User unknown")
    senders_server = smtp_servers()
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(refusing, senders_server, store_settings)):
        send(clock, *THREE)
        assert deliver_at(clock, T0).failed == 3
        assert QueueService(clock=clock).count_suppressions() == 0
    assert len(dsns(senders_server)) == 1  # the sender is told, as of any failure


@pytest.mark.parametrize(("recipients", "suppressed"), [(THREE, 0), (THREE[:1], 1)])
def test_a_550_5_1_1_after_the_data_suppresses_only_the_one_recipient_it_can_be_about(
    smtp_servers, store_settings, recipients, suppressed
):
    # After the data of several recipients, the reply is one for all: it may be about
    # any of them, so it suppresses none; for one recipient, it is about that one.
    refusing = smtp_servers(message_reply="550 5.1.1 <ann@mail.example>: Recipient address rejected")
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(refusing, smtp_servers(), store_settings)):
        send(clock, *recipients)
        assert deliver_at(clock, T0).failed == len(recipients)
        queue = QueueService(clock=clock)
        assert queue.count_suppressions() == suppressed
        assert list(queue.suppressed(list(recipients))) == list(recipients[:suppressed])


def test_a_domain_with_a_null_mx_is_suppressed_and_not_looked_up_again(smtp_servers, dns_server, store_settings):
    server = smtp_servers()
    dns_server.zone = DNSZone({
        "nomail.test": {"MX": [(0, ".")]},
        "sender.test": {"MX": [(10, "mx.sender.test")]},
        "mx.sender.test": {"A": ["127.0.0.1"]},
    })  # fmt: skip
    clock = Clock()
    settings = {"HOSTNAME": "mta.example.com", **dns_server.queue_settings(server.port), **store_settings}
    with override_settings(BUMAIL_QUEUE=settings):
        send(clock, "ann@nomail.test")
        deliver_at(clock, T0)
        [entry] = QueueService(clock=clock).suppressed(["ann@NoMail.test"]).values()
        assert (entry.address, entry.reply.code, entry.reply.status) == ("ann@nomail.test", None, "5.1.10")
        lookups = [q for q in dns_server.queries if q[0] == "nomail.test"]

        send(clock, "ann@nomail.test")
        assert deliver_at(clock, T0 + timedelta(minutes=1)).failed == 1
    assert [q for q in dns_server.queries if q[0] == "nomail.test"] == lookups
    assert [recipient_block(r)["Status"] for r in dsns(server)] == ["5.1.10", "5.7.1"]


def test_an_address_suppressed_after_its_mail_was_queued_fails_at_its_next_attempt(servers, store_settings):
    recipients_server, senders_server = servers
    recipients_server.rcpt_replies = {"later@mail.example": "451 4.3.0 Try later"}
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings)):
        queue = QueueService(clock=clock)
        item = send(clock, "later@mail.example")
        assert deliver_at(clock, T0).deferred == 1
        queue.suppress("later@mail.example", note="asked us to stop")
        stats = deliver_at(clock, T0 + timedelta(hours=1))
        assert stats.failed == 1 and queue.get(item.id) is None
    assert rcpts(recipients_server) == ["later@mail.example"]
    assert "added by an operator (asked us to stop)" in report_text(dsns(senders_server)[0])


def test_the_store_lookup_is_one_per_claim(servers, store_settings):
    recipients_server, senders_server = servers
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings)):
        for n in range(7):
            send(clock, f"r{n}@mail.example", f"s{n}@mail.example")
        send(clock, "n0@mail.example", channel="newsletter")
        store = get_store()
        asked = []
        lookup = store.suppression_entries

        def counted(addresses, *, now, scopes):
            addresses = list(addresses)
            asked.append((len(addresses), scopes))
            return lookup(addresses, now=now, scopes=scopes)

        store.suppression_entries = counted
        try:
            assert deliver_at(clock, T0).delivered == 15
        finally:
            del store.suppression_entries
    # One claim of the eight items, one lookup of their fifteen recipients in the
    # scopes of their channels.
    assert asked == [(15, ["", "channel:default", "channel:newsletter"])]


def test_a_channel_entry_fails_that_channels_mail_and_lets_the_rest_go(servers, store_settings, told):
    recipients_server, senders_server = servers
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=routed(recipients_server, senders_server, store_settings)):
        queue = QueueService(clock=clock)
        queue.suppress("ann@mail.example", scope="channel:newsletter", reason=SuppressionReason.UNSUBSCRIBED)
        news = send(clock, "ann@mail.example", "bob@mail.example", subject="News", channel="newsletter")
        receipt = send(clock, "ann@mail.example", subject="Your receipt")

        stats = deliver_at(clock, T0)

        # Bob's news, Ann's receipt, and the DSN that tells the sender of Ann's news.
        assert (stats.delivered, stats.failed) == (3, 1)
        assert queue.get(news.id) is None and queue.get(receipt.id) is None
        # A delivery in another channel proves the mailbox, not a wish to hear again.
        assert [e.scope for e in queue.suppressions_for("ann@mail.example")] == ["channel:newsletter"]
    assert sorted(rcpts(recipients_server)) == ["ann@mail.example", "bob@mail.example"]
    failed = [kwargs for name, kwargs in told if name == "failed"]
    assert [(f["item_id"], f["recipient"]) for f in failed] == [(news.id, "ann@mail.example")]
    assert "its recipient unsubscribed" in report_text(dsns(senders_server)[0])
