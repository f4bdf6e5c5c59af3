"""The page of one address, through Django's test client, on every store: its queued
items (that recipient exactly), its delivery log, its suppression entries in every scope
with their remove buttons, the returned mail that names it; reached from every page that
shows an address; each section shown to those who may view it."""

from __future__ import annotations

import re
import secrets
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.auth.models import Permission, User
from django.core.mail import EmailMessage
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.items import Reply
from bumail_queue.models import DeliveryLog, ReturnedMail
from bumail_queue.stores import get_store
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason, channel_scope

pytestmark = pytest.mark.django_db(transaction=True)

# Made at each run, only so that the tests can show that no page ever prints it.
SMARTHOST_PASSWORD = secrets.token_urlsafe(18)
ANN = "ann@example.org"


def page(address):
    return reverse("admin:bumail_queue_item_address", args=[address])


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_name(request, settings):
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}
    settings.BUMAIL_QUEUE = {
        "HOSTNAME": "mta.example.com",
        **store,
        # Only so that the tests can show that no page ever prints it.
        "ROUTE": {"TYPE": "smarthost", "HOST": "smtp.example.com", "USERNAME": "relay", "PASSWORD": SMARTHOST_PASSWORD},
    }
    return request.param


def client_with(*codenames, username="operator"):
    user = User.objects.create_user(username, is_staff=True)  # no password: force_login
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="bumail_queue", codename=codename))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator(store_name):
    """A staff user who may view everything and remove suppression entries (not a superuser)."""
    return client_with("view_item", "view_deliverylog", "view_suppression", "delete_suppression", "view_returnedmail")


def text_of(response):
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def section(response, name):
    """The HTML of one section of the page (``None`` when the page has no such section)."""
    found = re.search(
        rf'<div class="module bq-section" id="bq-address-{name}">(.*?)\n  </div>', response.content.decode(), re.S
    )
    return None if found is None else found.group(1)


def item_ids(response):
    return re.findall(r'<tr data-item-id="([^"]+)"', section(response, "items") or "")


def send(to, subject="Hello"):
    return queue.enqueue(EmailMessage(subject, "Body.", "news@example.com", to))


def logged(recipient, status, *, minutes_ago, text):
    return DeliveryLog.objects.create(
        logged_at=timezone.now() - timedelta(minutes=minutes_ago), item_id="00000000-0000-4000-8000-000000000001",
        recipient=recipient, domain=recipient.rpartition("@")[2], status=status, reply_code=550,
        reply_status="5.1.1", reply_text=text, remote_host="mx1.example.org",
    )  # fmt: skip


def suppressed(address, *, scope="", reason=SuppressionReason.FAILED):
    now = timezone.now()
    entry = Suppression(
        address=address,
        reason=reason,
        reply=Reply(code=550, status="5.1.1", text=f"5.1.1 <{address}>: User unknown"),
        created_at=now - timedelta(days=1),
        expires_at=now + timedelta(days=29),
        scope=scope,
    )
    get_store().update_suppressions(SuppressionChange(add=(entry,)), now=now)


def test_the_page_shows_the_items_log_and_suppressions_of_an_address(operator):
    mine = send([ANN, "bob@example.org"], subject="For Ann and Bob")
    send(["joann@example.org"], subject="For Joann")  # contains "ann@example.org": not Ann's
    send(["ann@example.org.uk"], subject="Another domain")
    logged(ANN, "failed", minutes_ago=30, text="older outcome")
    logged(ANN, "deferred", minutes_ago=5, text="newer outcome")
    logged("joann@example.org", "delivered", minutes_ago=1, text="not Ann's")
    suppressed(ANN)
    suppressed(ANN, scope=channel_scope("newsletter"), reason=SuppressionReason.UNSUBSCRIBED)

    response = operator.get(page(ANN))

    assert response.status_code == 200
    assert response["Content-Security-Policy"].startswith("default-src 'self'")
    assert item_ids(response) == [mine.id]
    assert "For Ann and Bob" in section(response, "items")
    log = text_of(response).split("Delivery log", 1)[1]
    assert log.index("newer outcome") < log.index("older outcome")
    assert "not Ann's" not in log
    scopes = re.findall(r'<tr data-scope="([^"]*)"', section(response, "suppressions"))
    assert scopes == ["", "channel:newsletter"]
    assert "all mail" in text_of(response)
    assert SMARTHOST_PASSWORD not in response.content.decode()


def test_an_address_with_nothing_says_so(operator):
    response = operator.get(page("nobody@example.org"))
    assert response.status_code == 200
    text = text_of(response)
    assert "Not suppressed: mail to this address is sent." in text
    assert "No queued item has this recipient." in text
    assert "The delivery log has nothing about this address." in text


def test_its_domain_is_matched_in_any_case(operator):
    mine = send(["ann@Example.ORG"])
    assert item_ids(operator.get(page(ANN))) == [mine.id]


def test_the_address_is_escaped(operator):
    hostile = '"<script>alert(1)</script>"@example.org'
    suppressed(hostile)
    response = operator.get(page(hostile))
    assert response.status_code == 200
    assert "<script>alert(1)</script>" not in response.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in response.content.decode()
    assert re.findall(r'<tr data-scope="([^"]*)"', section(response, "suppressions")) == [""]


def test_an_entry_is_removed_in_its_scope_alone(operator):
    suppressed(ANN)
    suppressed(ANN, scope=channel_scope("newsletter"), reason=SuppressionReason.UNSUBSCRIBED)

    response = operator.post(page(ANN), {"action": "remove", "scope": "channel:newsletter"}, follow=True)

    assert "1 suppression entry removed." in text_of(response)
    assert [entry.scope for entry in queue.suppressions_for(ANN)] == [""]
    assert re.findall(r'<tr data-scope="([^"]*)"', section(response, "suppressions")) == [""]


def test_forgetting_removes_every_scope(operator):
    suppressed(ANN)
    suppressed(ANN, scope=channel_scope("newsletter"), reason=SuppressionReason.UNSUBSCRIBED)

    response = operator.post(page(ANN), {"action": "forget"}, follow=True)

    assert "2 suppression entries removed." in text_of(response)
    assert queue.suppressions_for(ANN) == []
    assert "Not suppressed: mail to this address is sent." in text_of(response)


def test_removing_needs_the_delete_permission(store_name):
    suppressed(ANN)
    viewer = client_with("view_item", "view_suppression")

    response = viewer.get(page(ANN))
    assert 'name="action"' not in response.content.decode()
    assert viewer.post(page(ANN), {"action": "forget"}).status_code == 403
    assert [entry.scope for entry in queue.suppressions_for(ANN)] == [""]


def test_each_section_needs_its_view_permission(store_name):
    send([ANN])
    logged(ANN, "failed", minutes_ago=1, text="User unknown")
    suppressed(ANN)

    log_reader = client_with("view_deliverylog")
    response = log_reader.get(page(ANN))
    assert response.status_code == 200
    assert section(response, "log") is not None
    assert section(response, "items") is None
    assert section(response, "suppressions") is None

    item_reader = client_with("view_item", username="items")
    response = item_reader.get(page(ANN))
    assert section(response, "items") is not None
    assert section(response, "log") is None

    assert client_with("view_returnedmail", username="other").get(page(ANN)).status_code == 403
    assert Client().get(page(ANN)).status_code == 302  # to the login page


def test_the_log_section_is_capped_with_a_link_to_the_log(operator):
    for minute in range(51):
        logged(ANN, "deferred", minutes_ago=minute, text=f"attempt {minute}")
    response = operator.get(page(ANN))
    assert len(re.findall(r"<tr data-log-id=", section(response, "log"))) == 50
    link = re.search(r'<a href="([^"]+)" id="bq-more-log">', response.content.decode()).group(1)
    assert unescape(link) == reverse("admin:bumail_queue_deliverylog_changelist") + "?q=ann%40example.org"


def test_returned_mail_that_names_it_is_listed(operator):
    ReturnedMail.objects.create(
        received_at=timezone.now(), recipients="bounces@example.com", sender=ANN, subject="Out of office",
        message=b"Subject: Out of office\r\n\r\nAway.\r\n",
    )  # fmt: skip
    ReturnedMail.objects.create(
        received_at=timezone.now(), recipients="bounces@example.com", sender="zed@example.org", subject="Other",
        message=b"Subject: Other\r\n\r\n.\r\n",
    )  # fmt: skip
    returned = section(operator.get(page(ANN)), "returned")
    assert "Out of office" in returned
    assert "Other" not in returned


def test_every_address_shown_links_to_its_page(operator):
    item = send([ANN])
    logged(ANN, "deferred", minutes_ago=1, text="Greylisted")
    suppressed(ANN)
    link = f'href="{page(ANN)}"'

    assert link in operator.get(reverse("admin:bumail_queue_item_changelist")).content.decode()
    assert link in operator.get(reverse("admin:bumail_queue_item_change", args=[item.id])).content.decode()
    assert link in operator.get(reverse("admin:bumail_queue_suppression_changelist")).content.decode()
    assert link in operator.get(reverse("admin:bumail_queue_deliverylog_changelist")).content.decode()
    entry = DeliveryLog.objects.get(recipient=ANN)
    assert link in operator.get(reverse("admin:bumail_queue_deliverylog_change", args=[entry.pk])).content.decode()
