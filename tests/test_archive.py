"""The archive (``ARCHIVE``, ``REDACT_AFTER``): what the worker archives, on every store,
delivering to a real SMTP server on loopback; the retention with an injected clock;
the resend, through the service and ``queue_resend``; the delivery log's subject and
Message-ID."""

from __future__ import annotations

from datetime import timedelta
from email import message_from_bytes
from io import StringIO

import pytest
from django.core.mail import EmailMessage
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from bumail_queue import archive, mime, queue
from bumail_queue.archive import head_fields
from bumail_queue.conf import load, validate
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.models import ArchivedMessage, DeliveryLog, ResentMessage
from tests.helpers import smarthost

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["memory", "orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_keys(request):
    """The ``BUMAIL_QUEUE`` keys of each store; the archive is in the database for all."""
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


def archived(item_id):
    return ArchivedMessage.objects.filter(item_id=item_id).first()


def message(subject="Your receipt", to=("ann@example.org",), sender="shop@example.com"):
    return EmailMessage(subject, "Thank you for your order.", sender, list(to))


# -- the settings ---------------------------------------------------------------------


def test_archive_durations_and_the_default_channel_standing_for_the_others():
    settings = load({"ARCHIVE": {"default": "7d", "newsletter": "0d", "receipts": "1d12h"}, "REDACT_AFTER": "90d"})
    assert settings.archive_for("default") == timedelta(days=7)
    assert settings.archive_for("alerts") == timedelta(days=7)  # not named: "default"'s
    assert settings.archive_for("newsletter") is None
    assert settings.archive_for("receipts") == timedelta(days=1, hours=12)
    assert settings.redact_after == timedelta(days=90)
    assert load({"ARCHIVE": {"receipts": timedelta(hours=2)}}).archive_for("alerts") is None
    assert load({}).archive == {}  # off unless asked


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"ARCHIVE": ["7d"]}, "must be a dict of channel to duration"),
        ({"ARCHIVE": {"default": "7 days"}}, "must be a duration such as '7d'"),
        ({"ARCHIVE": {"default": -1}}, "from 0 (not archived) to 10 years"),
        ({"ARCHIVE": {"bad channel!": "1d"}}, "not a channel name"),
        ({"REDACT_AFTER": "soon"}, "REDACT_AFTER'] must be a duration"),
        ({"ARCHIVE": {"default": "60d"}}, "REDACT_AFTER'] ('30d') is shorter than"),
    ],
)
def test_archive_settings_that_are_wrong_are_reported_as_e036(raw, says):
    problems = validate(raw)
    assert [p.id for p in problems] == ["bumail_queue.E036"]
    assert says in problems[0].message


def test_head_fields_decode_the_subject_and_keep_the_message_id():
    head = (
        b"From: a@example.com\r\nSubject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\n aus =?utf-8?b?S8O2bG4=?=\r\n"
        b"Message-ID: <1.2@mta.example.com>\r\nSubject: a second one\r\n"
    )
    assert head_fields(head) == archive.HeadFields(subject="Grüße aus Köln", message_id="<1.2@mta.example.com>")
    assert head_fields(b"From: a@example.com\r\n") == archive.HeadFields()
    assert head_fields(b"Subject: =?bogus?q?x?=\r\n").subject == "=?bogus?q?x?="  # as written


# -- what the worker archives ---------------------------------------------------------


def test_delivered_mail_is_archived_from_the_octets_it_delivered(smtp_server, store_keys):
    settings = smarthost(smtp_server, ARCHIVE={"default": "7d"}, REDACT_AFTER="30d", **store_keys)
    with override_settings(BUMAIL_QUEUE=settings):
        item = queue.enqueue(message("Grüße aus Köln", to=["ann@example.org", "bob@example.org"]), priority=5)
        queued = queue.read_message(item.id)
        now = timezone.now()
        queue.deliver_due(now=now)
    row = archived(item.id)
    assert bytes(row.data) == queued
    assert bytes(row.headers) == queued.split(b"\r\n\r\n")[0]
    message_id = message_from_bytes(queued)["Message-ID"]
    assert (row.subject, row.message_id) == ("Grüße aus Köln", message_id)
    assert (row.sender, row.recipients, row.channel, row.priority) == (
        "shop@example.com",
        "ann@example.org\nbob@example.org",
        "default",
        5,
    )
    assert (row.archived_at, row.body_until, row.keep_until) == (now, now + timedelta(days=7), now + timedelta(days=30))
    assert row.resent_from is None
    # The delivery log names the message too.
    entries = DeliveryLog.objects.filter(item_id=item.id)
    assert {(e.recipient, e.subject, e.message_id) for e in entries} == {
        ("ann@example.org", "Grüße aus Köln", message_id),
        ("bob@example.org", "Grüße aus Köln", message_id),
    }


def test_a_channel_archived_for_0d_archives_nothing(smtp_server, store_keys):
    settings = smarthost(smtp_server, ARCHIVE={"default": "7d", "newsletter": "0d"}, **store_keys)
    with override_settings(BUMAIL_QUEUE=settings):
        news = queue.enqueue(message("News"), channel="newsletter")
        alert = queue.enqueue(message("Alert"), channel="alerts")  # not named: "default"'s 7 days
        queue.deliver_due()
    assert len(smtp_server.messages) == 2
    assert archived(news.id) is None
    assert archived(alert.id).subject == "Alert"
    assert DeliveryLog.objects.get(item_id=news.id).subject == "News"  # logged all the same


def test_without_archive_nothing_is_kept(smtp_server):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server)):
        queue.enqueue(message())
        queue.deliver_due()
    assert len(smtp_server.messages) == 1
    assert not ArchivedMessage.objects.exists()


def test_an_item_is_archived_when_it_leaves_the_queue_with_a_recipient_delivered(smtp_servers, store_keys):
    server = smtp_servers(
        rcpt_replies={
            "later@example.org": ["451 4.3.0 Try later", "250 2.1.5 OK"],
            "gone@example.org": "550 5.1.1 No such user",
        }
    )
    settings = smarthost(server, ARCHIVE={"default": "7d"}, RETRY_JITTER=0, **store_keys)
    with override_settings(BUMAIL_QUEUE=settings):
        partly = queue.enqueue(message("Partly", to=["ann@example.org", "later@example.org", "gone@example.org"]))
        failed = queue.enqueue(message("Nobody", to=["gone@example.org"]))
        now = timezone.now()
        queue.deliver_due(now=now)
        assert archived(partly.id) is None  # later@ is deferred: the item is still queued
        assert archived(failed.id) is None  # left the queue, but no one got it
        queue.deliver_due(now=now + timedelta(hours=1))
        assert queue.get(partly.id) is None
    row = archived(partly.id)
    assert row.archived_at == now + timedelta(hours=1)
    assert row.recipients.splitlines() == ["ann@example.org", "later@example.org", "gone@example.org"]
    assert archived(failed.id) is None


# -- the retention --------------------------------------------------------------------


def a_row(now, *, body_for, keep_for, subject="Kept"):
    from uuid import uuid4

    return ArchivedMessage.objects.create(
        item_id=uuid4(),
        archived_at=now,
        channel="default",
        sender="shop@example.com",
        recipients="ann@example.org",
        subject=subject,
        message_id="<x@example.com>",
        headers=b"Subject: " + subject.encode(),
        data=b"Subject: " + subject.encode() + b"\r\n\r\nBody\r\n",
        body_until=now + body_for,
        keep_until=now + keep_for,
    )


def test_purge_drops_the_bodies_then_the_rows_as_their_times_pass():
    now = timezone.now()
    rows = [a_row(now, body_for=timedelta(days=n), keep_for=timedelta(days=10 + n)) for n in (1, 2, 3)]
    assert archive.purge(now=now) == (0, 0)
    assert archive.purge(now=now + timedelta(days=2, hours=1), batch_size=1) == (2, 0)
    kept = {row.item_id: row for row in ArchivedMessage.objects.all()}
    assert [kept[row.item_id].data is None for row in rows] == [True, True, False]
    assert bytes(kept[rows[0].item_id].headers) == b"Subject: Kept"  # the headers stay
    assert archive.due_counts(now=now + timedelta(days=12, hours=1)) == (1, 2)
    assert archive.purge(now=now + timedelta(days=12, hours=1), batch_size=1) == (1, 2)
    assert list(ArchivedMessage.objects.values_list("item_id", flat=True)) == [rows[2].item_id]
    assert archive.purge(now=now + timedelta(days=14)) == (0, 1)
    assert not ArchivedMessage.objects.exists()


def test_queue_purge_applies_the_archive_retention():
    now = timezone.now()
    a_row(now - timedelta(days=8), body_for=timedelta(days=7), keep_for=timedelta(days=30))
    a_row(now - timedelta(days=31), body_for=timedelta(days=7), keep_for=timedelta(days=30))
    out = StringIO()
    call_command("queue_purge", "--dry-run", stdout=out)
    assert (
        "Would drop the body of 2 archived messages past ARCHIVE; would delete 1 past REDACT_AFTER." in out.getvalue()
    )
    assert ArchivedMessage.objects.filter(data__isnull=False).count() == 2
    out = StringIO()
    call_command("queue_purge", stdout=out)
    assert "Dropped the body of 2 archived messages past ARCHIVE; deleted 1 past REDACT_AFTER." in out.getvalue()
    (left,) = ArchivedMessage.objects.all()
    assert left.data is None


# -- the resend -----------------------------------------------------------------------


def delivered_and_archived(server, store_keys, **extra):
    settings = smarthost(server, ARCHIVE={"default": "7d"}, **store_keys, **extra)
    with override_settings(BUMAIL_QUEUE=settings):
        item = queue.enqueue(message("Receipt 42", to=["ann@example.org", "bob@example.org"]), channel="receipts")
        queue.deliver_due()
    return settings, archived(item.id)


def test_resend_queues_the_same_octets_with_a_new_message_id(smtp_server, store_keys):
    settings, original = delivered_and_archived(smtp_server, store_keys)
    with override_settings(BUMAIL_QUEUE=settings):
        new = queue.resend(str(original.item_id), by="ops")
        again = queue.read_message(new.id)
    assert (new.sender, [r.address for r in new.recipients], new.channel) == (
        "shop@example.com",
        ["ann@example.org", "bob@example.org"],
        "receipts",
    )
    assert new.key == f"resend:{original.item_id}:1"
    new_id = message_from_bytes(again)["Message-ID"]
    assert new_id != original.message_id and new_id.endswith("@mta.example.com>")
    assert again == bytes(original.data).replace(original.message_id.encode(), new_id.encode())
    link = ResentMessage.objects.get(item_id=new.id)
    assert (link.resent_from, link.by) == (original.item_id, "ops")


def test_resend_to_some_recipients_and_what_it_refuses(smtp_server, store_keys):
    settings, original = delivered_and_archived(smtp_server, store_keys)
    with override_settings(BUMAIL_QUEUE=settings):
        new = queue.resend(str(original.item_id), recipients=["BOB@example.org"])
        assert [r.address for r in new.recipients] == ["bob@example.org"]
        assert new.key == f"resend:{original.item_id}:1"
        with pytest.raises(QueueError) as refused:
            queue.resend(str(original.item_id), recipients=["eve@example.org"])
        assert refused.value.code == ErrorCode.INVALID
        assert "eve@example.org" in refused.value.message
        with pytest.raises(QueueError) as gone:
            queue.resend("9b0e0c4e-3f0a-4a4e-9d7e-0c4d1d3c8f00")
        assert gone.value.code == ErrorCode.NOT_KEPT
        ArchivedMessage.objects.filter(item_id=original.item_id).update(data=None)
        with pytest.raises(QueueError) as redacted:
            queue.resend(str(original.item_id))
        assert redacted.value.code == ErrorCode.NOT_KEPT
        assert "only the header section" in redacted.value.message


def test_queue_resend_command(smtp_server, store_keys):
    settings, original = delivered_and_archived(smtp_server, store_keys)
    with override_settings(BUMAIL_QUEUE=settings):
        out = StringIO()
        call_command("queue_resend", str(original.item_id), "--to", "ann@example.org", "--by", "ops", stdout=out)
        (link,) = ResentMessage.objects.all()
        assert out.getvalue() == f"Resent {original.item_id} as item {link.item_id}, to ann@example.org.\n"
        with pytest.raises(CommandError, match=r"^The archive keeps no message of item nope"):
            call_command("queue_resend", "nope", stdout=StringIO())
        ArchivedMessage.objects.update(data=None)
        with pytest.raises(CommandError, match="only the header section") as error:
            call_command("queue_resend", str(original.item_id), stdout=StringIO())
        assert "\n" not in str(error.value)


def test_the_resent_item_is_archived_with_its_link_to_the_original(smtp_server, store_keys):
    settings, original = delivered_and_archived(smtp_server, store_keys)
    with override_settings(BUMAIL_QUEUE=settings):
        new = queue.resend(str(original.item_id))
        queue.deliver_due()
    copy = archived(new.id)
    assert copy.resent_from == original.item_id
    assert copy.subject == "Receipt 42"
    assert copy.message_id != original.message_id
    assert DeliveryLog.objects.filter(item_id=new.id, message_id=copy.message_id).count() == 2


def test_cancelled_entries_carry_the_subject_and_message_id(store_keys):
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store_keys}):
        item = queue.enqueue(message("Never sent"))
        message_id = message_from_bytes(queue.read_message(item.id))["Message-ID"]
        queue.cancel(item.id)
    entry = DeliveryLog.objects.get(item_id=item.id)
    assert (entry.status, entry.subject, entry.message_id) == ("cancelled", "Never sent", message_id)


def test_a_new_message_id_takes_the_place_of_the_old_one():
    data = b"From: a@example.com\r\nMessage-ID: <old@example.com>\r\nSubject: s\r\n\r\nBody\r\n"
    new = mime.with_new_message_id(data, hostname="mta.example.com")
    head, body = new.split(b"\r\n\r\n", 1)
    fields = head.split(b"\r\n")
    assert fields[0] == b"From: a@example.com" and fields[2] == b"Subject: s" and body == b"Body\r\n"
    assert fields[1].startswith(b"Message-ID: <") and fields[1].endswith(b"@mta.example.com>")
    twice = b"Message-ID: <a@x>\nSubject: s\nMessage-Id: <b@x>\n\nBody\n"
    assert mime.with_new_message_id(twice, hostname="h.example").count(b"essage-I") == 1
    none = mime.with_new_message_id(b"Subject: s\r\n\r\nBody\r\n", hostname="h.example")
    assert none.startswith(b"Subject: s\r\nMessage-ID: <") and none.endswith(b"@h.example>\r\n\r\nBody\r\n")


def test_resend_refuses_an_nth_that_is_none(store_keys):
    with (
        override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store_keys}),
        pytest.raises(QueueError) as error,
    ):
        queue.resend("9b0e0c4e-3f0a-4a4e-9d7e-0c4d1d3c8f00", nth=0)
    assert error.value.code == ErrorCode.INVALID
