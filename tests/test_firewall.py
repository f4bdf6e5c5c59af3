"""The staging firewall: its patterns, its settings and check, what every enqueue path
adds on every store for recipients it does not allow, and the admin's marks."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.core import checks
from django.core.mail import EmailMessage, send_mail, send_mass_mail
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from django_redis import get_redis_connection

from bumail_queue import queue
from bumail_queue.checks import check_firewall_in_debug, check_settings
from bumail_queue.conf import get_settings, load
from bumail_queue.errors import QueueConfigurationError
from bumail_queue.firewall import (
    ORIGINAL_RECIPIENTS_FIELD,
    Firewall,
    original_recipients,
    original_recipients_field,
    parse_pattern,
    pattern_problem,
    with_original_recipients,
)
from bumail_queue.outcomes import store_enqueue
from bumail_queue.queries import HELD_AT, ItemState, state_of
from bumail_queue.screening import firewall_mark
from bumail_queue.stores import get_store
from tests.conftest import REDIS_ALIAS
from tests.helpers import smarthost, use_queue_backend

pytestmark = pytest.mark.django_db(transaction=True)

ALLOW = ["example.com", "*.example.org", "qa+*@example.net", "ann@example.com", "bücher.example"]
SINK = {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": 1025, "TLS": "none"}

# -- the patterns ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("bob@example.com", True),
        ("Bob@EXAMPLE.COM", True),
        ("bob@example.com.", True),
        ("bob@mail.example.com", False),  # a bare domain is that domain alone
        ("bob@example.com.evil.test", False),
        ("bob@a.example.org", True),
        ("bob@a.b.example.org", True),
        ("bob@example.org", False),  # *.example.org: its subdomains
        ("bob@notexample.org", False),
        ("qa+1@example.net", True),
        ("QA+run-7@Example.NET", True),
        ("qa@example.net", False),
        ("ann@example.net", False),
        ("ann@example.com", True),
        ("jörg@bücher.example", True),
        ("jörg@xn--bcher-kva.example", True),  # the same domain in A-labels
        ("jörg@BÜCHER.example", True),
        ("jörg@buecher.example", False),
        ("no-at-sign", False),
    ],
)
def test_a_recipient_is_allowed_by_a_domain_or_address_pattern(address, allowed):
    assert Firewall.of(ALLOW).allows(address) is allowed


def test_a_pattern_in_a_labels_allows_the_unicode_form_too():
    assert Firewall.of(["*@xn--bcher-kva.example"]).allows("ann@bücher.example")
    assert Firewall.of(["*.bücher.example"]).allows("ann@mail.xn--bcher-kva.example")


def test_no_pattern_allows_nothing_and_a_star_everything():
    assert not Firewall.of([]).allows("ann@example.com")
    assert Firewall.of(["*"]).allows("ann@example.com")
    assert Firewall.of(["*"]).split(["a@x.example", "b@y.example"]) == (["a@x.example", "b@y.example"], [])


@pytest.mark.parametrize("bad", ["", "  ", "@example.com", "a b@example.com", "ann@", "exa mple.com", "a..b", None, 7])
def test_what_is_no_pattern_is_said(bad):
    assert pattern_problem(bad) is not None
    if isinstance(bad, str):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            parse_pattern(bad)


def test_split_keeps_the_order_of_each_part():
    firewall = Firewall.of(["example.com"])
    assert firewall.split(["a@x.test", "b@example.com", "c@y.test", "d@example.com"]) == (
        ["b@example.com", "d@example.com"],
        ["a@x.test", "c@y.test"],
    )


# -- the original recipients' field -------------------------------------------------------------


def test_the_original_recipients_field_is_folded_ascii_and_reads_back():
    addresses = ["jörg@bücher.example", "ünï@example.test"] + [f"user{n}@example.org" for n in range(12)]
    field = original_recipients_field(addresses)
    lines = field.split(b"\r\n")
    assert lines[-1] == b"" and field.endswith(b"\r\n")
    assert lines[0].startswith(ORIGINAL_RECIPIENTS_FIELD.encode() + b": ")
    assert all(len(line) <= 78 for line in lines) and len(lines) > 3
    assert all(line.startswith(b" ") for line in lines[1:-1])  # folded: continuation lines
    assert field.isascii()
    assert b"xn--bcher-kva" in field  # the domain in A-labels
    assert original_recipients(field + b"\r\n") == ["jörg@xn--bcher-kva.example", "ünï@example.test", *addresses[2:]]


def test_the_field_goes_on_top_with_the_message_s_line_ends_in_place_of_any_given():
    message = b"X-Bumail-Original-Recipients: forged@example.test,\n other@example.test\nSubject: Hi\n\nBody\n"
    marked = with_original_recipients(message, ["a@x.test"])
    assert marked == b"X-Bumail-Original-Recipients: a@x.test\nSubject: Hi\n\nBody\n"
    crlf = b"Subject: Hi\r\n\r\nX-Bumail-Original-Recipients: in the body\r\n"
    assert with_original_recipients(crlf, ["a@x.test"]) == b"X-Bumail-Original-Recipients: a@x.test\r\n" + crlf
    assert original_recipients(b"Subject: Hi\r\n\r\nX-Bumail-Original-Recipients: a@x.test\r\n") is None


# -- the settings and the checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"ALLOW_RECIPIENTS": "example.com"}, "must be None or a list"),
        ({"ALLOW_RECIPIENTS": ["example.com", "a b@example.com"]}, "holds 'a b@example.com'"),
        ({"ALLOW_RECIPIENTS": [None]}, "holds None"),
        ({"ALLOW_RECIPIENTS": [], "REDIRECT_TO": "not an address"}, "REDIRECT_TO'] must be an address"),
        ({"ALLOW_RECIPIENTS": [], "REDIRECT_TO": ["a@example.com"]}, "REDIRECT_TO'] must be an address"),
        ({"REDIRECT_TO": "staging@example.com"}, "ALLOW_RECIPIENTS is not set"),
    ],
)
def test_bad_firewall_settings_are_e035(raw, words):
    with override_settings(BUMAIL_QUEUE=raw):
        (error,) = check_settings(None)
    assert (type(error), error.id) == (checks.Error, "bumail_queue.E035")
    assert words in error.msg
    with pytest.raises(QueueConfigurationError, match="E035"):
        load(raw)


def test_the_firewall_settings_load_typed():
    assert load({}).firewall is None
    firewall = load({"ALLOW_RECIPIENTS": ("example.com",), "REDIRECT_TO": "staging@example.com"}).firewall
    assert firewall is not None and firewall.redirect_to == "staging@example.com"
    assert [p.text for p in firewall.patterns] == ["example.com"]
    assert [p.text for p in load({"ALLOW_RECIPIENTS": {"b.example", "a.example"}}).firewall.patterns] == [
        "a.example",
        "b.example",
    ]


def test_debug_without_a_firewall_is_w009():
    with override_settings(DEBUG=True, BUMAIL_QUEUE={}):
        (warning,) = check_firewall_in_debug()
    assert (type(warning), warning.id) == (checks.Warning, "bumail_queue.W009")
    assert warning.msg.startswith("DEBUG is on and mail goes to every recipient")
    assert "ALLOW_RECIPIENTS" in warning.hint
    with override_settings(DEBUG=True, BUMAIL_QUEUE={"ROUTE": {**SINK, "HOST": "smtp.example.com"}}):
        assert [w.id for w in check_firewall_in_debug()] == ["bumail_queue.W009"]
    with override_settings(DEBUG=False, BUMAIL_QUEUE={}):
        assert check_firewall_in_debug() == []
    with override_settings(DEBUG=True, BUMAIL_QUEUE={"ALLOW_RECIPIENTS": ["example.com"]}):
        assert check_firewall_in_debug() == []
    with override_settings(DEBUG=True, BUMAIL_QUEUE={"ALLOW_RECIPIENTS": []}):
        assert check_firewall_in_debug() == []


def test_debug_with_every_route_to_a_local_sink_is_no_w009():
    with override_settings(DEBUG=True, BUMAIL_QUEUE={"ROUTE": SINK, "ROUTES": {"a.example": {**SINK, "HOST": "::1"}}}):
        assert check_firewall_in_debug() == []
    with override_settings(DEBUG=True, BUMAIL_QUEUE={"ROUTE": SINK, "ROUTES": {"a.example": {"TYPE": "mx"}}}):
        assert [w.id for w in check_firewall_in_debug()] == ["bumail_queue.W009"]


def test_manage_py_check_reports_w009_with_debug_on():
    err = StringIO()
    with override_settings(DEBUG=True, BUMAIL_QUEUE={}):
        call_command("check", stdout=StringIO(), stderr=err)
    assert "(bumail_queue.W009) DEBUG is on and mail goes to every recipient" in err.getvalue()


# -- every enqueue path, on every store -----------------------------------------------------------


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    return request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}


def firewalled(store_settings, **extra):
    return override_settings(
        BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store_settings, "ALLOW_RECIPIENTS": ALLOW, **extra}
    )


def claimable_ids(now=None):
    now = now or timezone.now()
    claimed = get_store().claim(owner="w", now=now, lease_until=now + timedelta(minutes=1), limit=100)
    return {item.id for item in claimed}


def all_items():
    return {tuple(r.address for r in item.recipients): item for item in queue.list()}


def test_send_mail_queues_the_allowed_recipients_and_holds_the_others(store_settings):
    with firewalled(store_settings), use_queue_backend():
        assert send_mail("Hi", "Hello.", "app@example.com", ["ann@example.com", "cust@gmail.test", "x@a.example.org"])
        items = all_items()
        assert set(items) == {("ann@example.com", "x@a.example.org"), ("cust@gmail.test",)}
        allowed, held = items[("ann@example.com", "x@a.example.org")], items[("cust@gmail.test",)]
        now = timezone.now()
        assert state_of(allowed, now) == ItemState.QUEUED and state_of(held, now) == ItemState.HELD
        assert held.next_attempt_at == HELD_AT
        assert queue.read_message(allowed.id) == queue.read_message(held.id)  # the same message, untouched
        assert ORIGINAL_RECIPIENTS_FIELD.encode() not in queue.read_message(held.id)
        assert claimable_ids() == {allowed.id}
        # Never claimed while held (the allowed item's lease has ended by then).
        assert claimable_ids(now + timedelta(days=3650)) == {allowed.id}
        assert [i.id for i in queue.search(state=ItemState.HELD)] == [held.id]
        out = StringIO()
        call_command("queue_release", "--recipient", "*@gmail.test", stdout=out)
        assert out.getvalue().startswith("1 item released.")
        assert claimable_ids() == {held.id}


def test_an_enqueue_returns_the_allowed_recipients_item_and_a_key_finds_both(store_settings):
    message = EmailMessage("Hi", "Hello.", "app@example.com", ["ann@example.com"], bcc=["boss@elsewhere.test"])
    with firewalled(store_settings):
        first = queue.enqueue(message, key="order-1")
        again = queue.enqueue(message, key="order-1")
        assert [r.address for r in first.recipients] == ["ann@example.com"]
        assert again.id == first.id and queue.count() == 2  # the held part is not queued twice
        only_held = queue.enqueue(EmailMessage("Hi", "Hello.", "app@example.com", ["cust@gmail.test"]), key="k" * 255)
        assert only_held.next_attempt_at == HELD_AT and queue.get(only_held.id).key == "k" * 255
        assert queue.count() == 3


def test_enqueue_many_and_send_mass_mail_return_one_item_per_message(store_settings):
    with firewalled(store_settings), use_queue_backend():
        sent = send_mass_mail([
            ("One", "Hi.", "app@example.com", ["ann@example.com", "a@out.test"]),
            ("Two", "Hi.", "app@example.com", ["b@out.test"]),
            ("Three", "Hi.", "app@example.com", ["qa+3@example.net"]),
        ])  # fmt: skip
        assert sent == 3
        items = queue.enqueue_many([
            EmailMessage("Four", "Hi.", "app@example.com", ["c@out.test", "x@example.com"]),
            EmailMessage("Five", "Hi.", "app@example.com", ["d@out.test"]),
        ])  # fmt: skip
        assert [[r.address for r in item.recipients] for item in items] == [["x@example.com"], ["d@out.test"]]
        assert [item.next_attempt_at == HELD_AT for item in items] == [False, True]
        held = {r.address for item in queue.search(state=ItemState.HELD) for r in item.recipients}
        assert held == {"a@out.test", "b@out.test", "c@out.test", "d@out.test"}
        assert queue.count() == 7


def test_aenqueue_goes_through_the_firewall(store_settings):
    with firewalled(store_settings):
        item = async_to_sync(queue.aenqueue)(EmailMessage("Hi", "Hi.", "app@example.com", ["cust@gmail.test"]))
        assert state_of(queue.get(item.id), timezone.now()) == ItemState.HELD
        assert claimable_ids() == set()


def test_redirect_sends_the_others_to_redirect_to_with_their_addresses_in_a_field(store_settings):
    with firewalled(store_settings, REDIRECT_TO="staging@example.com"), use_queue_backend():
        message = EmailMessage("Hi", "Hello.", "app@example.com", ["ann@example.com", "c1@gmail.test"])
        message.bcc = ["c2@bücher.test"]
        message.send()
        items = all_items()
        assert set(items) == {("ann@example.com",), ("staging@example.com",)}
        allowed, redirected = items[("ann@example.com",)], items[("staging@example.com",)]
        assert claimable_ids() == {allowed.id, redirected.id}
        data = queue.read_message(redirected.id)
        assert data.startswith(b"X-Bumail-Original-Recipients: c1@gmail.test, c2@xn--bcher-kva.test\r\n")
        assert original_recipients(data) == ["c1@gmail.test", "c2@xn--bcher-kva.test"]
        plain = queue.read_message(allowed.id)
        assert ORIGINAL_RECIPIENTS_FIELD.encode() not in plain  # the Bcc recipient stays unseen
        assert data.endswith(plain)


def test_a_dsn_the_worker_writes_goes_through_the_firewall(store_settings):
    with firewalled(store_settings):
        enqueue = store_enqueue(get_store(), get_settings(), timezone.now)
        dsn = b"From: MAILER-DAEMON@mta.example.com\r\nSubject: Delivery Status\r\n\r\nReport.\r\n"
        item = enqueue(dsn, sender="", recipients=["someone@customer.test"], priority=0, channel="default")
        assert item.next_attempt_at == HELD_AT and claimable_ids() == set()


def test_without_the_firewall_nothing_changes(store_settings):
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store_settings}):
        item = queue.enqueue(EmailMessage("Hi", "Hi.", "app@example.com", ["ann@example.com", "cust@gmail.test"]))
        assert queue.count() == 1 and len(item.recipients) == 2 and claimable_ids() == {item.id}


@pytest.mark.redis
def test_on_redis_an_item_added_held_is_in_no_ready_set(redis_settings):
    prefix = redis_settings["REDIS_KEY_PREFIX"]
    client = get_redis_connection(REDIS_ALIAS)
    with firewalled(redis_settings):
        held = queue.enqueue(EmailMessage("Hi", "Hi.", "app@example.com", ["cust@gmail.test"]))
        ready = list(client.scan_iter(match=f"{prefix}ready:*"))
        assert ready == [] and client.smembers(f"{prefix}lanes") == set()
        allowed = queue.enqueue(EmailMessage("Hi", "Hi.", "app@example.com", ["ann@example.com"]))
        (ready_key,) = client.scan_iter(match=f"{prefix}ready:*")
        assert [member.decode().endswith(allowed.id) for member in client.zrange(ready_key, 0, -1)] == [True]
        call_command("queue_release", "--all", stdout=StringIO())
        members = client.zrange(ready_key, 0, -1)
        assert {m.decode()[17:] for m in members} == {allowed.id, held.id}


# -- the admin ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["orm", pytest.param("redis", marks=pytest.mark.redis)])
def test_the_admin_marks_what_the_firewall_held_or_redirected(request, store, client):
    # Not the memory store: it starts empty with each change of the settings.
    store_settings = request.getfixturevalue("redis_settings") if store == "redis" else {"STORE": "orm"}
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    with firewalled(store_settings):
        held = queue.enqueue(EmailMessage("Held one", "Hi.", "app@example.com", ["cust@gmail.test"]))
        allowed = queue.enqueue(EmailMessage("Allowed one", "Hi.", "app@example.com", ["ann@example.com"]))
    with firewalled(store_settings, REDIRECT_TO="staging@example.com"):
        redirected = queue.enqueue(EmailMessage("Sent on", "Hi.", "app@example.com", ["c9@gmail.test"]))
        listing = client.get(reverse("admin:bumail_queue_item_changelist")).content.decode()
        rows = {m.group(1): m.group(2) for m in re.finditer(r'<tr data-item-id="([^"]+)">(.*?)</tr>', listing, re.S)}
        assert "held by the staging firewall" in rows[held.id]
        assert "redirected by the staging firewall" in rows[redirected.id] and "c9@gmail.test" in rows[redirected.id]
        assert "staging firewall" not in rows[allowed.id]
        page = client.get(reverse("admin:bumail_queue_item_change", args=[held.id])).content.decode()
        assert "Held by the staging firewall: cust@gmail.test" in page
        page = client.get(reverse("admin:bumail_queue_item_change", args=[redirected.id])).content.decode()
        assert "Redirected by the staging firewall: c9@gmail.test" in page
        page = client.get(reverse("admin:bumail_queue_item_change", args=[allowed.id])).content.decode()
        assert "staging firewall" not in page


def test_a_hold_of_an_operator_is_no_firewall_mark():
    firewall = Firewall.of(["example.com"])
    with override_settings(BUMAIL_QUEUE={"STORE": "memory"}):
        item = queue.enqueue(EmailMessage("Hi", "Hi.", "app@example.com", ["ann@example.com"]))
        head = queue.read_message(item.id)
        assert firewall_mark(item, head, firewall) is None
        get_store().hold([item.id], now=timezone.now())
        held = queue.get(item.id)
        assert firewall_mark(held, head, firewall) is None  # every recipient allowed: the operator's hold
        assert firewall_mark(held, head, Firewall.of(["other.example"])).label == "held by the staging firewall"


def test_with_tasks_only_the_allowed_item_gets_a_delivery_task(smtp_server):
    from django_tasks_db.models import DBTaskResult

    settings = smarthost(smtp_server, TASKS="django", ALLOW_RECIPIENTS=ALLOW)
    with override_settings(BUMAIL_QUEUE=settings):
        raw = b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n"
        item = queue.enqueue(raw, sender="app@example.com", recipients=["ann@example.com", "cust@gmail.test"])
        later = queue.enqueue(
            raw, sender="app@example.com", recipients=["cust@gmail.test"], at=timezone.now() + timedelta(hours=1)
        )
        assert later.next_attempt_at == HELD_AT  # held, its time aside: no task for the year 9000
    rows = DBTaskResult.objects.all()
    assert [row.args_kwargs["args"] for row in rows] == [[[item.id]]]
