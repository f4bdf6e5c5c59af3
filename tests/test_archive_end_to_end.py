"""Resending from the archive, end to end: a ``queue_worker`` process delivers to a
real SMTP server on loopback, archives what it delivered, and delivers the resend
``queue_resend`` queued: the same octets, but for a new Message-ID."""

from __future__ import annotations

from email import message_from_bytes
from io import StringIO

import pytest
from django.core.mail import EmailMultiAlternatives
from django.core.management import call_command
from django.test import override_settings

from bumail_queue import queue
from bumail_queue.models import ArchivedMessage, DeliveryLog
from tests.helpers import running_worker, smarthost, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_keys(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


def test_a_resend_from_the_archive_delivers_the_same_octets_with_a_new_message_id(smtp_server, store_keys):
    settings = smarthost(smtp_server, POLL_SECONDS=0.2, ARCHIVE={"default": "7d"}, **store_keys)
    mail = EmailMultiAlternatives(
        "Your invoice № 7", "Please find it below.", "billing@example.com", ["ann@example.org"]
    )
    mail.attach_alternative("<p>Please find it <b>below</b>.</p>", "text/html")
    mail.attach("invoice.txt", "Total: 42 EUR\n", "text/plain")
    with override_settings(BUMAIL_QUEUE=settings), running_worker(settings) as (worker, lines):
        item = queue.enqueue(mail, channel="billing", priority=10)
        assert wait_until(lambda: ArchivedMessage.objects.filter(item_id=item.id).exists()), "".join(lines)
        out = StringIO()
        call_command("queue_resend", item.id, "--by", "ops", stdout=out)
        new_id = out.getvalue().split(" as item ")[1].split(",")[0]
        assert wait_until(lambda: ArchivedMessage.objects.filter(item_id=new_id).exists()), "".join(lines)
    assert worker.returncode == 0, "".join(lines)
    first, second = smtp_server.messages
    assert first.rcpt_tos == second.rcpt_tos == ["ann@example.org"]
    assert first.mail_from == second.mail_from == "billing@example.com"
    old_message_id = message_from_bytes(first.data)["Message-ID"]
    new_message_id = message_from_bytes(second.data)["Message-ID"]
    assert old_message_id != new_message_id
    assert second.data == first.data.replace(old_message_id.encode(), new_message_id.encode())
    original, copy = ArchivedMessage.objects.get(item_id=item.id), ArchivedMessage.objects.get(item_id=new_id)
    assert (copy.resent_from, copy.channel, copy.priority) == (original.item_id, "billing", 10)
    assert (original.message_id, copy.message_id) == (old_message_id, new_message_id)
    assert DeliveryLog.objects.get(item_id=new_id).message_id == new_message_id
