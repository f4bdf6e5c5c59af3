"""The queue service, ``from bumail_queue import queue``, as an application uses it."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.items import RecipientStatus
from bumail_queue.models import Item, Message
from bumail_queue.stores import get_store
from tests.factories import EmailMessageFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_an_email_message():
    message = EmailMessage(
        "Invoice", "Please find it attached.", "Billing <billing@example.com>",
        to=["Ann <ann@example.org>"], cc=["bob@example.net"], bcc=["audit@example.com"],
    )  # fmt: skip
    item = queue.enqueue(message)
    assert item.sender == "billing@example.com"
    assert [r.address for r in item.recipients] == ["ann@example.org", "bob@example.net", "audit@example.com"]
    assert all(r.status == RecipientStatus.PENDING for r in item.recipients)
    data = get_store().read_message(item.id)
    assert b"Subject: Invoice" in data
    assert b"audit@example.com" not in data  # the Bcc travels in the envelope only
    assert b"\r\nMessage-ID: " in data
    assert b"\r\nDate: " in data
    assert item.size == len(data)
    assert queue.get(item.id) == item
    assert Item.objects.filter(id=item.id).exists()
    assert bytes(Message.objects.get(item_id=item.id).data) == data


def test_enqueue_raw_bytes_with_an_explicit_envelope():
    raw = b"From: a@example.com\r\nSubject: raw\r\n\r\n\xe9t\xe9 8bit body\r\n"
    item = queue.enqueue(raw, sender="", recipients=["x@example.org"])
    assert item.sender == ""  # the null sender <>
    data = get_store().read_message(item.id)
    assert data.endswith(b"\r\n\r\n\xe9t\xe9 8bit body\r\n")
    assert data.startswith(b"From: a@example.com\r\nSubject: raw\r\n")


def test_an_utf8_address_is_accepted():
    item = queue.enqueue(b"Subject: hi\r\n\r\nx\r\n", sender="jörg@bücher.example", recipients=["élodie@example.org"])
    assert item.sender == "jörg@bücher.example"
    assert item.recipients[0].address == "élodie@example.org"


def test_send_later_with_at():
    at = timezone.now() + timedelta(hours=2)
    item = queue.enqueue(EmailMessageFactory(), at=at)
    assert item.next_attempt_at == at
    now = timezone.now()
    assert get_store().claim(owner="w", now=now, lease_until=now + timedelta(minutes=1)) == []


def test_at_must_be_aware():
    with pytest.raises(Exception) as error:
        queue.enqueue(EmailMessageFactory(), at=datetime(2030, 1, 1))
    assert error.value.code == "INVALID"
    assert queue.count() == 0


def test_an_idempotency_key_returns_the_queued_item():
    first = queue.enqueue(EmailMessageFactory(), key="signup-7")
    second = queue.enqueue(EmailMessageFactory(), key="signup-7")
    assert second.id == first.id
    assert queue.count() == 1


def test_list_count_retry_now_and_cancel():
    soon = queue.enqueue(EmailMessageFactory())
    later = queue.enqueue(EmailMessageFactory(), at=timezone.now() + timedelta(days=1))
    assert [i.id for i in queue.list()] == [soon.id, later.id]
    assert queue.count() == 2
    assert queue.retry_now(later.id) is True
    assert queue.get(later.id).next_attempt_at <= timezone.now()
    cancelled = queue.cancel(soon.id)
    assert cancelled.id == soon.id
    assert queue.get(soon.id) is None
    assert queue.count() == 1
    assert queue.retry_now(soon.id) is False
    assert queue.cancel(soon.id) is None


BAD_INPUT = {
    "a recipient without @": (lambda: EmailMessage("s", "b", "a@example.com", ["nobody"]), "INVALID"),
    "a recipient with a NUL": (lambda: EmailMessage("s", "b", "a@example.com", ["x\x00y@example.org"]), "INVALID"),
    "a recipient with a lone surrogate": (
        lambda: EmailMessage("s", "b", "a@example.com", ["x\ud800@example.org"]),
        "INVALID",
    ),
    "a bad sender": (lambda: EmailMessage("s", "b", "not an address", ["x@example.org"]), "INVALID"),
    "no recipient at all": (lambda: EmailMessage("s", "b", "a@example.com", []), "INVALID"),
    "a subject with CR/LF": (
        lambda: EmailMessage("s\r\nBcc: victim@example.org", "b", "a@example.com", ["x@example.org"]),
        "INVALID",
    ),
    "an extra header with LF": (
        lambda: EmailMessage("s", "b", "a@example.com", ["x@example.org"], headers={"X-Note": "a\nb"}),
        "INVALID",
    ),
    "a body with a lone surrogate": (
        lambda: EmailMessage("s", "b\ud800", "a@example.com", ["x@example.org"]),
        "INVALID",
    ),
    "raw bytes with a NUL in a header": (lambda: b"Subject: a\x00b\r\nTo: x@example.org\r\n\r\nbody", "INVALID"),
    "raw bytes with a bare CR in a header": (lambda: b"Subject: a\rb\r\nTo: x@example.org\r\n\r\nbody", "INVALID"),
    "a message over MAX_MESSAGE_SIZE": (
        lambda: EmailMessage("s", "x" * 2000, "a@example.com", ["x@example.org"]),
        "TOO_LARGE",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUT)
@override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "MAX_MESSAGE_SIZE": 1000})
def test_bad_input_gets_a_queue_error_and_writes_nothing(case):
    build, code = BAD_INPUT[case]
    with pytest.raises(Exception) as error:
        queue.enqueue(build())
    assert type(error.value).__name__ == "QueueError"
    assert error.value.code == code
    assert str(error.value)  # a sentence, not an empty message
    assert Item.objects.count() == 0
    assert Message.objects.count() == 0


@override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "MAX_ITEMS": 2})
def test_a_full_queue_refuses_with_full():
    queue.enqueue(EmailMessageFactory())
    queue.enqueue(EmailMessageFactory())
    with pytest.raises(Exception) as error:
        queue.enqueue(EmailMessageFactory())
    assert error.value.code == "FULL"
    assert "MAX_ITEMS" in str(error.value)
    assert queue.count() == 2


def test_enqueue_many_is_all_or_nothing():
    good = EmailMessageFactory()
    bad = EmailMessage("s", "b", "a@example.com", ["broken"])
    with pytest.raises(Exception) as error:
        queue.enqueue_many([good, bad])
    assert error.value.code == "INVALID"
    assert queue.count() == 0
    assert len(queue.enqueue_many([EmailMessageFactory() for _ in range(3)])) == 3
    assert queue.count() == 3


@override_settings(BUMAIL_QUEUE={"STORE": "memory", "HOSTNAME": "mta.example.com"})
def test_the_memory_store_serves_the_same_service():
    item = queue.enqueue(EmailMessageFactory())
    assert queue.get(item.id) == item
    assert Item.objects.count() == 0
