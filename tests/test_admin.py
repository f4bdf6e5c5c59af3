"""The admin's queue pages, through Django's test client, on the ORM and the memory store.

The pages read the queue through the service and the store only, so they are tested
on every store; the memory store stands for a store of your own. Transactional tests:
the Redis store enqueues when the transaction commits.
"""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.auth.models import Permission, User
from django.core.mail import EmailMultiAlternatives
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from bumail_queue import delivery_log, queue
from bumail_queue.admin import ItemAdmin
from bumail_queue.admin.shared import PAGE_CSP
from bumail_queue.items import AttemptResult, Outcome, RecipientStatus, Reply
from bumail_queue.models import DeliveryLog
from bumail_queue.operations.bulk import BulkFilter
from bumail_queue.stores import get_store

pytestmark = pytest.mark.django_db(transaction=True)

LIST = reverse("admin:bumail_queue_item_changelist")
OVERVIEW = reverse("admin:bumail_queue_item_overview")
LOG = reverse("admin:bumail_queue_deliverylog_changelist")
SMARTHOST_PASSWORD = "test-only-smarthost-password-4711"
LATER = Reply(code=451, status="4.7.1", text="Greylisted, try again later")


def item_url(item_id):
    return reverse("admin:bumail_queue_item_change", args=[item_id])


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


def newsletter(to="alice@example.org", subject="Weekly news", sender="news@example.com"):
    message = EmailMultiAlternatives(subject, "Hello in plain text.", sender, [to] if isinstance(to, str) else to)
    message.attach_alternative(
        '<h1 onclick="steal()">Hello</h1><p>Read <a href="javascript:alert(1)">this</a>.</p>'
        '<script>document.title = "pwned"</script><img src="https://tracker.example/p.gif">',
        "text/html",
    )
    message.attach("report.csv", b"a,b\n1,2\n", "text/csv")
    return message


def lease(item, owner, minutes=10):
    """Lease ``item`` alone to ``owner``, as a worker's claim does; give back the rest."""
    store = get_store()
    now = timezone.now()
    claimed = store.claim(
        owner=owner, now=now + timedelta(seconds=1), lease_until=now + timedelta(minutes=minutes), limit=1000
    )
    for other in claimed:
        if other.id != item.id:
            store.reschedule(other.id, at=now, owner=owner)
    assert item.id in {i.id for i in claimed}


def deferred_item(to="bob@slow.example"):
    """An item tried once: its recipient deferred by a greylisting server."""
    item = queue.enqueue(newsletter(to=to, subject="Deferred one"))
    now = timezone.now()
    lease(item, "test-worker")
    result = AttemptResult(
        outcomes={to: Outcome(status=RecipientStatus.DEFERRED, reply=LATER)},
        next_attempt_at=now + timedelta(minutes=30),
    )
    get_store().complete(item.id, owner="test-worker", result=result)
    DeliveryLog.objects.create(
        logged_at=now, item_id=item.id, recipient=to, domain="slow.example", status="deferred",
        reply_code=451, reply_status="4.7.1", reply_text="Greylisted, try again later", remote_host="mx1.slow.example",
    )  # fmt: skip
    return queue.get(item.id)


def leased_item(to="carol@busy.example"):
    item = queue.enqueue(newsletter(to=to, subject="Being delivered"))
    lease(item, "worker-on-host-1")
    return queue.get(item.id)


def user_with(*codenames, staff=True, username="operator"):
    user = User.objects.create_user(username, is_staff=staff)  # no password: no hashing, force_login
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="bumail_queue", codename=codename))
    return user


@pytest.fixture
def superuser_client(client):
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    return client


def client_for(user):
    client = Client()
    client.force_login(user)
    return client


def text_of(response):
    return unescape(response.content.decode())


def messages_of(response):
    return [str(m) for m in response.context["messages"]] if response.context else []


# -- the list -------------------------------------------------------------------------------


def test_the_list_shows_each_item_with_its_recipients_and_state(superuser_client, store_name):
    fresh = queue.enqueue(newsletter(to=["alice@example.org", "ann@example.net"], subject="Fresh"))
    deferred = deferred_item()
    leased = leased_item()
    response = superuser_client.get(LIST)
    assert response.status_code == 200
    page = text_of(response)
    for item in (fresh, deferred, leased):
        assert item_url(item.id) in page
    assert "Fresh" in page and "Deferred one" in page and "Being delivered" in page
    assert "alice@example.org" in page and "ann@example.net" in page
    assert "451 4.7.1 Greylisted" in page  # the reply that deferred bob
    assert "worker-on-host-1" in page  # who is delivering the leased one
    row = re.search(rf'<tr data-item-id="{deferred.id}">(.*?)</tr>', page, re.S).group(1)
    assert ">Deferred<" in row and 'class="field-attempts">1<' in row
    assert footer_of(page) == "3 items in the queue"
    assert response["Content-Security-Policy"].startswith("default-src 'self'")


def footer_of(page):
    """The count under the list, as a person reads it (tags and runs of spaces gone)."""
    paginator = re.search(r'<p class="paginator bq-paginator">(.*?)</p>', page, re.S).group(1)
    count = re.search(r'<span class="bq-muted">(.*?)</span>', paginator, re.S).group(1)
    return " ".join(count.split())


def test_the_list_says_how_many_items_are_in_the_queue_in_words(superuser_client, store_name):
    deferred_item("bob@slow.example")
    assert footer_of(text_of(superuser_client.get(LIST))) == "1 item in the queue"
    deferred_item("dan@slow.example")
    assert footer_of(text_of(superuser_client.get(LIST))) == "2 items in the queue"


def test_a_count_prints_as_its_number_wherever_it_is_shown():
    import json

    from bumail_queue.queries import ItemCount

    count = ItemCount(1200, exact=False)
    logged = "%s" % count  # noqa: UP031 - as a log line formats it
    shown = (str(count), f"{count}", f"{count:,}", format(count, "d"), logged, json.dumps({"n": count}))
    assert shown == ("1200", "1200", "1,200", "1200", "1200", '{"n": 1200}')
    assert repr(count) == "ItemCount(1200, exact=False)"  # only the repr names the class


@pytest.mark.postgres
def test_on_postgresql_a_large_queue_is_said_to_hold_about_its_estimate(superuser_client, settings):
    from django.db import transaction

    settings.BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com"}
    queue.enqueue(newsletter())
    # The planner's figure for a table of 1.2 million rows, rolled back with the block so
    # that no later test reads it.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("UPDATE pg_class SET reltuples = 1200000 WHERE relname = 'bumail_queue_items'")
        page = text_of(superuser_client.get(LIST))
        transaction.set_rollback(True)
    assert footer_of(page) == "about 1,200,000 items in the queue"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"state": "queued"}, {"fresh"}),
        ({"state": "deferred"}, {"deferred"}),
        ({"state": "delivering"}, {"leased"}),
        ({"domain": "SLOW.example"}, {"deferred"}),
        ({"q": "bob@slow"}, {"deferred"}),
        ({"q": "news@example.com"}, {"fresh", "deferred", "leased"}),
        ({"q": "Being delivered"}, {"leased"}),  # the subject: the ORM and memory stores only
        ({"q": "nothing matches this"}, set()),
        ({"state": "deferred", "q": "alice"}, set()),
    ],
)
def test_the_list_filters_and_searches(superuser_client, store_name, params, expected):
    items = {"fresh": queue.enqueue(newsletter(subject="Fresh")), "deferred": deferred_item(), "leased": leased_item()}
    page = text_of(superuser_client.get(LIST, params))
    shown = {name for name, item in items.items() if f'data-item-id="{item.id}"' in page}
    if store_name == "redis" and params == {"q": "Being delivered"}:
        expected = set()  # the Redis store does not look in the message's headers
    assert shown == expected
    if not expected:
        assert "No queued item matches." in page


def test_the_list_filters_by_channel_and_priority(superuser_client, store_name):
    plain = queue.enqueue(newsletter(subject="Plain"))
    weekly = queue.enqueue(newsletter(subject="Weekly"), channel="newsletter", priority=-5)
    digest = queue.enqueue(newsletter(subject="Digest"), channel="newsletter")
    alert = queue.enqueue(newsletter(subject="Alert"), channel="alerts", priority=50)
    items = {"plain": plain, "weekly": weekly, "digest": digest, "alert": alert}

    def shown(**params):
        page = text_of(superuser_client.get(LIST, params))
        return {name for name, item in items.items() if f'data-item-id="{item.id}"' in page}

    assert shown() == set(items)
    assert shown(channel="newsletter") == {"weekly", "digest"}
    assert shown(priority="-5") == {"weekly"}
    assert shown(channel="newsletter", priority="0") == {"digest"}
    assert shown(channel="alerts", priority="-5") == set()
    # A value no item can have is no filter.
    assert shown(channel="not a channel", priority="1000") == set(items)

    page = text_of(superuser_client.get(LIST, {"channel": "newsletter"}))

    def choices(title):
        block = re.search(rf'data-filter-title="{title}" open>(.*?)</details>', page, re.S).group(1)
        return re.findall(r'<li( class="selected")?><a href="\?([^"]*)">([^<]+)</a>', block)

    assert choices("channel") == [
        ("", "", "All"),
        ("", "channel=alerts", "alerts"),
        ("", "channel=default", "default"),
        (' class="selected"', "channel=newsletter", "newsletter"),
    ]
    assert choices("priority") == [
        (' class="selected"', "channel=newsletter", "All"),
        ("", "channel=newsletter&priority=50", "50"),
        ("", "channel=newsletter&priority=0", "0"),
        ("", "channel=newsletter&priority=-5", "-5"),
    ]
    row = re.search(rf'<tr data-item-id="{weekly.id}">(.*?)</tr>', page, re.S).group(1)
    assert "newsletter · -5" in row
    plain_page = text_of(superuser_client.get(LIST, {"channel": "default"}))
    row = re.search(rf'<tr data-item-id="{plain.id}">(.*?)</tr>', plain_page, re.S).group(1)
    assert "bq-lane" not in row  # the default channel at the default priority says nothing

    item_page = text_of(superuser_client.get(item_url(alert.id)))
    assert re.search(r"Channel</th><td><a [^>]*>alerts</a>", item_page)
    assert "Priority</th><td>50 " in item_page


def test_search_by_id_finds_the_item(superuser_client, store_name):
    wanted = queue.enqueue(newsletter())
    queue.enqueue(newsletter())
    page = text_of(superuser_client.get(LIST, {"q": wanted.id}))
    assert page.count("data-item-id=") == 1
    assert f'data-item-id="{wanted.id}"' in page


def test_the_list_pages_without_counting(superuser_client, store_name, monkeypatch):
    monkeypatch.setattr(ItemAdmin, "list_per_page", 2)
    ids = [
        queue.enqueue(newsletter(to=f"u{n}@example.org"), at=timezone.now() + timedelta(minutes=n)).id for n in range(5)
    ]
    first = text_of(superuser_client.get(LIST))
    assert [i for i in ids if i in first] == ids[:2]
    assert 'rel="next"' in first and 'rel="prev"' not in first
    third = text_of(superuser_client.get(LIST, {"p": 3}))
    assert [i for i in ids if i in third] == ids[4:]
    assert 'rel="next"' not in third and 'rel="prev"' in third
    assert superuser_client.get(LIST, {"p": "x"}).status_code == 200


def test_the_list_costs_the_same_queries_for_3_items_or_30(superuser_client, settings):
    settings.BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com"}  # the ORM store
    superuser_client.get(LIST)  # a first request warms the session and the content types

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert superuser_client.get(LIST).status_code == 200
        return len(captured)

    for n in range(3):
        queue.enqueue(newsletter(to=f"few{n}@example.org"))
    few = queries()
    queue.enqueue_many([newsletter(to=f"many{n}@example.org") for n in range(27)])
    assert queries() == few


def test_the_list_query_count_is_fixed(superuser_client, settings, django_assert_num_queries):
    settings.BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com"}
    queue.enqueue_many([newsletter(to=f"r{n}@example.org") for n in range(20)])
    superuser_client.get(LIST)
    # The session, the user, the page of items, their messages' heads, the lanes (the
    # filters' channels and priorities), the count (on PostgreSQL, the planner's
    # estimate first: it is counted only while small).
    with django_assert_num_queries(7 if connection.vendor == "postgresql" else 6):
        superuser_client.get(LIST)


# -- the item page --------------------------------------------------------------------------


def test_the_item_page_shows_every_field_the_message_and_its_history(superuser_client, store_name):
    item = deferred_item()
    response = superuser_client.get(item_url(item.id))
    assert response.status_code == 200
    page = text_of(response)
    assert item.id in page and "news@example.com" in page
    recipients = re.search(r'<div class="module bq-section" id="bq-recipients">(.*?)</div>', page, re.S).group(1)
    assert "bob@slow.example" in recipients and ">deferred<" in recipients
    assert "451 4.7.1 Greylisted, try again later" in recipients
    assert "mx1.slow.example" in recipients
    assert "Subject" in page and "Deferred one" in page  # the headers
    assert "Hello in plain text." in page  # the text body
    assert "report.csv" in page and "text/csv" in page  # the attachment
    history = re.search(r'id="bq-history">(.*?)</div>', page, re.S).group(1)
    assert "Greylisted" in history and "mx1.slow.example" in history
    assert "<form" not in page.split('id="bq-html"')[1].split("</iframe>")[0]


def test_the_html_body_is_sanitised_and_framed_without_scripts(superuser_client, store_name):
    item = queue.enqueue(newsletter())
    response = superuser_client.get(item_url(item.id))
    raw = response.content.decode()
    frame = re.search(r"<iframe ([^>]*)>", raw).group(1)
    assert 'sandbox=""' in frame  # no scripts, no same origin, no forms, no popups
    srcdoc = unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1))
    assert "<h1>Hello</h1>" in srcdoc
    assert "Content-Security-Policy" in srcdoc and "default-src 'none'" in srcdoc
    for dangerous in ("<script", "onclick", "javascript:", "pwned", "steal()"):
        assert dangerous not in srcdoc
    # A remote image stays in the markup but the frame's policy loads nothing remote.
    assert "img-src data:" in srcdoc
    assert "<script>document.title" not in raw


def test_the_eml_download_is_the_message_as_queued(superuser_client, store_name):
    item = queue.enqueue(newsletter())
    response = superuser_client.get(reverse("admin:bumail_queue_item_eml", args=[item.id]))
    assert response.status_code == 200
    assert response["Content-Type"] == "message/rfc822"
    assert response["Content-Disposition"] == f'attachment; filename="{item.id}.eml"'
    assert response.content == get_store().read_message(item.id)


def test_an_item_that_left_the_queue_shows_its_history(superuser_client, store_name):
    item = queue.enqueue(newsletter(to="dave@example.org"))
    queue.cancel(item.id)
    page = text_of(superuser_client.get(item_url(item.id)))
    assert "no longer in the queue" in page
    assert "dave@example.org" in page and "cancelled" in page


@pytest.mark.parametrize("item_id", ["00000000-0000-4000-8000-000000000000", "not-an-id"])
def test_an_unknown_item_is_404(superuser_client, store_name, item_id):
    assert superuser_client.get(item_url(item_id)).status_code == 404
    assert superuser_client.get(reverse("admin:bumail_queue_item_eml", args=[item_id])).status_code == 404


def test_the_bare_item_url_redirects_to_its_page(superuser_client, store_name):
    item = queue.enqueue(newsletter())
    response = superuser_client.get(reverse("admin:bumail_queue_item_item", args=[item.id]))
    assert response.status_code == 302 and response["Location"] == item_url(item.id)


# -- the actions ----------------------------------------------------------------------------


def post_action(client, action, ids, **extra):
    return client.post(LIST, {"action": action, "_selected_action": ids, **extra}, follow=True)


def test_retry_now_makes_items_due_and_says_what_it_did(superuser_client, store_name):
    deferred = deferred_item()
    leased = leased_item()
    gone = queue.enqueue(newsletter())
    queue.cancel(gone.id)
    before = timezone.now()
    response = post_action(superuser_client, "retry_now", [deferred.id, leased.id, gone.id])
    assert messages_of(response) == ["1 item retried; 1 was no longer queued; 1 was being delivered, left alone."]
    assert queue.get(deferred.id).next_attempt_at <= timezone.now()
    assert queue.get(deferred.id).next_attempt_at >= before
    assert queue.get(leased.id).lease_owner == "worker-on-host-1"


def test_retry_from_the_item_page_goes_back_to_it(superuser_client, store_name):
    item = deferred_item()
    response = superuser_client.post(
        LIST, {"action": "retry_now", "_selected_action": item.id, "next": item_url(item.id)}
    )
    assert response.status_code == 302 and response["Location"] == item_url(item.id)
    # Never to another site.
    response = superuser_client.post(
        LIST, {"action": "retry_now", "_selected_action": item.id, "next": "https://evil.example/"}
    )
    assert response["Location"] == LIST


def test_cancel_asks_first_then_cancels_and_logs(superuser_client, store_name):
    one = queue.enqueue(newsletter(to="erin@example.org", subject="Cancel me"))
    two = deferred_item()
    confirm = superuser_client.post(LIST, {"action": "cancel", "_selected_action": [one.id, two.id]})
    assert confirm.status_code == 200
    page = text_of(confirm)
    assert "Cancel these 2 items?" in page and "Cancel me" in page
    assert queue.get(one.id) is not None  # nothing done yet
    done = post_action(superuser_client, "cancel", [one.id, two.id], confirm="yes")
    assert messages_of(done) == ["2 items cancelled."]
    assert queue.get(one.id) is None and queue.get(two.id) is None
    cancelled = set(DeliveryLog.objects.filter(status="cancelled").values_list("recipient", flat=True))
    assert cancelled == {"erin@example.org", "bob@slow.example"}
    again = post_action(superuser_client, "cancel", [one.id], confirm="yes")
    assert messages_of(again) == ["0 items cancelled; 1 was no longer queued."]


def test_cancel_warns_about_an_item_being_delivered(superuser_client, store_name):
    item = leased_item()
    page = text_of(superuser_client.post(LIST, {"action": "cancel", "_selected_action": [item.id]}))
    assert "being delivered right now" in page


def test_an_action_without_items_or_with_an_unknown_name_does_nothing(superuser_client, store_name):
    item = queue.enqueue(newsletter())
    assert messages_of(post_action(superuser_client, "retry_now", [])) == ["Select the items to act on first."]
    assert messages_of(post_action(superuser_client, "delete_everything", [item.id])) == ["Choose an action."]
    assert queue.get(item.id) is not None


# -- permissions and security ---------------------------------------------------------------


def test_a_staff_user_without_the_change_permission_cannot_retry(store_name):
    item = deferred_item()
    client = client_for(user_with("view_item", "delete_item"))
    page = text_of(client.get(item_url(item.id)))
    assert 'id="bq-retry"' not in page and 'id="bq-cancel"' in page
    assert 'value="retry_now"' not in text_of(client.get(LIST))
    response = client.post(LIST, {"action": "retry_now", "_selected_action": item.id})
    assert response.status_code == 403
    assert queue.get(item.id).next_attempt_at == item.next_attempt_at


def test_a_staff_user_without_the_delete_permission_cannot_cancel(store_name):
    item = queue.enqueue(newsletter())
    client = client_for(user_with("view_item", "change_item"))
    assert 'id="bq-cancel"' not in text_of(client.get(item_url(item.id)))
    assert client.post(LIST, {"action": "cancel", "_selected_action": item.id}).status_code == 403
    assert client.post(LIST, {"action": "cancel", "_selected_action": item.id, "confirm": "yes"}).status_code == 403
    assert queue.get(item.id) is not None


def test_a_staff_user_without_the_view_permission_sees_nothing(store_name):
    item = queue.enqueue(newsletter())
    client = client_for(user_with("view_deliverylog"))
    for url in (LIST, OVERVIEW, item_url(item.id), reverse("admin:bumail_queue_item_eml", args=[item.id])):
        assert client.get(url).status_code == 403, url


def test_someone_not_staff_is_sent_to_the_login_page(store_name):
    item = queue.enqueue(newsletter())
    client = client_for(user_with("view_item", "change_item", "delete_item", staff=False))
    for url in (LIST, OVERVIEW, item_url(item.id)):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    response = client.post(LIST, {"action": "cancel", "_selected_action": item.id, "confirm": "yes"})
    assert response.status_code == 302 and queue.get(item.id) is not None


def test_actions_need_the_csrf_token(store_name):
    item = queue.enqueue(newsletter())
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    response = client.post(LIST, {"action": "cancel", "_selected_action": item.id, "confirm": "yes"})
    assert response.status_code == 403
    assert queue.get(item.id) is not None


def test_no_page_shows_the_smarthost_password(superuser_client, store_name):
    item = deferred_item()
    queue.enqueue(newsletter())
    urls = [
        LIST,
        OVERVIEW,
        item_url(item.id),
        LOG,
        reverse("admin:index"),
        reverse("admin:app_list", args=["bumail_queue"]),
    ]
    urls.append(reverse("admin:bumail_queue_deliverylog_change", args=[DeliveryLog.objects.first().pk]))
    for url in urls:
        response = superuser_client.get(url)
        assert response.status_code == 200, url
        assert SMARTHOST_PASSWORD not in response.content.decode(), url
    confirm = superuser_client.post(LIST, {"action": "cancel", "_selected_action": item.id})
    assert SMARTHOST_PASSWORD not in confirm.content.decode()


def test_there_is_no_add_page_and_no_edit(superuser_client, store_name):
    item = queue.enqueue(newsletter())
    assert superuser_client.get(LIST + "add/").status_code in (302, 404)  # the redirect of an unknown id
    page = text_of(superuser_client.get(item_url(item.id)))
    for editable in ('type="text"', "<textarea", "<select", 'name="_save"'):
        assert editable not in page  # every field is read-only
    index = text_of(superuser_client.get(reverse("admin:index")))
    assert "Queued items" in index and "Delivery log" in index
    assert reverse("admin:bumail_queue_deliverylog_add") not in index


# -- the overview ---------------------------------------------------------------------------


def test_held_items_are_counted_on_the_overview_and_listed_by_their_state(superuser_client, store_name):
    held = queue.enqueue(newsletter(to=["a@slow.example"]))
    free = queue.enqueue(newsletter(to=["b@fast.example"]))
    assert queue.hold(BulkFilter(domain="slow.example")).count == 1
    page = text_of(superuser_client.get(OVERVIEW))
    counts = dict(re.findall(r'data-state="(\w+)"><a href="[^"]*"><span class="bq-number">(\d+)<', page))
    assert counts == {"queued": "1", "deferred": "0", "delivering": "0", "held": "1"}
    listed = text_of(superuser_client.get(LIST, {"state": "held"}))
    assert f'data-item-id="{held.id}"' in listed and f'data-item-id="{free.id}"' not in listed
    assert "Held" in listed


def test_the_overview_counts_states_and_draws_the_shape(superuser_client, store_name):
    queue.enqueue(newsletter(to=["a@fast.example", "b@slow.example"]))
    deferred_item()
    leased_item()
    response = superuser_client.get(OVERVIEW)
    assert response.status_code == 200
    page = text_of(response)
    counts = dict(re.findall(r'data-state="(\w+)"><a href="[^"]*"><span class="bq-number">(\d+)<', page))
    assert counts == {"queued": "1", "deferred": "1", "delivering": "1", "held": "0"}
    shape = dict(
        re.findall(
            r'<tr data-domain="([^"]+)">\s*<th scope="row"><a href="[^"]*">[^<]*</a></th>\s*<td>(\d+)</td>', page
        )
    )
    assert shape == {"slow.example": "2", "fast.example": "1", "busy.example": "1"}
    assert "<svg" in page and "5-10m" in page and "1280m+" in page
    assert 'id="bq-last-day"' in page  # the log's last 24 hours
    assert f"{LIST}?domain=slow.example" in page


def test_the_overview_of_an_empty_queue(superuser_client, store_name):
    page = text_of(superuser_client.get(OVERVIEW))
    assert "No recipient is pending." in page


# -- the delivery log -----------------------------------------------------------------------


def test_the_delivery_log_lists_searches_and_is_read_only(superuser_client, store_name):
    item = deferred_item()
    other = queue.enqueue(newsletter(to="zed@example.org"))
    queue.cancel(other.id)
    listed = superuser_client.get(LOG)
    page = text_of(listed)
    assert "bob@slow.example" in page and "zed@example.org" in page
    assert listed["Content-Security-Policy"].startswith("default-src 'self'; script-src 'self'")
    assert "451 4.7.1 Greylisted, try again later" in page
    by_item = text_of(superuser_client.get(LOG, {"q": item.id}))
    assert "bob@slow.example" in by_item and "zed@example.org" not in by_item
    by_address = text_of(superuser_client.get(LOG, {"q": "zed@"}))
    assert "zed@example.org" in by_address and "bob@slow.example" not in by_address
    assert superuser_client.get(LOG, {"status": "cancelled"}).status_code == 200
    entry = DeliveryLog.objects.get(recipient="zed@example.org")
    change = superuser_client.get(reverse("admin:bumail_queue_deliverylog_change", args=[entry.pk]))
    assert change.status_code == 200 and 'name="_save"' not in change.content.decode()
    assert change["Content-Security-Policy"] == PAGE_CSP
    history = superuser_client.get(reverse("admin:bumail_queue_deliverylog_history", args=[entry.pk]))
    assert (history.status_code, history["X-Content-Type-Options"]) == (200, "nosniff")
    assert superuser_client.post(reverse("admin:bumail_queue_deliverylog_delete", args=[entry.pk])).status_code == 403


@pytest.mark.postgres
def test_on_postgresql_a_large_table_is_never_counted(superuser_client, settings, monkeypatch):
    """Above EXACT_COUNT_BELOW rows, the list and the log read the planner's estimate."""
    from bumail_queue import estimates
    from bumail_queue.admin import EstimatedCountPaginator

    settings.BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com"}
    queue.enqueue_many([newsletter(to=f"r{n}@example.org") for n in range(3)])
    for item in queue.list():
        queue.cancel(item.id)  # three log entries
    queue.enqueue_many([newsletter(to=f"s{n}@example.org") for n in range(4)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE bumail_queue_items")
        cursor.execute("ANALYZE bumail_queue_delivery_log")
    monkeypatch.setattr(estimates, "EXACT_COUNT_BELOW", 1)
    with CaptureQueriesContext(connection) as captured:
        page = text_of(superuser_client.get(LIST))
    assert not any("COUNT(" in q["sql"].upper() for q in captured.captured_queries)
    assert footer_of(page) == "about 4 items in the queue"
    assert EstimatedCountPaginator(DeliveryLog.objects.all(), 100).count == 3
    assert EstimatedCountPaginator(DeliveryLog.objects.filter(status="cancelled"), 100).count == 3  # counted


def test_the_log_and_the_item_history_say_whether_tls_was_used(superuser_client, store_name):
    item = queue.enqueue(newsletter(to="tls@example.org"))
    for recipient, tls in (("tls@example.org", True), ("plain@example.org", False)):
        delivery_log.record(
            item_id=item.id, recipient=recipient, status="deferred", remote_host=f"mx.{recipient[:3]}.example", tls=tls
        )

    def words_of(response):
        return " ".join(re.sub(r"<[^>]+>", " ", text_of(response)).split())

    page = words_of(superuser_client.get(LOG))
    assert "mx.tls.example TLS" in page and "mx.pla.example no TLS" in page
    history = words_of(superuser_client.get(item_url(item.id)))
    assert "mx.tls.example TLS" in history and "mx.pla.example no TLS" in history


# -- wording ------------------------------------------------------------------------------


def test_the_delivery_log_footer_counts_entries(superuser_client, store_name):
    deferred_item()
    page = text_of(superuser_client.get(LOG))
    assert "1 delivery log entry" in page
    assert "Delivery log entries" in text_of(superuser_client.get(reverse("admin:index")))


def test_the_cancel_page_of_one_item_speaks_of_one(superuser_client, store_name):
    item = queue.enqueue(newsletter(to="erin@example.org", subject="Cancel me"))
    page = text_of(superuser_client.post(LIST, {"action": "cancel", "_selected_action": [item.id]}))
    assert "Cancel this item?" in page
    assert "these" not in page


def test_an_item_queued_seconds_ago_is_under_a_minute_old(superuser_client, store_name):
    item = queue.enqueue(newsletter(to="erin@example.org"))
    assert "(under a minute ago)" in text_of(superuser_client.get(item_url(item.id)))
    assert "0 minutes" not in text_of(superuser_client.get(LIST))


# -- layout -------------------------------------------------------------------------------


def test_a_long_subject_is_cut_in_the_list_and_whole_in_its_title(superuser_client, store_name):
    subject = "Your monthly statement is ready: " + "fourteen transactions and two refunds, " * 4
    item = queue.enqueue(newsletter(subject=subject.strip()))
    page = text_of(superuser_client.get(LIST))
    link = re.search(r'<a href="[^"]*' + item.id + r'[^"]*" class="bq-clamp" title="([^"]*)">([^<]*)</a>', page)
    assert link is not None
    assert unescape(link.group(1)) == subject.strip()
    assert len(unescape(link.group(2))) == 80 and link.group(2).endswith("…")
    assert f'title="{item.id}">{item.id[:8]}…</div>' in page
    for column in ("subject", "sender", "recipients", "state", "attempts", "next", "age"):
        assert f'class="column-{column}"' in page
    assert "bumail_queue/admin.css" in text_of(superuser_client.get(LOG))
