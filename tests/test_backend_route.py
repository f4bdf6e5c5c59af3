"""A ``backend`` route: the worker hands each item to a Django email backend, here
django-anymail's, installed for real: its ``test`` backend, and its Postmark backend
pointed at a loopback server that answers as Postmark's API documents (accepted, one
recipient inactive, every recipient inactive, 422, 429 with ``Retry-After``, 500, a
hang). Each recipient's outcome, the ESP's message id in the delivery log and the
signals, and what the message the ESP was given holds."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.core.mail import EmailMultiAlternatives
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from bumail_queue.errors import QueueConfigurationError
from bumail_queue.items import RecipientStatus
from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from tests.helpers import signals_told
from tests.servers.esp import Answer, route

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
DELIVERED, DEFERRED, FAILED = RecipientStatus.DELIVERED, RecipientStatus.DEFERRED, RecipientStatus.FAILED
TEST_BACKEND = {"TYPE": "backend", "BACKEND": "anymail.backends.test.EmailBackend", "NAME": "test-esp"}


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    return request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}


@pytest.fixture
def told():
    """The outcome signals, as (name, kwargs)."""
    with signals_told("delivered", "deferred", "failed") as events:
        yield events


def newsletter(*to, cc=(), bcc=()):
    message = EmailMultiAlternatives(
        "Spring news", "The text.", "News <news@example.com>", list(to), cc=list(cc), bcc=list(bcc),
        headers={"List-Unsubscribe": "<https://example.com/u/1>", "X-Campaign": "spring"},
    )  # fmt: skip
    message.attach_alternative("<p>The <b>HTML</b>.</p>", "text/html")
    message.attach("prices.csv", "item,price\nbook,12\n", "text/csv")
    return message


def queue_at(clock_now=T0):
    return QueueService(clock=lambda: clock_now)


def test_the_test_backend_gets_the_message_as_it_was_sent_and_each_recipient_its_id(store_settings, told):
    mail.outbox = []
    with override_settings(BUMAIL_QUEUE={"ROUTE": TEST_BACKEND, **store_settings}):
        queue = queue_at()
        item = queue.enqueue(newsletter("Ann <ann@example.org>", cc=["bob@example.net"], bcc=["cy@example.com"]))
        stats = queue.deliver_due(now=T0)

    assert (stats.items, stats.delivered) == (1, 3)
    [sent] = mail.outbox
    params = sent.anymail_test_params
    # Django 6 ends a text part with a line break; 5.2 does not.
    assert (params["subject"], params["text_body"].rstrip("\n"), params["html_body"].rstrip("\n")) == (
        "Spring news",
        "The text.",
        "<p>The <b>HTML</b>.</p>",
    )
    assert [str(a) for a in params["to"]] == ["Ann <ann@example.org>"]
    assert [a.addr_spec for a in params["cc"]] == ["bob@example.net"]
    assert [a.addr_spec for a in params["bcc"]] == ["cy@example.com"]  # in no header, as Bcc should be
    assert str(params["from"]) == "News <news@example.com>"
    assert "envelope_sender" not in params  # the From address: nothing to ask of the ESP
    headers = params["extra_headers"]
    assert headers["List-Unsubscribe"] == "<https://example.com/u/1>" and headers["X-Campaign"] == "spring"
    assert headers["Message-ID"].startswith("<") and "Date" in headers  # the queued message's own
    [attachment] = params["attachments"]
    assert (attachment.name, attachment.mimetype, attachment.content) == (
        "prices.csv",
        "text/csv",
        "item,price\nbook,12\n",
    )
    # The ESP's id of the message (the test backend's: its place in the outbox) is kept.
    log = {e.recipient: e for e in DeliveryLog.objects.filter(item_id=item.id)}
    assert {r: (e.status, e.provider_message_id, e.remote_host) for r, e in log.items()} == dict.fromkeys(
        ("ann@example.org", "bob@example.net", "cy@example.com"), ("delivered", "0", "test-esp")
    )
    assert {kwargs["provider_message_id"] for name, kwargs in told if name == "delivered"} == {"0"}


def test_a_return_path_other_than_from_is_the_envelope_sender():
    mail.outbox = []
    with override_settings(BUMAIL_QUEUE={"ROUTE": TEST_BACKEND}):
        queue = queue_at()
        raw = b"From: News <news@example.com>\r\nTo: ann@example.org\r\nSubject: Hi\r\n\r\nHi.\r\n"
        queue.enqueue(raw, sender="bounces@example.com", recipients=["ann@example.org"])
        queue.deliver_due(now=T0)
    [sent] = mail.outbox
    assert sent.anymail_test_params["envelope_sender"] == "bounces@example.com"


def test_postmark_accepts_and_every_recipient_is_delivered_with_its_message_id(postmark, told):
    with override_settings(BUMAIL_QUEUE={"ROUTE": route(postmark)}):
        queue = queue_at()
        item = queue.enqueue(newsletter("ann@example.org", "bob@example.org"))
        stats = queue.deliver_due(now=T0)

    assert stats.delivered == 2
    [request] = postmark.requests
    assert (request["Subject"], request["TextBody"].rstrip("\n"), request["HtmlBody"].rstrip("\n")) == (
        "Spring news",
        "The text.",
        "<p>The <b>HTML</b>.</p>",
    )
    assert request["To"] == "ann@example.org, bob@example.org"
    assert {h["Name"]: h["Value"] for h in request["Headers"]}["X-Campaign"] == "spring"
    [attachment] = request["Attachments"]
    assert base64.b64decode(attachment["Content"]) == b"item,price\nbook,12\n"
    assert postmark.tokens == ["pm-test-s3cret-token"]
    [message_id] = postmark.message_ids
    assert set(DeliveryLog.objects.filter(item_id=item.id).values_list("provider_message_id", flat=True)) == {
        message_id
    }
    assert {kwargs["provider_message_id"] for _, kwargs in told} == {message_id}


def test_an_inactive_recipient_fails_with_the_esps_reason_and_the_others_are_delivered(postmark):
    postmark.answer = Answer.inactive("gone@example.org")
    with override_settings(BUMAIL_QUEUE={"ROUTE": route(postmark)}):
        queue = queue_at()
        item = queue.enqueue(newsletter("ann@example.org", "gone@example.org"))
        queue.deliver_due(now=T0)
        suppressed = list(queue.suppressed(["ann@example.org", "gone@example.org"]))

    log = {e.recipient: e for e in DeliveryLog.objects.filter(item_id=item.id)}
    assert (log["ann@example.org"].status, log["gone@example.org"].status) == ("delivered", "failed")
    assert log["gone@example.org"].reply_status == "5.7.1"
    assert "Refused by postmark: rejected" in log["gone@example.org"].reply_text
    assert "will not deliver to these inactive addresses: gone@example.org" in log["gone@example.org"].reply_text
    assert suppressed == []  # a policy refusal (5.7.1) is no unknown mailbox


def test_every_recipient_inactive_fails_each_of_them_and_sends_nothing(postmark):
    postmark.answer = Answer.inactive("gone@example.org", "left@example.org")
    with override_settings(BUMAIL_QUEUE={"ROUTE": route(postmark)}):
        queue = queue_at()
        item = queue.enqueue(newsletter("gone@example.org", "left@example.org"))
        stats = queue.deliver_due(now=T0)
    assert stats.failed == 2
    replies = {e.recipient: e.reply_text for e in DeliveryLog.objects.filter(item_id=item.id)}
    assert all("Refused by postmark: rejected" in text and "marked as inactive" in text for text in replies.values())
    assert queue_at().get(item.id) is None
    # The sender is told, through the same route: the DSN is the only message accepted.
    assert [r["To"] for r in postmark.requests] == ["gone@example.org, left@example.org", "news@example.com"]


@pytest.mark.parametrize(
    ("answer", "status", "enhanced", "words"),
    [
        (Answer.invalid_request(), FAILED, "5.0.0", "The ESP refused the message, HTTP 422"),
        (Answer.status(500), DEFERRED, "4.3.2", "The ESP answered HTTP 500"),
        (Answer.status(429, retry_after="7200"), DEFERRED, "4.7.0", "The ESP answered HTTP 429"),
        (Answer.hang(), DEFERRED, "4.4.1", "The ESP was not reached"),
    ],
)
def test_the_esps_errors_fail_or_defer_as_the_table_says(postmark, answer, status, enhanced, words):
    postmark.answer = answer
    with override_settings(BUMAIL_QUEUE={"ROUTE": route(postmark)}):
        queue = queue_at()
        item = queue.enqueue(newsletter("ann@example.org"))
        queue.deliver_due(now=T0)
        left = queue.get(item.id)
    [entry] = DeliveryLog.objects.filter(item_id=item.id)
    assert (entry.status, entry.reply_status) == (status.value, enhanced)
    assert words in entry.reply_text
    assert "pm-test-s3cret-token" not in entry.reply_text
    if status is DEFERRED:
        assert left is not None and left.recipients[0].status is DEFERRED


def test_retry_after_is_a_floor_for_the_next_attempt(postmark):
    postmark.answer = Answer.status(429, retry_after="7200")
    with override_settings(BUMAIL_QUEUE={"ROUTE": route(postmark), "RETRY_MIN_DELAY": 60, "RETRY_JITTER": 0}):
        queue = queue_at()
        item = queue.enqueue(newsletter("ann@example.org"))
        queue.deliver_due(now=T0)
        assert queue.get(item.id).next_attempt_at == T0 + timedelta(hours=2)
        postmark.answer = Answer.status(429, retry_after="5")  # shorter than the schedule: the schedule wins
        queue.deliver_due(now=T0 + timedelta(hours=2))
        assert queue.get(item.id).next_attempt_at > T0 + timedelta(hours=2, seconds=60)


def test_a_backend_that_cannot_be_imported_stops_the_pass_with_one_line_and_decides_nothing():
    broken = {"TYPE": "backend", "BACKEND": "no_such_esp.backends.EmailBackend", "OPTIONS": {"api_key": "k-s3cret-123"}}
    with override_settings(BUMAIL_QUEUE={"ROUTE": broken}):
        queue = queue_at()
        item = queue.enqueue(newsletter("ann@example.org"))
        with pytest.raises(QueueConfigurationError) as caught:
            queue.deliver_due(now=T0)
        assert "The backend route 'no_such_esp.backends.EmailBackend' cannot be used" in caught.value.message
        assert "No module named 'no_such_esp'" in caught.value.message
        assert "k-s3cret-123" not in caught.value.message
        held = queue.get(item.id)
    assert held.attempts == 0 and held.recipients[0].status is RecipientStatus.PENDING
    assert not DeliveryLog.objects.filter(item_id=item.id).exists()


def test_queue_worker_exits_with_the_line_when_a_backend_cannot_be_imported():
    broken = {"TYPE": "backend", "BACKEND": "no_such_esp.backends.EmailBackend"}
    with override_settings(BUMAIL_QUEUE={"ROUTE": broken}):
        queue_at().enqueue(newsletter("ann@example.org"))
        with pytest.raises(CommandError) as caught:
            call_command("queue_worker", "--burst")
    assert str(caught.value).startswith("The backend route 'no_such_esp.backends.EmailBackend' cannot be used")


def test_a_channel_route_sends_its_channels_mail_but_the_domains_routes_name(postmark):
    mail.outbox = []
    settings = {
        "ROUTE": TEST_BACKEND,
        "CHANNEL_ROUTES": {"newsletter": route(postmark)},
        "ROUTES": {"internal.example": TEST_BACKEND},
    }
    with override_settings(BUMAIL_QUEUE=settings):
        queue = queue_at()
        queue.enqueue(newsletter("ann@example.org", "ops@internal.example"), channel="newsletter")
        queue.enqueue(newsletter("bob@example.org"))
        queue.deliver_due(now=T0)
    assert [r["To"] for r in postmark.requests] == ["ann@example.org"]
    assert sorted(a.addr_spec for m in mail.outbox for a in m.anymail_test_params["to"]) == [
        "bob@example.org",
        "ops@internal.example",
    ]


def test_djangos_smtp_backend_gets_the_queued_bytes_unchanged(smtp_server):
    smtp = {
        "TYPE": "backend",
        "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "NAME": "relay",
        "OPTIONS": {"host": "127.0.0.1", "port": smtp_server.port},
    }
    with override_settings(BUMAIL_QUEUE={"ROUTE": smtp}):
        queue = queue_at()
        item = queue.enqueue(newsletter("ann@example.org", bcc=["cy@example.com"]))
        queued = queue.read_message(item.id)
        stats = queue.deliver_due(now=T0)
    assert stats.delivered == 2
    [received] = smtp_server.messages
    assert sorted(received.rcpt_tos) == ["ann@example.org", "cy@example.com"]
    assert received.data.replace(b"\r\n", b"\n") == queued.replace(b"\r\n", b"\n")
    assert b"Bcc" not in received.data
