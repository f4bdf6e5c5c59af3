"""A backend route through django-ses's real backend, its SES client answered by
botocore's Stubber (no AWS traffic): what SES's answers and errors mean."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings

from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from tests import ses_stub

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SES = {
    "TYPE": "backend",
    "BACKEND": "tests.ses_stub.StubbedSESBackend",
    "NAME": "ses",
    "OPTIONS": {"aws_access_key": "AKIAEXAMPLE", "aws_secret_key": "ses-s3cret-key", "aws_region_name": "eu-west-1"},
}


@pytest.mark.parametrize(
    ("answer", "status", "enhanced", "words"),
    [
        ("0100018d-ses-id", "delivered", "2.0.0", "Sent by ses"),
        (("Throttling", 400), "deferred", "4.4.1", "SES answered Throttling"),
        (("ServiceUnavailable", 503), "deferred", "4.4.1", "SES answered ServiceUnavailable"),
        (("MessageRejected", 400), "failed", "5.0.0", "SES refused the message (MessageRejected)"),
    ],
)
def test_what_ses_answers_decides_each_recipient(monkeypatch, answer, status, enhanced, words):
    monkeypatch.setattr(ses_stub, "ANSWERS", [answer])
    with override_settings(BUMAIL_QUEUE={"ROUTE": SES}):
        queue = QueueService(clock=lambda: T0)
        item = queue.enqueue(EmailMessage("Hi", "Body.", "app@example.com", ["ann@example.org", "bob@example.org"]))
        queue.deliver_due(now=T0)
    entries = DeliveryLog.objects.filter(item_id=item.id, sender="app@example.com")
    assert {(e.status, e.reply_status, e.remote_host) for e in entries} == {(status, enhanced, "ses")}
    assert all(words in e.reply_text and "s3cret" not in e.reply_text for e in entries)
    if status == "delivered":
        assert {e.provider_message_id for e in entries} == {"0100018d-ses-id"}
