"""The archive's admin pages through Django's test client: the list and its search, the
page of one message (whole, then headers only), its ``.eml``, and *Resend* with its
confirmation, permission-checked; the item page's links to the archive."""

from __future__ import annotations

import html
from datetime import timedelta
from email import message_from_bytes
from uuid import uuid4

import pytest
from django.contrib.auth.models import Permission, User
from django.core.mail import EmailMultiAlternatives
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.models import ArchivedMessage, DeliveryLog, ResentMessage

pytestmark = pytest.mark.django_db(transaction=True)

LIST = reverse("admin:bumail_queue_archivedmessage_changelist")


def page(item_id):
    return reverse("admin:bumail_queue_archivedmessage_change", args=[item_id])


def resend_url(item_id):
    return reverse("admin:bumail_queue_archivedmessage_resend", args=[item_id])


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def queue_settings(request, settings):
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}
    settings.BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com", "ARCHIVE": {"default": "7d"}, **store}
    return settings.BUMAIL_QUEUE


@pytest.fixture
def original(queue_settings):
    """An archived message, as the worker writes one (its item has left the queue)."""
    mail = EmailMultiAlternatives(
        "Order shipped", "Your parcel is on its way.", "shop@example.com", ["ann@example.org", "bob@example.org"]
    )
    mail.attach_alternative('<p onclick="steal()">Your parcel</p><script>alert(1)</script>', "text/html")
    item = queue.enqueue(mail)
    data = queue.read_message(item.id)
    queue.cancel(item.id)  # gone from the queue, as a delivered item is
    now = timezone.now()
    ArchivedMessage.objects.create(
        item_id=item.id,
        archived_at=now,
        channel="default",
        sender="shop@example.com",
        recipients="ann@example.org\nbob@example.org",
        subject="Order shipped",
        message_id=message_from_bytes(data)["Message-ID"],
        headers=data.split(b"\r\n\r\n")[0],
        data=data,
        body_until=now + timedelta(days=7),
        keep_until=now + timedelta(days=30),
    )
    return ArchivedMessage.objects.get(item_id=item.id)


def user_with(*codenames, username="operator"):
    user = User.objects.create_user(username, is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="bumail_queue", codename=codename))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser_client(client):
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    return client


def test_the_list_searches_by_recipient_subject_message_id_and_item_id(superuser_client, original):
    other = ArchivedMessage.objects.create(
        item_id=uuid4(), archived_at=timezone.now(), sender="a@example.com", recipients="carl@example.net",
        subject="Password reset", message_id="<reset-1@example.com>", headers=b"Subject: Password reset",
        data=None, body_until=timezone.now(), keep_until=timezone.now() + timedelta(days=1),
    )  # fmt: skip
    listed = superuser_client.get(LIST).content.decode()
    assert "Order shipped" in listed and "Password reset" in listed
    assert "Content-Security-Policy" in superuser_client.get(LIST).headers
    for term, found, missing in [
        ("bob@example.org", "Order shipped", "Password reset"),
        ("reset", "Password reset", "Order shipped"),
        ("reset-1@example.com", "Password reset", "Order shipped"),
        (str(original.item_id), "Order shipped", "Password reset"),
    ]:
        shown = superuser_client.get(LIST, {"q": term}).content.decode()
        assert found in shown and missing not in shown, term
    assert "headers only" in superuser_client.get(LIST, {"q": str(other.item_id)}).content.decode()


def test_the_page_shows_the_headers_and_the_sanitised_body_while_kept(superuser_client, original):
    shown = superuser_client.get(page(original.item_id)).content.decode()
    assert original.message_id.replace("<", "&lt;").replace(">", "&gt;") in shown
    assert "Your parcel is on its way." in shown
    assert "steal()" not in shown and "alert(1)" not in shown
    assert 'id="bq-resend"' in shown and 'id="bq-eml"' in shown
    eml = superuser_client.get(reverse("admin:bumail_queue_archivedmessage_eml", args=[original.item_id]))
    assert eml["Content-Type"] == "message/rfc822"
    assert b"".join(eml.streaming_content if eml.streaming else [eml.content]) == bytes(original.data)


def test_once_redacted_the_page_shows_the_headers_alone_and_offers_no_resend(superuser_client, original):
    ArchivedMessage.objects.filter(item_id=original.item_id).update(data=None)
    shown = superuser_client.get(page(original.item_id)).content.decode()
    assert 'id="bq-redacted"' in shown and "Order shipped" in shown
    assert "Your parcel is on its way." not in shown and 'id="bq-resend"' not in shown
    assert (
        superuser_client.get(reverse("admin:bumail_queue_archivedmessage_eml", args=[original.item_id])).status_code
        == 404
    )
    response = superuser_client.post(
        resend_url(original.item_id), {"confirm": "yes", "to": ["ann@example.org"]}, follow=True
    )
    assert "only the header section" in response.content.decode()
    assert not ResentMessage.objects.exists()


def test_resend_asks_first_then_queues_the_message_again(superuser_client, original):
    asked = superuser_client.get(resend_url(original.item_id))
    text = asked.content.decode()
    assert "Resend “Order shipped” from shop@example.com?" in text
    assert 'value="ann@example.org" checked' in text and 'value="bob@example.org" checked' in text
    assert queue.count() == 0  # asking queues nothing
    done = superuser_client.post(resend_url(original.item_id), {"confirm": "yes", "to": ["bob@example.org"]})
    (link,) = ResentMessage.objects.all()
    assert done.status_code == 302
    assert done["Location"] == reverse("admin:bumail_queue_item_change", args=[str(link.item_id)])
    item = queue.get(str(link.item_id))
    assert [r.address for r in item.recipients] == ["bob@example.org"]
    assert (link.resent_from, link.by) == (original.item_id, "admin")
    new_data = queue.read_message(item.id)
    assert message_from_bytes(new_data)["Message-ID"] != original.message_id
    # The item page links back to the original; the archive's page names its resend.
    item_page = superuser_client.get(done["Location"]).content.decode()
    assert reverse("admin:bumail_queue_item_change", args=[str(original.item_id)]) in item_page
    assert str(link.item_id) in superuser_client.get(page(original.item_id)).content.decode()


def test_resend_with_no_recipient_chosen_queues_nothing(superuser_client, original):
    response = superuser_client.post(resend_url(original.item_id), {"confirm": "yes"}, follow=True)
    assert "Choose at least one recipient" in response.content.decode()
    assert queue.count() == 0


def test_resend_needs_the_change_permission(original):
    viewer = user_with("view_archivedmessage")
    assert viewer.get(page(original.item_id)).status_code == 200
    assert 'id="bq-resend"' not in viewer.get(page(original.item_id)).content.decode()
    assert viewer.get(resend_url(original.item_id)).status_code == 403
    assert viewer.post(resend_url(original.item_id), {"confirm": "yes", "to": ["ann@example.org"]}).status_code == 403
    assert queue.count() == 0
    nobody = user_with(username="nobody")
    assert nobody.get(page(original.item_id)).status_code == 403
    assert nobody.get(reverse("admin:bumail_queue_archivedmessage_eml", args=[original.item_id])).status_code == 403
    resender = user_with("view_archivedmessage", "change_archivedmessage", username="resender")
    assert resender.post(resend_url(original.item_id), {"confirm": "yes", "to": ["ann@example.org"]}).status_code == 302
    assert queue.count() == 1


def test_the_delivery_log_shows_the_subject_and_finds_a_message_id(superuser_client, original):
    # The fixture's item was cancelled: its entries carry its subject and Message-ID.
    entry = DeliveryLog.objects.filter(item_id=original.item_id).first()
    shown = superuser_client.get(reverse("admin:bumail_queue_deliverylog_change", args=[entry.pk])).content.decode()
    assert "Order shipped" in shown and html.escape(original.message_id) in shown
    log = reverse("admin:bumail_queue_deliverylog_changelist")
    found = superuser_client.get(log, {"q": original.message_id}).content.decode()
    assert "ann@example.org" in found and "bob@example.org" in found
    assert "ann@example.org" not in superuser_client.get(log, {"q": "<other@example.com>"}).content.decode()


def test_the_confirmation_posted_twice_resends_once(superuser_client, original):
    asked = superuser_client.get(resend_url(original.item_id)).content.decode()
    assert 'name="nth" value="1"' in asked
    form = {"confirm": "yes", "to": ["ann@example.org"], "nth": "1"}
    first = superuser_client.post(resend_url(original.item_id), form)
    second = superuser_client.post(resend_url(original.item_id), form)
    assert first["Location"] == second["Location"]
    assert queue.count() == 1
    assert ResentMessage.objects.count() == 1
    assert 'name="nth" value="2"' in superuser_client.get(resend_url(original.item_id)).content.decode()
