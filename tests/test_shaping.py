"""SHAPING's rules without processes: patterns, rates, replies, settings, checks, and the
worker's side (what it asks the store, what it holds back), on the memory store with
an injected clock and transport. Across processes: test_shaping_end_to_end.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core import checks
from django.core.mail import EmailMessage
from django.test import override_settings

from bumail_queue import signals
from bumail_queue.conf import get_settings, load, validate
from bumail_queue.delivery.dns import Destinations
from bumail_queue.delivery.envelope import Host
from bumail_queue.delivery.routes import Destination
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import RecipientStatus, Reply
from bumail_queue.service import QueueService
from bumail_queue.shaper import Held, Shaper, Ticket
from bumail_queue.shaping import (
    DEFAULT_SUSPEND,
    Limits,
    Patterns,
    Pushback,
    Rate,
    parse_rate,
    pushback_of,
)
from bumail_queue.stores.memory import MemoryStore
from tests.helpers import ScriptedTransport
from tests.servers.dns import DNSZone

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
# MTA_STS off: these tests resolve MX hosts themselves, and no TXT lookup may leave loopback.
MX = {"HOSTNAME": "mta.example.com", "RETRY_JITTER": 0, "MTA_STS": False}


# -- rates --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "per_second", "capacity"),
    [("10/s", 10, 10), (" 600 / m ", 10, 10), ("100/h", 100 / 3600, 1), ("1/s", 1, 1), ("3/m", 0.05, 1)],
)
def test_a_rate_is_messages_a_period_and_its_bucket_holds_a_seconds_worth(text, per_second, capacity):
    rate = parse_rate(text)
    assert rate is not None
    assert rate.per_second == pytest.approx(per_second)
    assert rate.capacity == pytest.approx(capacity)


@pytest.mark.parametrize("text", ["10", "10/d", "0/s", "-1/s", "1.5/s", "ten/s", "", None, 10, "10/sec"])
def test_a_rate_in_another_form_is_none(text):
    assert parse_rate(text) is None


def test_a_rate_prints_as_written():
    assert str(Rate(count=60, period=60.0)) == "60/m"


# -- patterns -------------------------------------------------------------------------------

LIMITS = {name: Limits(concurrency=n) for n, name in enumerate(["example.com", ".google.com", ".l.google.com", "*"], 1)}


def test_the_exact_domain_comes_first():
    found = Patterns(LIMITS).match("Example.COM.", ["aspmx.l.google.com"])
    assert (found.key, found.pattern, found.limits.concurrency) == ("example.com", "example.com", 1)


def test_then_the_longest_mx_suffix_every_host_ends_with_shared_by_its_domains():
    patterns = Patterns(LIMITS)
    one = patterns.match("one.example", ["alt1.aspmx.l.google.com", "aspmx.l.google.com"])
    two = patterns.match("two.example", ["ASPMX.L.GOOGLE.COM."])
    other = patterns.match("three.example", ["aspmx.l.google.com", "smtp.google.com"])
    assert (one.key, two.key, other.key) == (".l.google.com", ".l.google.com", ".google.com")


def test_a_domain_with_one_host_of_its_own_beside_a_providers_is_not_shaped_as_the_provider():
    # Its owner chose every MX host: one of Google's among them does not make it Google.
    found = Patterns(LIMITS).match("attack.example", ["mx.attacker.example", "aspmx.l.google.com"])
    assert (found.key, found.pattern) == ("attack.example", "*")
    assert (
        Patterns({".google.com": Limits()}).match("attack.example", ["mx.attacker.example", "aspmx.l.google.com"])
        is None
    )


def test_then_the_default_which_gives_each_destination_its_own_bucket():
    found = Patterns(LIMITS).match("elsewhere.example", ["mx.elsewhere.example"])
    assert (found.key, found.pattern, found.limits.concurrency) == ("elsewhere.example", "*", 4)


def test_without_a_default_an_unmatched_destination_is_not_shaped():
    assert Patterns({"example.com": Limits()}).match("other.example", ["mx.other.example"]) is None
    assert not Patterns({})


def test_a_suffix_is_not_the_domain_itself():
    assert Patterns({".google.com": Limits()}).match("google.com", ["google.com"]) is None


def test_a_smarthost_is_shaped_by_its_host_name():
    settings = load({**MX, "SHAPING": {"smtp.relay.example": {"RATE": "5/s"}, "*": {}}})
    shaper = Shaper(settings=settings, store=MemoryStore(settings), owner="w", clock=lambda: T0)
    route = settings.route.__class__(type="smarthost", host="SMTP.relay.example", port=587)
    found = shaper.shape(Destination(route=route, domain=None), [Host(name="SMTP.relay.example", port=587)])
    assert (found.key, str(found.limits.rate)) == ("smtp.relay.example", "5/s")


# -- replies ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ((421, "4.7.0", "Try again later, closing connection."), Pushback.SLOW_DOWN),  # Gmail
        ((421, "4.7.28", "Our system has detected an unusual rate of unsolicited mail"), Pushback.SLOW_DOWN),
        (
            (421, "4.7.0", "[TSS04] Messages from 192.0.2.1 temporarily deferred due to unexpected volume"),
            Pushback.SLOW_DOWN,
        ),
        ((451, "4.7.500", "Server busy. Please try again later from [192.0.2.1]"), Pushback.SLOW_DOWN),  # Outlook
        ((450, "4.7.1", "Rate limit exceeded"), Pushback.SLOW_DOWN),
        ((421, "4.7.0", "Too many concurrent SMTP connections from this IP"), Pushback.CONNECTIONS),
        ((421, "", "Too many connections"), Pushback.CONNECTIONS),
        ((450, "4.2.1", "The mail server has exceeded the maximum number of connections"), Pushback.CONNECTIONS),
        ((421, "4.3.2", "Service shutting down"), Pushback.NONE),
        ((451, "4.3.0", "Try again later"), Pushback.NONE),  # neither 421 nor 4.7.x
        ((452, "4.2.2", "Mailbox full"), Pushback.NONE),
        ((550, "5.7.1", "Rate limited: too many messages"), Pushback.NONE),  # permanent
        ((None, "4.4.1", "Connection refused; try again later"), Pushback.NONE),  # no server said it
    ],
)
def test_which_replies_say_slow_down(reply, said):
    code, status, text = reply
    assert pushback_of(Reply(code=code, status=status, text=text)) is said


# -- settings and checks ------------------------------------------------------------------


def test_shaping_loads_as_limits_by_pattern():
    settings = load(
        {
            "SHAPING": {
                "Bücher.example": {"CONCURRENCY": 3, "SLOW_START": True},
                ".Google.com": {"RATE": "20/s", "CONCURRENCY": 10, "SLOW_START": 2, "SUSPEND": timedelta(minutes=30)},
                "*": {"SUSPEND": 60},
            }
        }
    )
    assert settings.shaping == {
        "xn--bcher-kva.example": Limits(concurrency=3, slow_start=3),  # True: 5, at most CONCURRENCY
        ".google.com": Limits(
            concurrency=10, rate=Rate(count=20, period=1.0), slow_start=2, suspend=timedelta(minutes=30)
        ),
        "*": Limits(suspend=timedelta(seconds=60)),
    }
    assert load({}).shaping == {}
    assert Limits().suspend == DEFAULT_SUSPEND


@pytest.mark.parametrize(
    ("shaping", "says"),
    [
        (["example.com"], "must be a dict of destination pattern to limits; got list"),
        ({"not a domain": {}}, "has a key that is no destination pattern: 'not a domain'"),
        ({"192.0.2.1": {}}, "no destination pattern"),
        ({".": {}}, "no destination pattern"),
        ({"Example.com": {}, "example.com.": {}}, "names 'example.com' twice"),
        ({"example.com": {"CONCURRENCY": 0}}, "CONCURRENCY that is not a whole number above 0: 0"),
        ({"example.com": {"CONCURRENCY": True}}, "CONCURRENCY that is not a whole number above 0: True"),
        ({"example.com": {"RATE": "10/d"}}, "RATE that is not 'N/s', 'N/m' or 'N/h'"),
        ({"example.com": {"RATE": 10}}, "RATE that is not"),
        ({"example.com": {"SLOW_START": True}}, "SLOW_START without CONCURRENCY"),
        ({"example.com": {"CONCURRENCY": 4, "SLOW_START": 0}}, "SLOW_START that is not True, False or the number"),
        ({"example.com": {"SUSPEND": -1}}, "SUSPEND that is not a timedelta or a number of seconds"),
        (
            {"example.com": {"LIMIT": 1}},
            "has the unknown key 'LIMIT' (it takes CONCURRENCY, RATE, SLOW_START, SUSPEND, QUOTA, COUNT, WARMUP, WARMUP_START)",
        ),
        (
            {"example.com": 5},
            "must be a dict of CONCURRENCY, RATE, SLOW_START, SUSPEND, QUOTA, COUNT, WARMUP, WARMUP_START; got int",
        ),
    ],
)
def test_a_wrong_shaping_is_e030_saying_what_is_wrong(shaping, says):
    problems = validate({"SHAPING": shaping})
    assert [p.id for p in problems] == ["bumail_queue.E028"]
    assert says in problems[0].message


def shaping_checks():
    from bumail_queue.checks import check_shaping

    return [(m.id, m.msg) for m in check_shaping()]


class StoreWithoutShaping(MemoryStore):
    supports_shaping = False


def test_e029_when_the_store_keeps_no_buckets():
    store = f"{__name__}.StoreWithoutShaping"
    with override_settings(BUMAIL_QUEUE={"STORE": store, "SHAPING": {"*": {"CONCURRENCY": 2}}}):
        found = shaping_checks()
    assert [check_id for check_id, _ in found] == ["bumail_queue.E029"]
    assert "StoreWithoutShaping keeps no shaping state" in found[0][1]
    with override_settings(BUMAIL_QUEUE={"STORE": store}):
        assert shaping_checks() == []


def test_w008_when_a_pattern_is_behind_a_smarthost():
    relay = {"TYPE": "smarthost", "HOST": "relay.example.net", "PORT": 587}
    with override_settings(
        BUMAIL_QUEUE={
            "ROUTE": relay,
            "SHAPING": {"gmail.com": {}, ".google.com": {}, "relay.example.net": {"RATE": "14/s"}, "*": {}},
        }
    ):
        found = shaping_checks()
    assert [check_id for check_id, _ in found] == ["bumail_queue.W008", "bumail_queue.W008"]
    assert "mail to gmail.com goes through the smarthost relay.example.net" in found[0][1]
    assert "every route is a smarthost" in found[1][1]
    with override_settings(BUMAIL_QUEUE={"ROUTES": {"corp.example": relay}, "SHAPING": {".google.com": {}}}):
        assert shaping_checks() == []


def test_the_checks_framework_reports_them():
    with override_settings(BUMAIL_QUEUE={"SHAPING": {"example.com": {"RATE": "fast"}}}):
        ids = {m.id for m in checks.run_checks(tags=None) if m.id.startswith("bumail_queue.")}
    assert "bumail_queue.E028" in ids


# -- the worker's side ----------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now


class CountingStore(MemoryStore):
    """The memory store, counting the shaping calls a worker makes of it."""

    def __init__(self, settings):
        super().__init__(settings)
        self.calls = []

    def take_permit(self, request):
        self.calls.append(("take", request.key, request.held))
        return super().take_permit(request)

    def release_permit(self, key, **kwargs):
        self.calls.append(("release", key, kwargs["change"].value))
        return super().release_permit(key, **kwargs)


def shaper_for(shaping, clock=None):
    settings = load({**MX, "SHAPING": shaping})
    store = CountingStore(settings)
    return Shaper(settings=settings, store=store, owner="worker-1", clock=clock or Clock()), store


def shape_of(shaper, domain="example.org"):
    route = shaper.settings.route_for(domain)
    return shaper.shape(Destination(route=route, domain=domain), [Host(name=f"mx.{domain}", port=25)])


def test_held_items_are_spread_at_the_destinations_pace_without_asking_again():
    shaper, store = shaper_for({"example.org": {"RATE": "2/s"}})
    shape = shape_of(shaper)
    got = [shaper.enter(shape) for _ in range(5)]
    assert [type(g) for g in got] == [Ticket, Ticket, Held, Held, Held]
    assert [g.until for g in got[2:]] == [T0 + timedelta(seconds=s) for s in (0.5, 1.0, 1.5)]
    assert [call[0] for call in store.calls] == ["take", "take", "take"]  # the last two: from memory


def test_the_items_held_without_asking_are_told_with_the_next_request():
    clock = Clock()
    shaper, store = shaper_for({"example.org": {"RATE": "1/m"}}, clock)
    shape = shape_of(shaper)
    for _ in range(4):
        shaper.enter(shape)  # one granted, three held (one asked, two not)
    clock.now = T0 + timedelta(minutes=1)
    assert isinstance(shaper.enter(shape), Ticket)
    assert store.calls[-1] == ("take", "example.org", 3)
    assert [(s.held, s.held_until) for s in store.destination_states(now=clock.now)] == [(3, T0 + timedelta(minutes=3))]


def test_a_full_set_of_slots_holds_items_for_a_sessions_length_each():
    shaper, _ = shaper_for({"example.org": {"CONCURRENCY": 2}})
    shape = shape_of(shaper)
    tickets = [shaper.enter(shape) for _ in range(2)]
    held = [shaper.enter(shape) for _ in range(3)]
    assert all(isinstance(t, Ticket) and t.slot for t in tickets)
    # Untimed, a session is taken to last a second: two slots free one every half second.
    assert [h.until for h in held] == [T0 + timedelta(seconds=s) for s in (0.5, 1.0, 1.5)]
    assert {h.reason for h in held} == {"concurrency"}


def test_a_slow_down_reply_suspends_the_destination_and_holds_the_next_items_here_too():
    clock = Clock()
    shaper, store = shaper_for({"example.org": {"CONCURRENCY": 3, "SUSPEND": 120}}, clock)
    shape = shape_of(shaper)
    ticket = shaper.enter(shape)
    slow = Reply(code=421, status="4.7.0", text="Try again later, closing connection")
    from bumail_queue.delivery.envelope import Delivery
    from bumail_queue.items import Outcome

    shaper.leave(ticket, Delivery(outcomes={"a@example.org": Outcome(status=RecipientStatus.DEFERRED, reply=slow)}))
    assert store.calls[-1] == ("release", "example.org", "halve")
    assert [s.suspended_until for s in store.destination_states(now=T0)] == [T0 + timedelta(seconds=120)]
    held = shaper.enter(shape)
    assert (held.reason, held.until) == ("suspended", T0 + timedelta(seconds=120))
    assert store.calls[-1][0] == "release"  # held without asking


def test_with_slow_start_a_connection_limit_halves_rather_than_suspends():
    shaper, store = shaper_for({"example.org": {"CONCURRENCY": 8, "SLOW_START": 4}})
    shape = shape_of(shaper)
    ticket = shaper.enter(shape)
    from bumail_queue.delivery.envelope import Delivery
    from bumail_queue.items import Outcome

    busy = Reply(code=421, status="4.7.0", text="Too many connections from your IP")
    shaper.leave(ticket, Delivery(outcomes={"a@example.org": Outcome(status=RecipientStatus.DEFERRED, reply=busy)}))
    state = store.destination_states(now=T0)[0]
    assert (state.window, state.suspended_until) == (2, None)
    shaper.leave(
        shaper.enter(shape),
        Delivery(
            outcomes={
                "b@example.org": Outcome(
                    status=RecipientStatus.DELIVERED, reply=Reply(code=250, status="2.0.0", text="OK")
                )
            }
        ),
    )
    assert store.destination_states(now=T0)[0].window == 3


def test_a_store_that_cannot_answer_holds_mail_back_rather_than_send_it_unshaped(monkeypatch):
    shaper, store = shaper_for({"example.org": {"RATE": "1/s"}})
    errors = []
    signals.error.connect(receiver := lambda sender, error, **kw: errors.append(error), weak=False)
    try:

        def down(request):
            raise QueueError(ErrorCode.STORE_UNAVAILABLE, "Redis could not be reached")

        monkeypatch.setattr(store, "take_permit", down)
        held = shaper.enter(shape_of(shaper))
    finally:
        signals.error.disconnect(receiver)
    assert isinstance(held, Held)
    assert held.until == T0 + timedelta(seconds=get_settings().poll_seconds)
    assert [e.code for e in errors] == ["STORE_UNAVAILABLE"]


def test_renewing_extends_the_slots_of_sessions_under_way():
    clock = Clock()
    shaper, _ = shaper_for({"example.org": {"CONCURRENCY": 1}}, clock)
    shape = shape_of(shaper)
    ticket = shaper.enter(shape)
    clock.now = T0 + timedelta(minutes=5)
    shaper.renew(clock.now + shaper.settings.lease)
    clock.now = T0 + timedelta(minutes=12)  # past the first lease, within the renewed one
    assert isinstance(shaper.enter(shape), Held)
    shaper.leave(ticket, None)
    assert isinstance(shaper.enter(shape), Ticket)


class MXResolver:
    def destinations(self, domain):
        return Destinations(hosts=(Host(name=f"mx.{domain}", address="127.0.0.1", port=25),), failure=None)


def soon():
    """A moment after the items just queued fall due (they are due when queued)."""
    from django.utils import timezone

    return timezone.now() + timedelta(seconds=1)


def message(*to):
    return EmailMessage("Hi", "Body", "app@example.com", list(to))


def test_without_shaping_a_worker_never_asks_the_store():
    with override_settings(BUMAIL_QUEUE={**MX, "STORE": f"{__name__}.CountingStore"}):
        service = QueueService()
        service.enqueue(message("a@example.org"))
        stats = service.deliver_due(now=soon(), transport=ScriptedTransport(), resolver=MXResolver())
        assert stats.delivered == 1
        assert service.store.calls == []


def test_with_shaping_one_round_trip_before_each_session_and_one_after_only_for_a_slot():
    transport = ScriptedTransport()
    shaping = {"rate.example": {"RATE": "100/s"}, "slots.example": {"CONCURRENCY": 5}}
    with override_settings(BUMAIL_QUEUE={**MX, "STORE": f"{__name__}.CountingStore", "SHAPING": shaping}):
        service = QueueService()
        service.enqueue(message("a@rate.example"))
        service.enqueue(message("b@slots.example"))
        service.enqueue(message("c@plain.example"))
        stats = service.deliver_due(now=soon(), transport=transport, resolver=MXResolver())
        calls = sorted(service.store.calls)
    assert stats.delivered == 3
    assert calls == [("release", "slots.example", "keep"), ("take", "rate.example", 0), ("take", "slots.example", 0)]
    by_domain = {
        env.recipients[0].partition("@")[2]: reuse
        for (env, _, _), reuse in zip(transport.envelopes, transport.reuse, strict=True)
    }
    # A counted session keeps no idle connection; the others do.
    assert by_domain == {"rate.example": True, "slots.example": False, "plain.example": True}


def test_an_item_held_back_keeps_its_state_counts_no_attempt_and_sends_no_signal():
    told = []
    receivers = [lambda sender, _n=n, **kw: told.append(_n) for n in ("delivered", "deferred", "failed")]
    for name, receiver in zip(("delivered", "deferred", "failed"), receivers, strict=True):
        getattr(signals, name).connect(receiver, weak=False)
    try:
        settings = {**MX, "STORE": "memory", "SHAPING": {"example.org": {"RATE": "1/m"}}}
        with override_settings(BUMAIL_QUEUE=settings):
            service = QueueService()
            first = service.enqueue(message("a@example.org"))
            second = service.enqueue(message("b@example.org"))
            now = soon()
            stats = service.deliver_due(now=now, transport=ScriptedTransport(), resolver=MXResolver())
            # The two go on two delivery threads: whichever asks first takes the token.
            left = [item for item in (service.get(first.id), service.get(second.id)) if item is not None]
            assert len(left) == 1
            (held,) = left
    finally:
        for name, receiver in zip(("delivered", "deferred", "failed"), receivers, strict=True):
            getattr(signals, name).disconnect(receiver)
    assert (stats.items, stats.delivered, stats.held) == (1, 1, 1)
    assert told == ["delivered"]
    assert (held.attempts, held.next_attempt_at, held.lease_owner) == (0, now + timedelta(minutes=1), None)
    assert [r.status for r in held.recipients] == [RecipientStatus.PENDING]


def test_a_recipient_held_back_waits_while_the_others_of_its_item_go():
    settings = {**MX, "STORE": "memory", "SHAPING": {"slow.example": {"RATE": "1/h"}}}
    with override_settings(BUMAIL_QUEUE=settings):
        service = QueueService()
        service.enqueue(message("x@slow.example"))
        # x takes the hour's token alone in a first round (items of one round go on parallel
        # threads, and whichever asked first would take it); a minute on, so that the item
        # queued after that round is due in the second.
        now = soon() + timedelta(minutes=1)
        service.deliver_due(now=now, transport=ScriptedTransport(), resolver=MXResolver())
        item = service.enqueue(message("a@fast.example", "b@slow.example"))
        service.deliver_due(now=now, transport=ScriptedTransport(), resolver=MXResolver())
        kept = service.get(item.id)
    assert [(r.address, r.status) for r in kept.recipients] == [
        ("a@fast.example", RecipientStatus.DELIVERED),
        ("b@slow.example", RecipientStatus.PENDING),
    ]
    # Attempted (its other recipient went), and due when the slow destination has room.
    assert (kept.attempts, kept.next_attempt_at) == (1, now + timedelta(hours=1))


# -- what operators see: queue_status and the admin's overview -----------------------------


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def shaped(request, settings):
    """A queue on each store with SHAPING set, one destination suspended and one holding items."""
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}
    settings.BUMAIL_QUEUE = {**MX, **store, "SHAPING": {"*": {"CONCURRENCY": 2}}}
    from django.utils import timezone

    from bumail_queue.shaping import PermitRequest
    from bumail_queue.stores import get_store

    now = timezone.now()
    store = get_store()
    store.release_permit("slow.example", slot=None, now=now, suspend_until=now + timedelta(minutes=5, seconds=30))
    limits = Limits(concurrency=2)
    store.take_permit(
        PermitRequest(key="busy.example", limits=limits, now=now, slot="s1", slot_until=now + timedelta(minutes=10))
    )
    store.take_permit(
        PermitRequest(key="busy.example", limits=limits, now=now, held=4, held_until=now + timedelta(minutes=2))
    )
    return request.param


def queue_status(*args):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("queue_status", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_queue_status_shows_shaped_destinations(shaped):
    text = queue_status()
    assert "Shaped destinations (SHAPING):" in text
    assert "  busy.example: 1 session; 4 held back, due by " in text
    assert "  slow.example: 0 sessions; suspended for 5 minutes" in text
    import json

    data = {d["destination"]: d for d in json.loads(queue_status("--json"))["shaped_destinations"]}
    assert (data["busy.example"]["sessions"], data["busy.example"]["held"]) == (1, 4)
    assert data["slow.example"]["suspended_until"] is not None


@pytest.mark.django_db(transaction=True)
def test_queue_status_without_shaping_says_nothing_of_it():
    with override_settings(BUMAIL_QUEUE=MX):
        import json

        assert "Shaped" not in queue_status()
        assert "shaped_destinations" not in json.loads(queue_status("--json"))


@pytest.mark.django_db(transaction=True)
def test_the_admin_overview_shows_throttled_destinations(shaped, client):
    from django.contrib.auth.models import User
    from django.urls import reverse

    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    page = client.get(reverse("admin:bumail_queue_item_overview")).content.decode()
    assert "Shaped destinations" in page
    assert '<tr data-destination="slow.example" class="bq-throttled">' in page
    assert '<tr data-destination="busy.example" class="bq-throttled">' in page


# -- a stranger's domain and a provider's bucket ---------------------------------------------


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    return request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": "orm"}


@pytest.mark.django_db(transaction=True)
def test_a_domain_listing_a_providers_mx_beside_its_own_cannot_suspend_the_providers_bucket(
    smtp_servers, dns_server, store_settings
):
    # attack.test names its own server first, then Google's; that server says "slow
    # down". Were attack.test shaped as ".google.test", the reply would suspend Google's
    # bucket for every worker, and the mail of the domains Google hosts would wait.
    attacker = smtp_servers(message_reply="451 4.7.0 Try again later, closing connection")
    google = smtp_servers(host="127.0.0.2", port=attacker.port)
    records = {
        "attack.test": {"MX": [(10, "mx.attacker.test"), (90, "aspmx.l.google.test")]},
        "mx.attacker.test": {"A": [attacker.host]},
        "aspmx.l.google.test": {"A": [google.host]},
    }
    hosted = [f"hosted{n}.test" for n in range(4)]
    records.update({domain: {"MX": [(10, "aspmx.l.google.test")]} for domain in hosted})
    dns_server.zone = DNSZone(records)
    settings = {
        **MX,
        **dns_server.queue_settings(attacker.port),
        **store_settings,
        "SHAPING": {".google.test": {"CONCURRENCY": 10, "SUSPEND": 300}},
    }
    with override_settings(BUMAIL_QUEUE=settings):
        queue = QueueService()
        queue.enqueue(EmailMessage("Sign up", "Hi", "app@example.com", ["me@attack.test"]))
        first = queue.deliver_due()
        for domain in hosted:
            queue.enqueue(EmailMessage("Hello", "Hi", "app@example.com", [f"user@{domain}"]))
        second = queue.deliver_due()
        states = queue.destination_states()

    assert (first.deferred, attacker.verbs().count("DATA")) == (1, 1)  # its own server gave the reply
    assert (second.held, second.delivered) == (0, 4)
    assert sorted(m.rcpt_tos[0] for m in google.messages) == sorted(f"user@{d}" for d in hosted)
    assert not [s for s in states if s.suspended_until is not None]
