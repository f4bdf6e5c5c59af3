"""A route's ``FALLBACK``: mail goes to it only when the first route was not reached at
all (a refused connection, a failed DNS lookup, an API that failed with 5xx), never
after any server or API may have taken the message. Real servers on loopback: an SMTP
smarthost that refuses or drops, anymail's Postmark backend against a loopback API,
anymail's test backend as the fallback."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.core.mail import EmailMessage
from django.test import override_settings

from bumail_queue.conf import validate
from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from tests.servers.esp import Answer, route
from tests.servers.hostile_smtp import hostile_smtp  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
FALLBACK = {"TYPE": "backend", "BACKEND": "anymail.backends.test.EmailBackend", "NAME": "test-esp"}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def smarthost(port: int, **extra) -> dict:
    return {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": port, "TLS": "none", **extra}


def send(settings, count=3, *, now=T0):
    mail.outbox = []
    with override_settings(BUMAIL_QUEUE=settings):
        queue = QueueService(clock=lambda: now)
        items = [
            queue.enqueue(EmailMessage(f"Note {n}", "Hi.", "app@example.com", [f"r{n}@example.org"]))
            for n in range(count)
        ]
        stats = queue.deliver_due(now=now)
    return items, stats


def fallback_rcpts():
    return sorted(a.addr_spec for m in mail.outbox for a in m.anymail_test_params["to"])


def test_a_smarthost_that_refuses_connections_sends_everything_by_the_fallback_once():
    items, stats = send({"ROUTE": smarthost(closed_port(), FALLBACK=FALLBACK)})
    assert stats.delivered == 3
    assert fallback_rcpts() == ["r0@example.org", "r1@example.org", "r2@example.org"]
    hosts = set(DeliveryLog.objects.filter(item_id__in=[i.id for i in items]).values_list("remote_host", "status"))
    assert hosts == {("test-esp", "delivered")}  # which route carried it


def test_a_smarthost_that_took_the_message_and_dropped_before_its_reply_is_never_failed_over(hostile_smtp):  # noqa: F811
    def script(peer):
        peer.send(b"220 relay.test ESMTP\r\n")
        if peer.number == 1:
            assert peer.serve_until("DATA_END") == "DATA_END"  # the message went; no reply comes
            return
        peer.serve_until("QUIT")

    server = hostile_smtp(script)
    settings = {"ROUTE": smarthost(server.port, FALLBACK=FALLBACK), "RETRY_JITTER": 0}
    _, stats = send(settings, count=1)
    assert (stats.deferred, mail.outbox) == (1, [])  # the server may have it: not sent again elsewhere
    with override_settings(BUMAIL_QUEUE=settings):
        queue = QueueService(clock=lambda: T0 + timedelta(hours=1))
        assert queue.deliver_due(now=T0 + timedelta(hours=1)).delivered == 1  # the retry, by the same route
    assert mail.outbox == []
    assert [p.commands.count(".") for p in server.peers] == [1, 1]


@pytest.mark.parametrize(
    ("answer", "failed_over"),
    [
        (Answer.status(500), True),  # the API failed: it took nothing
        (Answer.status(503), True),
        (Answer.status(429, retry_after="60"), False),  # "later": the ESP asks to be waited for
        (Answer.hang(), False),  # the request went and no answer came: it may have been taken
    ],
)
def test_an_esp_fails_over_only_when_it_took_nothing(postmark, answer, failed_over):
    postmark.answer = answer
    settings = {"ROUTE": {**route(postmark), "FALLBACK": "test-esp"}, "CHANNEL_ROUTES": {"spare": FALLBACK}}
    _, stats = send(settings, count=1)
    assert len(postmark.requests) == 1
    assert (stats.delivered, len(mail.outbox)) == ((1, 1) if failed_over else (0, 0))


def test_an_esp_that_cannot_be_connected_to_fails_over():
    closed = {
        "TYPE": "backend",
        "BACKEND": "anymail.backends.postmark.EmailBackend",
        "NAME": "postmark",
        "OPTIONS": {"server_token": "t", "api_url": f"http://127.0.0.1:{closed_port()}/", "requests_timeout": 1},
        "FALLBACK": FALLBACK,
    }
    _, stats = send({"ROUTE": closed}, count=2)
    assert (stats.delivered, fallback_rcpts()) == (2, ["r0@example.org", "r1@example.org"])


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"ROUTE": smarthost(25, FALLBACK="nowhere")}, "['FALLBACK'] names 'nowhere', and no other"),
        ({"ROUTE": smarthost(25, FALLBACK={"TYPE": "mx"})}, "must be a smarthost or backend route"),
        ({"ROUTE": smarthost(25, FALLBACK={**FALLBACK, "FALLBACK": FALLBACK})}, "of no fallback of its own"),
        ({"ROUTE": {"TYPE": "mx", "FALLBACK": FALLBACK}}, "keys a 'mx' route does not take: FALLBACK"),
    ],
)
def test_a_fallback_set_up_wrongly_is_e007(raw, words):
    problems = validate(raw)
    assert [p.id for p in problems] == ["bumail_queue.E007"]
    assert words in problems[0].message
