"""What a returned message changes, on every store: the suppression list, the delivery
log and the signals, for bounces named by a VERP return path or by the report alone,
soft bounces, complaints, and what nobody can read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings

from bumail_queue.feedback.processing import process_returned_mail
from bumail_queue.models import DeliveryLog, ReturnedMail
from bumail_queue.service import QueueService
from bumail_queue.suppression import SuppressionReason
from bumail_queue.verp import return_path
from tests.feedback.test_parsing import ARF, POSTFIX_DSN, crlf
from tests.helpers import signals_told, smarthost

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
TEMPLATE = "bounces+{token}@example.com"


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


@pytest.fixture
def told():
    with signals_told("bounced", "complained") as events:
        yield events


def sent(server, store_settings, recipients, **extra):
    """Queue a message to ``recipients`` and deliver it through ``server``; return the
    service (its clock a day on) and the item."""
    with override_settings(BUMAIL_QUEUE=smarthost(server, **store_settings, **extra)):
        service = QueueService(clock=lambda: T0)
        item = service.enqueue(EmailMessage("Hi", "Body", "app@sender.test", recipients))
        service.deliver_due(now=T0)
    return item


def service_at(now):
    return QueueService(clock=lambda: now)


def dsn_for(recipient, *, status="5.1.1", action="failed"):
    return crlf(
        POSTFIX_DSN.replace("nobody@example.net", recipient)
        .replace("Status: 5.1.1", f"Status: {status}")
        .replace("Action: failed", f"Action: {action}")
    )


def entries(item_id):
    return [(e.recipient, e.status) for e in DeliveryLog.objects.filter(item_id=item_id).order_by("id")]


def test_a_bounce_to_a_return_path_suppresses_the_recipient_it_names_whatever_the_report_says(
    smtp_server, store_settings, told
):
    settings = {"RETURN_PATH": TEMPLATE}
    item = sent(smtp_server, store_settings, ["ann@example.org", "bob@example.org"], **settings)
    bounce_to = return_path(TEMPLATE, item.id, "ann@example.org")
    later = T0 + timedelta(hours=2)
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, **store_settings, **settings)):
        # The report names the address the mail was forwarded to, not ann's.
        done = process_returned_mail(
            dsn_for("ann.forward@elsewhere.example"), recipients=[bounce_to], service=service_at(later)
        )
        service = service_at(later)
        entry = service.suppressed(["ann@example.org", "bob@example.org", "ann.forward@elsewhere.example"])
    assert done.suppressed == ("ann@example.org",)
    assert set(entry) == {"ann@example.org"}
    assert entry["ann@example.org"].reason == SuppressionReason.BOUNCED
    assert (entry["ann@example.org"].reply.code, entry["ann@example.org"].reply.status) == (550, "5.1.1")
    assert entries(item.id) == [
        ("ann@example.org", "delivered"),
        ("bob@example.org", "delivered"),
        ("ann@example.org", "bounced"),
    ]
    [(name, kwargs)] = told
    assert (name, kwargs["item_id"], kwargs["recipient"], kwargs["source"]) == (
        "bounced",
        item.id,
        "ann@example.org",
        "rfc3464",
    )


def test_a_bounce_without_a_return_path_suppresses_the_address_it_names_and_finds_its_item_in_the_log(
    smtp_server, store_settings, told
):
    item = sent(smtp_server, store_settings, ["gone@example.net"])
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, **store_settings)):
        done = process_returned_mail(dsn_for("gone@example.net"), recipients=["postmaster@example.com"])
        assert set(QueueService().suppressed(["gone@example.net"])) == {"gone@example.net"}
    assert done.suppressed == ("gone@example.net",)
    assert entries(item.id)[-1] == ("gone@example.net", "bounced")
    assert told[0][1]["item_id"] == item.id


def test_a_forged_return_path_changes_nothing(smtp_server, store_settings, told):
    settings = {"RETURN_PATH": TEMPLATE}
    item = sent(smtp_server, store_settings, ["ann@example.org"], **settings)
    real = return_path(TEMPLATE, item.id, "ann@example.org")
    forged = real.split("@")[0][:-16] + "a" * 16 + "@example.com"
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, **store_settings, **settings)):
        done = process_returned_mail(dsn_for("ann@example.org"), recipients=[forged])
        assert QueueService().suppressed(["ann@example.org"]) == {}
    assert (done.suppressed, told) == ((), [])


def test_a_soft_bounce_suppresses_only_when_a_second_comes_within_the_window(smtp_server, store_settings, told):
    item = sent(smtp_server, store_settings, ["full@example.net"])
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, **store_settings)):
        process_returned_mail(dsn_for("full@example.net", status="4.4.7"), service=service_at(T0 + timedelta(days=1)))
        assert service_at(T0 + timedelta(days=1)).suppressed(["full@example.net"]) == {}
        process_returned_mail(dsn_for("full@example.net", status="4.4.7"), service=service_at(T0 + timedelta(days=3)))
        found = service_at(T0 + timedelta(days=3)).suppressed(["full@example.net"])
    assert found["full@example.net"].reason == SuppressionReason.EXPIRED
    assert told == []  # a soft bounce is no "bounced"
    assert entries(item.id) == [("full@example.net", "delivered")]


def test_a_delay_report_changes_nothing(smtp_server, store_settings, told):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, **store_settings)):
        done = process_returned_mail(dsn_for("slow@example.net", status="4.3.0", action="delayed"))
        assert QueueService().suppressed(["slow@example.net"]) == {}
    assert (done.events, told) == ((), [])


def test_a_complaint_suppresses_its_recipient_and_is_told(smtp_server, store_settings, told):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, **store_settings)):
        done = process_returned_mail(crlf(ARF), recipients=["fbl@example.com"])
        entry = QueueService().suppressed(["Carol@example.net"])["Carol@example.net"]
    assert done.suppressed == ("Carol@example.net",) and entry.reason == SuppressionReason.COMPLAINED
    assert [(n, k["recipient"], k["feedback_type"]) for n, k in told] == [("complained", "Carol@example.net", "abuse")]


def test_what_nobody_can_read_is_kept_for_a_person_and_changes_nothing(smtp_server, store_settings, told):
    raw = b"From: someone@example.org\r\nSubject: Out of office\r\n\r\nI am away until Monday.\r\n"
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, **store_settings)):
        done = process_returned_mail(raw, recipients=["fbl@example.com"])
    kept = ReturnedMail.objects.get()
    assert done.kept == kept and told == []
    assert (kept.subject, kept.sender, kept.recipients, bytes(kept.message)) == (
        "Out of office",
        "someone@example.org",
        "fbl@example.com",
        raw,
    )


def test_without_the_suppression_list_a_bounce_is_told_and_logged_but_suppresses_nothing(smtp_server, told):
    item = sent(smtp_server, {"STORE": "orm"}, ["gone@example.net"], SUPPRESSION=False)
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, STORE="orm", SUPPRESSION=False)):
        process_returned_mail(dsn_for("gone@example.net"))
        assert QueueService().suppressed(["gone@example.net"]) == {}
    assert [n for n, _ in told] == ["bounced"]
    assert entries(item.id)[-1] == ("gone@example.net", "bounced")


def test_the_admin_lists_unread_returned_mail_shows_it_escaped_and_gives_its_eml(admin_client, settings):
    from django.urls import reverse

    settings.BUMAIL_QUEUE = {"STORE": "memory"}
    raw = b"From: someone@example.org\r\nSubject: <b>Away</b>\r\n\r\n<script>alert(1)</script> until Monday.\r\n"
    kept = process_returned_mail(raw, recipients=["fbl@example.com"]).kept
    listed = admin_client.get(reverse("admin:bumail_queue_returnedmail_changelist"))
    assert listed.status_code == 200 and "&lt;b&gt;Away&lt;/b&gt;" in listed.content.decode()
    assert listed["Content-Security-Policy"].startswith("default-src 'self'")
    page = admin_client.get(reverse("admin:bumail_queue_returnedmail_change", args=[kept.pk])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; until Monday." in page and "<script>alert" not in page
    eml = admin_client.get(reverse("admin:bumail_queue_returnedmail_eml", args=[kept.pk]))
    assert (eml["Content-Type"], eml.content) == ("message/rfc822", raw)
    assert admin_client.get(reverse("admin:bumail_queue_returnedmail_add")).status_code == 403
