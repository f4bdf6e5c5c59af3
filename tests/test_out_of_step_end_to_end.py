"""A worker against an MX that replies out of step once, on a connection that carries
eight messages one after the other (``DOMAIN_CONCURRENCY`` 1, pipelining across
messages): every recipient's recorded outcome is the one the server meant for it or a
deferral, nobody is suppressed or told of a failure on a reply meant for another, and
after the retry every message reached the server once."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from bumail_queue.conf import get_settings
from bumail_queue.delivery.smtp import SMTPTransport
from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from tests.servers.hostile_smtp import hostile_smtp  # noqa: F401 - the fixture
from tests.servers.out_of_step import STRATEGIES, OutOfStepMX

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SENDER = "app@sender.test"
RECIPIENTS = [f"r{n}@pipe.test" for n in range(1, 9)]
VICTIM = "r3@pipe.test"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": "orm"}


def smarthost(server) -> dict[str, object]:
    return {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": server.port, "TLS": "none"}


def deliver_at(clock: Clock, now: datetime, transport: SMTPTransport):
    """One pass of a worker whose transport lives on, as ``queue_worker``'s does."""
    clock.now = now
    return QueueService(clock=clock).deliver_due(now=now, transport=transport)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_reply_out_of_step_decides_nothing_for_another_message(strategy, hostile_smtp, smtp_servers, store_settings):  # noqa: F811
    script = OutOfStepMX(strategy, victim=VICTIM)
    recipients_server, senders_server = hostile_smtp(script), smtp_servers()
    settings = {
        "HOSTNAME": "mta.example.com",
        "ROUTE": smarthost(recipients_server),
        "ROUTES": {"sender.test": smarthost(senders_server)},  # where the DSNs go
        "DOMAIN_CONCURRENCY": 1,
        **store_settings,
    }
    clock = Clock()
    with override_settings(BUMAIL_QUEUE=settings):
        queue = QueueService(clock=clock)
        for n, recipient in enumerate(RECIPIENTS, 1):
            message = f"From: {SENDER}\r\nTo: {recipient}\r\nSubject: Letter {n}\r\n\r\nHi.\r\n".encode()
            queue.enqueue(message, sender=SENDER, recipients=[recipient])
        transport = SMTPTransport(hostname="mta.example.com", timeouts=get_settings().timeouts, reuse_seconds=60)
        try:
            deliver_at(clock, T0, transport)
            deliver_at(clock, T0 + timedelta(hours=2), transport)  # every deferral is due again
        finally:
            transport.close()
        assert queue.count() == 0
        suppressed = list(queue.suppressed(RECIPIENTS))

    log: dict[str, list[DeliveryLog]] = {r: [] for r in RECIPIENTS}
    for entry in DeliveryLog.objects.filter(sender=SENDER).order_by("logged_at", "id"):
        log[entry.recipient].append(entry)
    refused_victim = strategy == "550_then_250"
    for recipient, entries in log.items():
        *earlier, final = entries
        assert all(e.status == "deferred" and "replied out of step" in e.reply_text for e in earlier), recipient
        assert final.status == script.meant[recipient], recipient
        assert recipient in final.reply_text  # the reply it took named it
        expected = "failed" if refused_victim and recipient == VICTIM else "delivered"
        assert final.status == expected
    deferrals = sum(len(entries) - 1 for entries in log.values())
    assert deferrals == (0 if strategy == "honest" else 1)

    assert suppressed == ([VICTIM] if refused_victim else [])
    dsns = [m for m in senders_server.messages if m.mail_from == ""]
    assert [m.rcpt_tos for m in dsns] == ([[SENDER]] if refused_victim else [])
    if refused_victim:
        assert VICTIM.encode() in dsns[0].data
    # Every message reached the server once: no data went on a reply in doubt, and no
    # message was sent again after a reply the server meant for it.
    assert Counter(script.received) == Counter((r,) for r in RECIPIENTS)
