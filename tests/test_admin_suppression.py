"""The admin's suppression list, through Django's test client, on every store: list,
search, add and remove, each with the permission it needs."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.items import Reply
from bumail_queue.stores import get_store
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason

pytestmark = pytest.mark.django_db(transaction=True)

LIST = reverse("admin:bumail_queue_suppression_changelist")
ADD = reverse("admin:bumail_queue_suppression_add")
SMARTHOST_PASSWORD = "test-only-smarthost-password-4711"


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


def bounced(address, *, days_ago=0, text="User unknown"):
    """Put ``address`` on the list as the worker does after a 550 5.1.1, ``days_ago`` days ago."""
    at = timezone.now() - timedelta(days=days_ago)
    entry = Suppression(
        address=address,
        reason=SuppressionReason.FAILED,
        reply=Reply(code=550, status="5.1.1", text=f"5.1.1 <{address}>: {text}"),
        created_at=at,
        expires_at=at + timedelta(days=30),
    )
    get_store().update_suppressions(SuppressionChange(add=(entry,)), now=at)
    return entry


def staff_with(*codenames, username="operator"):
    user = User.objects.create_user(username, is_staff=True)  # no password: force_login
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="bumail_queue", codename=f"{codename}_suppression")
        )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator(store_name):
    """A staff user who may see, add and remove suppressed addresses (not a superuser)."""
    return staff_with("view", "add", "delete")


def text_of(response):
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def messages_of(response):
    return [str(m) for m in response.context["messages"]] if response.context else []


def listed(response):
    return re.findall(r'<tr data-address="([^"]+)"', response.content.decode())


def test_the_list_shows_each_address_with_the_reply_that_caused_it_and_when_it_expires(operator):
    bounced("old@example.org", days_ago=2)
    bounced("gone@example.org")
    queue.suppress("stop@example.net", note="asked us to stop", duration=timedelta(days=7))

    response = operator.get(LIST)

    assert response.status_code == 200
    assert listed(response) == ["stop@example.net", "gone@example.org", "old@example.org"]  # the newest first
    page = text_of(response)
    assert "550 5.1.1 <gone@example.org>: User unknown" in page
    assert "asked us to stop" in page and "manual" in page
    # Moments after they were written: just under 28 days left for old@, under 7 for stop@.
    assert "in 3 weeks" in page and "in 6 days" in page
    expires = queue.suppressed(["old@example.org"])["old@example.org"].expires_at
    assert f"{expires:%Y-%m-%d %H:%M}" in page
    assert "3 addresses suppressed" in page
    assert SMARTHOST_PASSWORD not in response.content.decode()
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_the_list_is_searched_by_part_of_an_address(operator):
    bounced("ann@xn--bcher-kva.example")
    bounced("bob@example.org")

    assert listed(operator.get(LIST, {"q": "BOB@"})) == ["bob@example.org"]
    assert listed(operator.get(LIST, {"q": "ann@bücher.example"})) == ["ann@xn--bcher-kva.example"]
    nothing = operator.get(LIST, {"q": "nobody"})
    assert listed(nothing) == [] and "No suppressed address matches." in text_of(nothing)


def test_the_list_pages_without_counting_a_search(operator, monkeypatch):
    for n in range(5):
        bounced(f"m{n}@example.org", days_ago=n)
    monkeypatch.setattr("bumail_queue.admin.SuppressionAdmin.list_per_page", 2)

    first, third = operator.get(LIST, {"q": "example"}), operator.get(LIST, {"q": "example", "p": 3})

    assert listed(first) == ["m0@example.org", "m1@example.org"]
    assert 'rel="next"' in first.content.decode() and "suppressed" not in text_of(first).split("Page 1")[-1]
    assert listed(third) == ["m4@example.org"] and 'rel="next"' not in third.content.decode()


def test_an_operator_adds_an_address_with_a_note_and_a_duration(operator):
    form = operator.get(ADD)
    assert form.status_code == 200 and 'name="address"' in form.content.decode()

    response = operator.post(
        ADD, {"address": "Ann@Bücher.example", "note": "bounces elsewhere", "days": "10"}, follow=True
    )

    assert response.redirect_chain[-1][0] == LIST
    [entry] = queue.suppressed(["Ann@xn--bcher-kva.example"]).values()
    assert (entry.address, entry.reason, entry.reply.text) == (
        "Ann@xn--bcher-kva.example",
        SuppressionReason.MANUAL,
        "bounces elsewhere",
    )
    assert entry.expires_at - entry.created_at == timedelta(days=10)
    assert messages_of(response) == [
        f"Ann@xn--bcher-kva.example is suppressed until {entry.expires_at:%Y-%m-%d %H:%M UTC}."
    ]


def test_an_address_that_is_none_is_refused_with_the_reason(operator):
    response = operator.post(ADD, {"address": "not an address", "days": ""})

    assert response.status_code == 200
    assert "cannot be suppressed: it has no @" in text_of(response)
    assert queue.count_suppressions() == 0
    assert "greater than or equal to 1" in text_of(operator.post(ADD, {"address": "a@example.org", "days": "0"}))
    assert queue.count_suppressions() == 0


def test_an_operator_removes_addresses_from_the_list(operator):
    bounced("gone@example.org")
    bounced("also@example.org")
    bounced("kept@example.org")

    response = operator.post(
        LIST,
        {
            "action": "remove",
            "_selected_action": ["gone@example.org", "also@example.org", "never@example.org"],
            "next": f"{LIST}?q=example",
        },
        follow=True,
    )

    assert response.redirect_chain[-1][0] == f"{LIST}?q=example"
    assert messages_of(response) == ["2 addresses removed; 1 was no longer on the list."]
    assert listed(response) == ["kept@example.org"]
    assert queue.suppressed(["gone@example.org", "also@example.org"]) == {}


def test_remove_without_a_selection_or_an_action_says_so(operator):
    bounced("gone@example.org")

    none_chosen = operator.post(LIST, {"action": "remove"}, follow=True)
    no_action = operator.post(LIST, {"_selected_action": ["gone@example.org"]}, follow=True)

    assert messages_of(none_chosen) == ["Select the addresses to remove first."]
    assert messages_of(no_action) == ["Choose an action."]
    assert queue.count_suppressions() == 1


def test_each_change_needs_its_permission(store_name):
    bounced("gone@example.org")
    viewer = staff_with("view")

    page = viewer.get(LIST)
    assert page.status_code == 200 and listed(page) == ["gone@example.org"]
    assert "Suppress an address" not in text_of(page) and 'name="action"' not in page.content.decode()
    assert viewer.get(ADD).status_code == 403
    assert viewer.post(ADD, {"address": "x@example.org"}).status_code == 403
    assert viewer.post(LIST, {"action": "remove", "_selected_action": ["gone@example.org"]}).status_code == 403
    assert queue.count_suppressions() == 1
    assert staff_with(username="nobody").get(LIST).status_code == 403


def test_the_admin_index_links_the_list_and_its_add_page(operator):
    index = operator.get(reverse("admin:index")).content.decode()

    assert f'href="{LIST}"' in index and "Suppressed addresses" in index
    assert f'href="{ADD}"' in index


def test_the_list_says_when_the_workers_do_not_use_it(operator, settings):
    settings.BUMAIL_QUEUE = {**settings.BUMAIL_QUEUE, "SUPPRESSION": False}

    assert "SUPPRESSION is False" in text_of(operator.get(LIST))


def test_the_list_shows_each_entrys_scope_and_filters_by_scope_and_reason(operator):
    bounced("gone@example.org", days_ago=2)
    queue.suppress("ann@example.org", scope="channel:newsletter", reason=SuppressionReason.UNSUBSCRIBED)
    queue.suppress("bob@example.org", note="asked by phone")

    everything = operator.get(LIST)
    rows = re.findall(r'<tr data-address="([^"]+)" data-scope="([^"]*)"', everything.content.decode())
    assert rows == [("bob@example.org", ""), ("ann@example.org", "channel:newsletter"), ("gone@example.org", "")]
    assert "3 addresses suppressed" in text_of(everything)

    assert listed(operator.get(LIST, {"scope": "channel:newsletter"})) == ["ann@example.org"]
    assert listed(operator.get(LIST, {"scope": "global"})) == ["bob@example.org", "gone@example.org"]
    assert listed(operator.get(LIST, {"reason": "unsubscribed"})) == ["ann@example.org"]
    assert listed(operator.get(LIST, {"reason": "failed", "scope": "global"})) == ["gone@example.org"]
    nothing = operator.get(LIST, {"reason": "complained"})
    assert listed(nothing) == [] and "No suppressed address matches." in text_of(nothing)
    # A filter that is none shows everything rather than failing.
    assert len(listed(operator.get(LIST, {"reason": "nonsense", "scope": "bad scope"}))) == 3


def test_an_operator_removes_a_channel_entry_and_keeps_the_global_one(operator):
    bounced("ann@example.org")
    queue.suppress("ann@example.org", scope="channel:newsletter", reason=SuppressionReason.UNSUBSCRIBED)

    response = operator.post(
        LIST, {"action": "remove", "_selected_action": ["channel:newsletter|ann@example.org"]}, follow=True
    )

    assert messages_of(response) == ["1 address removed."]
    assert [entry.scope for entry in queue.suppressions_for("ann@example.org")] == [""]


def test_an_operator_suppresses_an_address_for_one_channel(operator):
    response = operator.post(ADD, {"address": "ann@example.org", "channel": "newsletter"}, follow=True)

    assert response.status_code == 200
    (entry,) = queue.suppressions_for("ann@example.org")
    assert (entry.scope, entry.reason) == ("channel:newsletter", SuppressionReason.MANUAL)
    assert queue.suppressed(["ann@example.org"]) == {}
    assert queue.suppressed(["ann@example.org"], channel="newsletter") == {"ann@example.org": entry}
    refused = operator.post(ADD, {"address": "bob@example.org", "channel": "no spaces"})
    assert "'channel' must be a name of 1 to 64 ASCII letters" in text_of(refused)
    assert queue.suppressions_for("bob@example.org") == []
