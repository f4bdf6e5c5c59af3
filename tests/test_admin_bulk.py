"""The queue list's actions on all the items matching its filter, through Django's test
client, on every store: a confirmation page with the count, the filter in words and a
sample; then, confirmed, the bulk action on exactly those items, by the user, with an
audit entry; hold and release of selected rows; the audit's read-only page."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission, User
from django.core.mail import EmailMessage
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.items import AttemptResult, Outcome, RecipientStatus, Reply
from bumail_queue.models import BulkAction
from bumail_queue.operations.bulk import BulkFilter
from bumail_queue.queries import ItemState, state_of
from bumail_queue.stores import get_store
from tests.servers.smtp import closed_port

pytestmark = pytest.mark.django_db(transaction=True)

LIST = reverse("admin:bumail_queue_item_changelist")
AUDIT = reverse("admin:bumail_queue_bulkaction_changelist")
LATER = Reply(code=451, status="4.7.1", text="Greylisted, try again later")


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_name(request, settings):
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}
    settings.BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com", **store}
    return request.param


def user_with(*codenames, username="operator"):
    user = User.objects.create_user(username, is_staff=True)  # no password: force_login
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="bumail_queue", codename=codename))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator(store_name):
    """May view, retry, hold, release and cancel the queue's items, and read the audit."""
    return user_with("view_item", "change_item", "delete_item", "view_bulkaction")


def send(to, subject):
    return queue.enqueue(EmailMessage(subject, "Body.", "shop@example.com", [to]))


def lease(item, owner="worker-on-host-1"):
    """Lease ``item`` alone to ``owner``, as a worker's claim does; give back the rest."""
    store = get_store()
    now = timezone.now()
    claimed = store.claim(
        owner=owner, now=now + timedelta(seconds=1), lease_until=now + timedelta(minutes=10), limit=1000
    )
    for other in claimed:
        if other.id != item.id:
            store.reschedule(other.id, at=now, owner=owner)
    assert item.id in {i.id for i in claimed}


def deferred(to, subject):
    """An item tried once, its recipient deferred, due again in 30 minutes."""
    item = send(to, subject)
    lease(item, "test-worker")
    result = AttemptResult(
        outcomes={to: Outcome(status=RecipientStatus.DEFERRED, reply=LATER)},
        next_attempt_at=timezone.now() + timedelta(minutes=30),
    )
    get_store().complete(item.id, owner="test-worker", result=result)
    return queue.get(item.id)


def state(item):
    found = queue.get(item.id)
    return None if found is None else state_of(found, timezone.now())


def text_of(response):
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def messages_of(response):
    return [str(m) for m in response.context["messages"]] if response.context else []


def list_url(**params):
    return LIST + "?" + urlencode(params)


def ask(client, action, **params):
    """Choose ``action`` for all the items matching ``params`` in the list: the confirmation page."""
    return client.post(list_url(**params), {"action": action, "select_across": "1", "next": list_url(**params)})


def confirm(client, action, **params):
    return client.post(
        list_url(**params),
        {"action": action, "select_across": "1", "confirm": "yes", "next": list_url(**params)},
        follow=True,
    )


@pytest.fixture
def mail(store_name):
    """Three new items and one deferred at example.net, one being delivered there, and
    mail elsewhere: new at example.org, deferred at example.com."""
    return {
        "net1": send("ann@example.net", "Spring sale, Ann"),
        "net2": send("ben@example.net", "Spring sale, Ben"),
        "net3": send("cleo@example.net", "Spring sale, Cleo"),
        "net_deferred": deferred("dan@example.net", "Your invoice, Dan"),
        "org": send("erin@example.org", "Spring sale, Erin"),
        "com_deferred": deferred("finn@example.com", "Your invoice, Finn"),
    }


def states(mail):
    return {name: state(item) for name, item in mail.items()}


# -- the confirmation page --------------------------------------------------------------


def test_the_confirmation_page_shows_the_count_the_filter_and_a_sample(operator, mail):
    before = states(mail)
    response = ask(operator, "hold", domain="example.net", state="queued")
    assert response.status_code == 200
    page = text_of(response)
    assert "Hold all 3 items matching: domain example.net, state queued" in page
    assert "Spring sale, Ann" in page and "ben@example.net" in page and "Spring sale, Cleo" in page
    assert "Erin" not in page and "Dan" not in page
    # Its form posts back to the same filter, with its CSRF token; its way back is the list.
    html = response.content.decode()
    assert 'name="csrfmiddlewaretoken"' in html
    assert f'action="{list_url(domain="example.net", state="queued")}"'.replace("&", "&amp;") in html
    assert f'href="{list_url(domain="example.net", state="queued")}"'.replace("&", "&amp;") in html
    assert states(mail) == before and not BulkAction.objects.exists()  # a dry run


def test_the_count_leaves_out_an_item_being_delivered_and_says_so(operator, mail):
    busy = send("gus@example.net", "Being delivered")
    lease(busy)
    page = text_of(ask(operator, "hold", domain="example.net"))
    assert "Hold all 4 items matching: domain example.net" in page
    assert "1 more item matches but is being delivered right now" in page


def test_the_list_offers_all_matching_items_once_filtered(operator, mail):
    page = operator.get(list_url(domain="example.net")).content.decode()
    assert 'id="bq-select-across"' in page and "Select all 4 items matching this filter" in page
    assert 'class="select-across"' in page
    assert 'value="hold"' in page and 'value="release"' in page
    unfiltered = operator.get(LIST).content.decode()
    assert "bq-select-across" not in unfiltered and "bq-all-matching-refused" not in unfiltered
    searched = operator.get(list_url(q="ann")).content.decode()
    assert "bq-select-across" not in searched and "cannot follow a search" in searched


# -- each action, on exactly the matching items ----------------------------------------------


def test_confirming_a_hold_holds_the_matching_items_and_no_other(operator, mail):
    busy = send("gus@example.net", "Being delivered")
    lease(busy)
    response = confirm(operator, "hold", domain="example.net")
    assert response.redirect_chain[-1][0] == list_url(domain="example.net")  # the filter kept
    assert messages_of(response) == ["Held 4 items; 1 was being delivered (or changed meanwhile) and was left alone."]
    after = states(mail)
    assert {name for name, s in after.items() if s == ItemState.HELD} == {"net1", "net2", "net3", "net_deferred"}
    assert after["org"] == ItemState.QUEUED and after["com_deferred"] == ItemState.DEFERRED
    assert state(busy) == ItemState.DELIVERING
    entry = BulkAction.objects.get()
    assert (entry.by, entry.action, entry.filter) == ("operator", "hold", {"domain": "example.net"})
    assert (entry.matched, entry.changed, entry.skipped, entry.stopped) == (5, 4, 1, "")


def test_confirming_a_release_releases_the_matching_held_items_only(operator, mail):
    queue.hold(BulkFilter(domain="example.net"))
    queue.hold(BulkFilter(domain="example.org"))
    page = text_of(ask(operator, "release", domain="example.net", state="held"))
    assert "Release all 4 held items matching: domain example.net, state held" in page
    before = timezone.now()
    response = confirm(operator, "release", domain="example.net", state="held")
    assert messages_of(response) == ["Released 4 items."]
    for name in ("net1", "net2", "net3", "net_deferred"):
        assert state(mail[name]) != ItemState.HELD
        assert before - timedelta(seconds=5) <= queue.get(mail[name].id).next_attempt_at <= timezone.now()
    assert state(mail["org"]) == ItemState.HELD  # another domain: still held
    assert BulkAction.objects.get(action="release").by == "operator"


def test_confirming_a_cancel_cancels_the_matching_items_only(operator, mail):
    page = text_of(ask(operator, "cancel", domain="example.net", state="deferred"))
    assert "Cancel the 1 item matching: domain example.net, state deferred" in page
    assert "Your invoice, Dan" in page
    response = confirm(operator, "cancel", domain="example.net", state="deferred")
    assert messages_of(response) == ["Cancelled 1 item."]
    assert queue.get(mail["net_deferred"].id) is None
    assert all(queue.get(mail[name].id) is not None for name in ("net1", "net2", "net3", "org", "com_deferred"))
    entry = BulkAction.objects.get()
    assert (entry.action, entry.changed, entry.by) == ("cancel", 1, "operator")


def test_confirming_a_retry_makes_the_matching_deferred_items_due_only(operator, mail):
    response = confirm(operator, "retry_now", domain="example.net", state="deferred")
    assert messages_of(response) == ["Retried 1 item."]
    assert queue.get(mail["net_deferred"].id).next_attempt_at <= timezone.now()
    assert queue.get(mail["com_deferred"].id).next_attempt_at > timezone.now() + timedelta(minutes=20)
    assert BulkAction.objects.get().action == "retry"


def test_a_release_of_another_state_is_refused_with_its_reason(operator, mail):
    response = operator.post(list_url(state="deferred"), {"action": "release", "select_across": "1"}, follow=True)
    assert messages_of(response) == ["A release is for held items: give no state, or 'held'."]
    assert not BulkAction.objects.exists()


@pytest.mark.parametrize("params", [{"q": "example.net"}, {"priority": "0"}, {}], ids=["search", "priority", "none"])
def test_a_filter_with_no_exact_bulk_filter_is_refused(operator, mail, params):
    before = states(mail)
    response = operator.post(
        list_url(**params), {"action": "hold", "select_across": "1", "confirm": "yes"}, follow=True
    )
    assert len(messages_of(response)) == 1
    assert "all matching items" in messages_of(response)[0]
    assert states(mail) == before and not BulkAction.objects.exists()


# -- permissions, and going back ---------------------------------------------------------


def test_a_user_without_the_permission_gets_403_and_nothing_changes(store_name, mail):
    before = states(mail)
    viewer = user_with("view_item", username="viewer")
    assert ask(viewer, "hold", domain="example.net").status_code == 403
    assert confirm(viewer, "hold", domain="example.net").status_code == 403
    changer = user_with("view_item", "change_item", username="changer")
    assert ask(changer, "cancel", domain="example.net").status_code == 403
    assert confirm(changer, "cancel", domain="example.net").status_code == 403
    assert 'id="bq-select-across"' in changer.get(list_url(domain="example.net")).content.decode()
    assert states(mail) == before and not BulkAction.objects.exists()


def test_going_back_from_the_confirmation_page_changes_nothing(operator, mail):
    before = states(mail)
    page = ask(operator, "cancel", domain="example.net").content.decode()
    back = unescape(re.search(r'<a href="([^"]+)" class="button cancel-link"', page).group(1))
    assert back == list_url(domain="example.net")
    assert operator.get(back).status_code == 200
    assert states(mail) == before and not BulkAction.objects.exists()


# -- hold and release of selected rows ----------------------------------------------------


def test_hold_and_release_the_selected_items(operator, mail):
    chosen = [mail["net1"].id, mail["org"].id]
    response = operator.post(LIST, {"action": "hold", "_selected_action": chosen}, follow=True)
    assert messages_of(response) == ["2 items held."]
    assert state(mail["net1"]) == state(mail["org"]) == ItemState.HELD
    assert state(mail["net2"]) == ItemState.QUEUED
    response = operator.post(LIST, {"action": "release", "_selected_action": [*chosen, mail["net2"].id]}, follow=True)
    assert messages_of(response) == ["2 items released; 1 was not held."]
    assert state(mail["net1"]) == state(mail["org"]) == ItemState.QUEUED
    viewer = user_with("view_item", username="viewer")
    assert viewer.post(LIST, {"action": "hold", "_selected_action": chosen}).status_code == 403


# -- the audit page -----------------------------------------------------------------------


def test_the_audit_page_lists_the_bulk_actions_read_only(operator, mail):
    confirm(operator, "hold", domain="example.net", state="queued")
    queue.retry_matching(BulkFilter(domain="example.com", older_than=timedelta(hours=1)), by="ops-script")
    page = operator.get(AUDIT)
    assert page.status_code == 200
    text = text_of(page)
    assert "domain example.net, state queued" in text and "operator" in text
    assert "domain example.com, older than 1 hour" in text and "ops-script" in text
    only_holds = text_of(operator.get(AUDIT + "?action__exact=hold"))
    assert "operator" in only_holds and "ops-script" not in only_holds
    entry = BulkAction.objects.get(action="hold")
    assert operator.get(reverse("admin:bumail_queue_bulkaction_change", args=[entry.pk])).status_code == 200
    assert operator.get(reverse("admin:bumail_queue_bulkaction_add")).status_code == 403
    assert operator.post(reverse("admin:bumail_queue_bulkaction_delete", args=[entry.pk])).status_code == 403
    assert BulkAction.objects.count() == 2
    # Linked from the queue list, for whoever may read it.
    assert f'href="{AUDIT}"' in operator.get(LIST).content.decode()
    viewer = user_with("view_item", username="viewer")
    assert f'href="{AUDIT}"' not in viewer.get(LIST).content.decode()
    assert viewer.get(AUDIT).status_code == 403


@pytest.mark.redis
def test_an_action_that_stops_says_so_and_its_audit_entry_says_why(settings, redis_settings):
    """Redis refusing every connection: the dry run says why; a confirmed action stops
    at once, says so, and its audit entry records the error. (The messages are read on
    the audit page: the list itself cannot be drawn without its store.)"""
    settings.CACHES = {
        **settings.CACHES,
        "unreachable": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://127.0.0.1:{closed_port()}/0"},
    }
    settings.BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com", **redis_settings, "REDIS_CONNECTION": "unreachable"}
    client = user_with("view_item", "change_item", "view_bulkaction")
    asked = client.post(list_url(domain="example.net"), {"action": "hold", "select_across": "1"})
    assert asked.status_code == 302
    [message] = messages_of(client.get(AUDIT))
    assert message.startswith("The items for the hold could not be counted: ")
    assert "Redis could not be reached" in message
    assert not BulkAction.objects.exists()  # a dry run leaves no entry
    done = client.post(list_url(domain="example.net"), {"action": "hold", "select_across": "1", "confirm": "yes"})
    assert done.status_code == 302 and done["Location"] == list_url(domain="example.net")
    [message] = messages_of(client.get(AUDIT))
    assert message.startswith("The hold stopped: ") and message.endswith("says how far it went.")
    entry = BulkAction.objects.get()
    assert (entry.by, entry.changed, entry.filter) == ("operator", 0, {"domain": "example.net"})
    assert entry.stopped.startswith("STORE_UNAVAILABLE")
