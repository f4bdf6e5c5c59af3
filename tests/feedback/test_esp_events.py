"""ESP events: anymail's own Postmark webhook view, posted to as Postmark would, for mail
the queue sent through a backend route to a loopback Postmark API, on every store."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings

from bumail_queue.feedback import esp_events
from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from bumail_queue.suppression import SuppressionReason
from tests.helpers import signals_told
from tests.servers.esp import route

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def connected():
    """The queue's receiver of anymail's tracking signal, as ``ready()`` connects it
    when ``"anymail"`` is in ``INSTALLED_APPS`` (which the test settings leave out)."""
    from anymail.signals import tracking

    esp_events.connect()
    yield
    tracking.disconnect(dispatch_uid="bumail_queue.feedback.esp_events")


T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
AUTH = "Basic " + base64.b64encode(b"hooks:tests-only-not-a-secret").decode()


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


def sent_through_postmark(postmark, store_settings, *recipients):
    """Queue a message and send it through the Postmark route; its item and message id."""
    service = QueueService(clock=lambda: T0)
    item = service.enqueue(EmailMessage("Hi", "Body", "app@example.com", list(recipients)))
    service.deliver_due(now=T0)
    [message_id] = postmark.message_ids
    return item, message_id


def post(client, event, *, auth=AUTH):
    return client.post(
        "/anymail/postmark/tracking/", data=json.dumps(event), content_type="application/json", HTTP_AUTHORIZATION=auth
    )


def test_a_hard_bounce_event_suppresses_its_recipient_logs_the_bounce_on_its_item_and_is_told(
    client, postmark, store_settings
):
    with override_settings(BUMAIL_QUEUE={"ROUTE": route(postmark), **store_settings}):
        item, message_id = sent_through_postmark(postmark, store_settings, "ann@example.org", "bob@example.org")
        event = {
            "RecordType": "Bounce",
            "Type": "HardBounce",
            "TypeCode": 1,
            "ID": 42,
            "MessageID": message_id,
            "Email": "ann@example.org",
            "Description": "The server was unable to deliver your message (ex: unknown user, mailbox not found).",
            "Details": "smtp;550 5.1.1 The email account that you tried to reach does not exist.",
            "BouncedAt": "2026-03-01T10:00:00Z",
        }
        with signals_told("bounced") as told:
            assert post(client, event).status_code == 200
        found = QueueService().suppressed(["ann@example.org", "bob@example.org"])
    assert set(found) == {"ann@example.org"} and found["ann@example.org"].reason == SuppressionReason.BOUNCED
    assert "550 5.1.1 The email account" in found["ann@example.org"].reply.text
    [(_, kwargs)] = told
    assert (kwargs["item_id"], kwargs["recipient"], kwargs["source"]) == (
        item.id,
        "ann@example.org",
        "anymail:postmark",
    )
    statuses = list(
        DeliveryLog.objects.filter(item_id=item.id, recipient="ann@example.org").values_list("status", flat=True)
    )
    assert sorted(statuses) == ["bounced", "delivered"]


@pytest.mark.parametrize(
    ("event", "reason", "signal"),
    [
        (
            {
                "RecordType": "SpamComplaint",
                "Type": "SpamComplaint",
                "TypeCode": 512,
                "ID": 43,
                "BouncedAt": "2026-03-01T10:00:00Z",
            },
            SuppressionReason.COMPLAINED,
            "complained",
        ),
        (
            {
                "RecordType": "SubscriptionChange",
                "SuppressSending": True,
                "SuppressionReason": "ManualSuppression",
                "ChangedAt": "2026-03-01T10:00:00Z",
                "Recipient": "ann@example.org",
            },
            SuppressionReason.UNSUBSCRIBED,
            "unsubscribed",
        ),
    ],
)
def test_a_complaint_or_an_unsubscribe_event_suppresses_its_recipient(
    client, postmark, store_settings, event, reason, signal
):
    with override_settings(BUMAIL_QUEUE={"ROUTE": route(postmark), **store_settings}):
        item, message_id = sent_through_postmark(postmark, store_settings, "ann@example.org")
        with signals_told(signal) as told:
            assert post(client, {"Email": "ann@example.org", "MessageID": message_id, **event}).status_code == 200
        found = QueueService().suppressed(["ann@example.org"])
    assert found["ann@example.org"].reason == reason
    assert [(name, kwargs["item_id"]) for name, kwargs in told] == [(signal, item.id)]


def test_events_that_ask_nothing_and_forged_posts_change_nothing(client, postmark, store_settings):
    with override_settings(BUMAIL_QUEUE={"ROUTE": route(postmark), **store_settings}):
        _, message_id = sent_through_postmark(postmark, store_settings, "ann@example.org")
        delivered = {
            "RecordType": "Delivery",
            "MessageID": message_id,
            "Recipient": "ann@example.org",
            "DeliveredAt": "2026-03-01T10:00:00Z",
        }
        soft = {
            "RecordType": "Bounce",
            "Type": "Transient",
            "MessageID": message_id,
            "Email": "ann@example.org",
            "BouncedAt": "2026-03-01T10:00:00Z",
        }
        hard = {
            "RecordType": "Bounce",
            "Type": "HardBounce",
            "MessageID": message_id,
            "Email": "ann@example.org",
            "BouncedAt": "2026-03-01T10:00:00Z",
        }
        assert post(client, delivered).status_code == 200
        assert post(client, soft).status_code == 200
        assert post(client, hard, auth="Basic " + base64.b64encode(b"hooks:wrong").decode()).status_code == 400
        assert QueueService().suppressed(["ann@example.org"]) == {}


def test_the_app_connects_the_receiver_only_when_anymail_is_installed(monkeypatch):
    from anymail.signals import tracking
    from django.apps import apps

    config = apps.get_app_config("bumail_queue")
    tracking.disconnect(dispatch_uid="bumail_queue.feedback.esp_events")
    monkeypatch.setattr(apps, "is_installed", lambda name: name == "anymail")
    config.ready()
    assert tracking.has_listeners()
    tracking.disconnect(dispatch_uid="bumail_queue.feedback.esp_events")
    monkeypatch.setattr(apps, "is_installed", lambda name: False)
    config.ready()
    assert not tracking.has_listeners()
