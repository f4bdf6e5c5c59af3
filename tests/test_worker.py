"""The worker's decisions with an injected transport and clock, on the real store.

The transport here answers from a script, so each test can say what the remote
servers replied; the SMTP client itself is tested against real servers elsewhere.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.test import override_settings

from bumail_queue import delivery_log
from bumail_queue import outcomes as outcomes_module
from bumail_queue.delivery.dns import Destinations
from bumail_queue.delivery.envelope import Host
from bumail_queue.errors import QueueError
from bumail_queue.items import RecipientStatus, Reply
from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from bumail_queue.stores import get_store
from bumail_queue.worker import Worker
from tests.helpers import ScriptedTransport, signals_told

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SMARTHOST = {"TYPE": "smarthost", "HOST": "relay.example.net", "PORT": 2525, "TLS": "none"}
SETTINGS = {"HOSTNAME": "mta.example.com", "ROUTE": SMARTHOST, "RETRY_JITTER": 0}

OK = Reply(code=250, status="2.0.0", text="OK queued")
LATER = Reply(code=451, status="4.3.0", text="Try again later")
UNKNOWN = Reply(code=550, status="5.1.1", text="No such user")


@pytest.fixture(autouse=True)
def _settings():
    with override_settings(BUMAIL_QUEUE=SETTINGS):
        yield


@pytest.fixture
def told():
    """Every signal sent, in order, as (name, kwargs)."""
    with signals_told("delivered", "deferred", "failed", "dsn", "error") as events:
        yield events


def enqueue(recipients, *, sender="app@example.com", at=T0):
    service = QueueService(clock=lambda: at)
    raw = f"From: {sender or 'nobody@example.com'}\r\nTo: {', '.join(recipients)}\r\nSubject: Hello\r\n\r\nHi.\r\n".encode()
    return service.enqueue(raw, sender=sender, recipients=recipients)


def run(transport, now=T0, **kwargs):
    return QueueService(clock=lambda: now).deliver_due(now=now, transport=transport, **kwargs)


def test_delivered_recipients_leave_the_queue_and_are_told(told):
    item = enqueue(["a@example.org", "b@example.org"])
    transport = ScriptedTransport()
    stats = run(transport)
    assert (stats.items, stats.delivered) == (1, 2)
    assert get_store().get(item.id) is None
    [(envelope, route, hosts)] = transport.envelopes  # one transaction for both recipients
    assert envelope.recipients == ("a@example.org", "b@example.org")
    assert route.host == "relay.example.net"
    assert [(h.name, h.port) for h in hosts] == [("relay.example.net", 2525)]
    assert [(name, kw["recipient"], kw["reply"]) for name, kw in told] == [
        ("delivered", "a@example.org", OK),
        ("delivered", "b@example.org", OK),
    ]


def test_each_recipient_keeps_its_own_state_and_a_dsn_reports_the_failure(told):
    item = enqueue(["ok@example.org", "later@example.org", "gone@example.org"])
    transport = ScriptedTransport({"later@example.org": LATER, "gone@example.org": UNKNOWN})
    run(transport)
    kept = get_store().get(item.id)
    assert [(r.address, r.status, r.reply) for r in kept.recipients] == [
        ("ok@example.org", RecipientStatus.DELIVERED, OK),
        ("later@example.org", RecipientStatus.DEFERRED, LATER),
        ("gone@example.org", RecipientStatus.FAILED, UNKNOWN),
    ]
    assert kept.attempts == 1
    assert kept.next_attempt_at == T0 + timedelta(minutes=30)
    about_item = [(name, kw) for name, kw in told if kw.get("item_id", kw.get("of")) == item.id]
    assert [name for name, _ in about_item] == ["delivered", "deferred", "failed", "dsn"]
    assert about_item[1][1]["next_attempt_at"] == T0 + timedelta(minutes=30)
    dsn = about_item[3][1]
    assert (dsn["kind"], dsn["to"], dsn["recipients"]) == ("failed", "app@example.com", ["gone@example.org"])
    # The DSN is queued like any mail, from the null sender, and delivered in the same pass.
    [report] = [e for e, _, _ in transport.envelopes if e.item_id == dsn["dsn_id"]]
    assert (report.sender, report.recipients) == ("", ("app@example.com",))
    parsed = email.message_from_bytes(report.message, policy=email.policy.default)
    assert parsed.get_content_type() == "multipart/report"
    assert "gone@example.org" in parsed.as_string()


def test_a_retry_delivers_only_the_recipients_still_pending():
    item = enqueue(["ok@example.org", "later@example.org"])
    run(ScriptedTransport({"later@example.org": LATER}))
    transport = ScriptedTransport()
    run(transport, now=T0 + timedelta(minutes=29))
    assert transport.envelopes == []  # not due yet
    run(transport, now=T0 + timedelta(minutes=30))
    assert [e.recipients for e, _, _ in transport.envelopes] == [("later@example.org",)]
    assert get_store().get(item.id) is None


def test_a_recipient_deferred_past_max_age_fails_as_4_4_7(told):
    item = enqueue(["later@example.org"])
    with override_settings(BUMAIL_QUEUE={**SETTINGS, "MAX_AGE": timedelta(days=1), "DELAY_WARNING": timedelta(days=2)}):
        run(ScriptedTransport({"later@example.org": LATER}), now=T0 + timedelta(days=1))
    assert get_store().get(item.id) is None
    failed = [kw for name, kw in told if name == "failed"]
    assert failed[0]["reply"].status == "4.4.7"
    assert "expired" in failed[0]["reply"].text
    assert [kw["kind"] for name, kw in told if name == "dsn"] == ["failed"]


def test_one_delay_dsn_once_a_recipient_has_waited_delay_warning(told):
    item = enqueue(["later@example.org"])
    transport = ScriptedTransport({"later@example.org": LATER})
    run(transport, now=T0 + timedelta(hours=1))
    assert [n for n, _ in told if n == "dsn"] == []
    told.clear()
    get_store().reschedule(item.id, at=T0)
    run(transport, now=T0 + timedelta(hours=4))
    assert [kw["kind"] for n, kw in told if n == "dsn"] == ["delayed"]
    assert get_store().get(item.id).delay_notified is True
    told.clear()
    get_store().reschedule(item.id, at=T0)
    run(transport, now=T0 + timedelta(hours=5))
    assert [n for n, _ in told if n == "dsn"] == []  # one per item


def test_never_a_dsn_about_a_message_from_the_null_sender(told):
    enqueue(["gone@example.org"], sender="")
    run(ScriptedTransport({"gone@example.org": UNKNOWN}))
    assert [name for name, _ in told] == ["failed"]


def test_a_message_the_store_lost_fails_its_recipients_as_5_3_0(told):
    item = enqueue(["a@example.org"])
    from bumail_queue.models import Message

    Message.objects.filter(item__id=item.id).delete()
    transport = ScriptedTransport()
    run(transport)
    assert [e for e, _, _ in transport.envelopes if e.item_id == item.id] == []  # no session
    assert get_store().get(item.id) is None
    about_item = [(name, kw) for name, kw in told if kw.get("item_id", kw.get("of")) == item.id]
    assert [name for name, _ in about_item] == ["error", "failed", "dsn"]
    assert about_item[0][1]["error"].code == "MESSAGE_UNREADABLE"
    assert about_item[1][1]["reply"].status == "5.3.0"
    [report] = [e.message for e, _, _ in transport.envelopes if e.item_id == about_item[2][1]["dsn_id"]]
    parsed = email.message_from_bytes(report, policy=email.policy.default)
    assert len(list(parsed.iter_parts())) == 2  # no third part: nothing to return


def test_an_attempt_keeps_the_header_block_its_dsns_return_not_the_body(told):
    enqueue(["gone@example.org"])
    worker = Worker(transport=ScriptedTransport({"gone@example.org": UNKNOWN}), clock=lambda: T0, owner="w")
    [claimed] = get_store().claim(owner="w", now=T0, lease_until=T0 + timedelta(minutes=10), limit=1)
    worker._lease_until[claimed.id] = T0 + timedelta(minutes=10)
    attempt = worker.attempt(claimed)
    assert attempt.headers.startswith(b"From: app@example.com\r\nTo: gone@example.org\r\nSubject: Hello\r\n")
    assert b"Hi." not in attempt.headers
    assert not attempt.lost_message
    worker.complete(attempt)
    assert get_store().get(claimed.id) is None  # its message went with it
    [dsn] = [kw for name, kw in told if name == "dsn"]
    report = email.message_from_bytes(get_store().read_message(dsn["dsn_id"]), policy=email.policy.default)
    [returned] = [p for p in report.iter_parts() if p.get_content_type() == "text/rfc822-headers"]
    assert "Subject: Hello" in returned.get_content()


def test_an_item_cancelled_during_delivery_is_told_without_dsn_or_error(told):
    item = enqueue(["gone@example.org"])
    transport = ScriptedTransport(
        {"gone@example.org": UNKNOWN}, on_deliver=lambda envelope: get_store().cancel(envelope.item_id)
    )
    run(transport)
    assert [name for name, _ in told] == ["failed"]
    assert get_store().get(item.id) is None


def test_a_worker_whose_lease_was_taken_records_nothing(told):
    item = enqueue(["a@example.org"])
    store = get_store()
    worker = Worker(transport=ScriptedTransport(), clock=lambda: T0, owner="stale")
    [claimed] = store.claim(owner="stale", now=T0, lease_until=T0 + timedelta(minutes=10), limit=1)
    store.claim(owner="thief", now=T0 + timedelta(minutes=10), lease_until=T0 + timedelta(minutes=20), limit=1)
    worker._lease_until[claimed.id] = T0 + timedelta(minutes=10)
    worker.complete(worker.attempt(claimed))
    assert [name for name, _ in told] == ["error"]
    assert told[0][1]["error"].code == "LEASE_LOST"
    assert store.get(item.id).recipients[0].status == RecipientStatus.PENDING
    assert store.get(item.id).lease_owner == "thief"


def test_stop_gives_back_what_was_claimed_but_not_started():
    items = [enqueue([f"user{n}@example.org"]) for n in range(6)]
    started = threading.Event()
    release = threading.Event()

    def slow(envelope):
        started.set()
        release.wait(5)

    # Six claimed at once; all go to one smarthost, which takes one session at a time.
    worker = Worker(transport=ScriptedTransport(on_deliver=slow), clock=lambda: T0, concurrency=6, domain_concurrency=1)

    def run_in_thread():
        try:
            worker.run()
        finally:
            connections.close_all()  # this thread's own, as a worker process would at exit

    thread = threading.Thread(target=run_in_thread)
    thread.start()
    assert started.wait(5)
    worker.stop()
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    left = [get_store().get(i.id) for i in items]
    assert sum(1 for i in left if i is None) == 1  # the session under way ended and was recorded
    given_back = [i for i in left if i is not None]
    assert len(given_back) == 5
    for item in given_back:  # due at once, no attempt counted, no lease
        assert (item.lease_owner, item.attempts, item.next_attempt_at) == (None, 0, T0)


def test_domain_concurrency_holds_a_busy_domain_without_blocking_others():
    lock = threading.Lock()
    in_flight, peak, order = {}, {}, []

    def track(envelope):
        domain = envelope.recipients[0].rpartition("@")[2]
        with lock:
            in_flight[domain] = in_flight.get(domain, 0) + 1
            peak[domain] = max(peak.get(domain, 0), in_flight[domain])
        time.sleep(0.05)
        with lock:
            in_flight[domain] -= 1
            order.append(domain)

    class Resolver:
        def destinations(self, domain):
            return Destinations(hosts=(Host(name=f"mx.{domain}", address="127.0.0.1", port=25),), failure=None)

    # No MTA-STS: its TXT lookups would go to the system's nameservers, past the resolver given.
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "RETRY_JITTER": 0, "MTA_STS": False}):
        for n in range(6):
            enqueue([f"user{n}@busy.example"])
        enqueue(["x@other.example"])
        worker = Worker(transport=ScriptedTransport(on_deliver=track), resolver=Resolver(), clock=lambda: T0,
                        concurrency=4, domain_concurrency=1, burst=True)  # fmt: skip
        stats = worker.run()
    assert stats.delivered == 7
    assert peak["busy.example"] == 1
    assert order.index("other.example") < 3  # not held behind the busy domain's queue


def test_a_store_error_during_record_is_told_and_the_lease_brings_the_item_back(told, monkeypatch):
    item = enqueue(["a@example.org"])
    store = get_store()

    def broken(*args, **kwargs):
        raise QueueError("STORE_UNAVAILABLE", "The queue's database 'default' could not be used: gone")

    monkeypatch.setattr(store, "complete", broken)
    monkeypatch.setattr(store, "complete_many", broken)
    monkeypatch.setattr("bumail_queue.outcomes.RECORD_RETRY_DELAYS", (0.01, 0.01))
    run(ScriptedTransport())
    assert [name for name, _ in told] == ["error"]
    assert told[0][1]["error"].code == "STORE_UNAVAILABLE"
    kept = store.get(item.id)
    assert kept.lease_owner is not None  # comes back once the lease expires
    assert kept.next_attempt_at == T0 + timedelta(seconds=600)


def test_a_batch_of_attempts_is_recorded_in_one_step_with_its_log_in_one_write(told, monkeypatch):
    items = [enqueue([f"user{n}@example.org"]) for n in range(3)]
    store = get_store()
    worker = Worker(transport=ScriptedTransport({"user2@example.org": LATER}), clock=lambda: T0, owner="w1")
    claimed = store.claim(owner="w1", now=T0, lease_until=T0 + timedelta(minutes=10), limit=3)
    attempts = [worker.attempt(item) for item in claimed]
    writes = []
    real_write = delivery_log.write
    monkeypatch.setattr(delivery_log, "write", lambda entries: (writes.append(len(entries)), real_write(entries)))
    recorded = worker.complete_many(attempts)
    assert [r is None for r in recorded] == [False, False, False]
    assert [name for name, _ in told] == ["delivered", "delivered", "deferred"]
    assert [store.get(i.id) is None for i in items] == [True, True, False]
    assert writes == [3]  # one statement for the batch's entries
    logged = DeliveryLog.objects.order_by("recipient")
    assert [(e.recipient, e.status, e.reply_code, e.remote_host) for e in logged] == [
        ("user0@example.org", "delivered", 250, "relay.example.net"),
        ("user1@example.org", "delivered", 250, "relay.example.net"),
        ("user2@example.org", "deferred", 451, "relay.example.net"),
    ]
    assert {str(e.item_id) for e in logged} == {i.id for i in items}


def test_a_record_the_store_refuses_as_unavailable_is_tried_again(told, monkeypatch):
    item = enqueue(["a@example.org"])
    store = get_store()
    real = store.complete_many
    calls = []

    def down_twice(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            raise QueueError("STORE_UNAVAILABLE", "The queue's database 'default' could not be used: restarting")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "complete_many", down_twice)
    monkeypatch.setattr("bumail_queue.outcomes.RECORD_RETRY_DELAYS", (0.01, 0.01, 0.01))
    stats = run(ScriptedTransport())
    assert len(calls) == 3
    assert stats.delivered == 1
    assert [name for name, _ in told] == ["delivered"]  # recorded, so never sent again
    assert store.get(item.id) is None


def spy_on_claims(monkeypatch, store, on_claim=None):
    """Record how many items each claim of ``store`` took."""
    real = store.claim
    claims = []

    def claim(**kwargs):
        taken = real(**kwargs)
        claims.append(len(taken))
        if on_claim:
            on_claim(claims)
        return taken

    monkeypatch.setattr(store, "claim", claim)
    return claims


def test_the_next_batch_is_claimed_while_the_last_of_one_is_delivered(monkeypatch):
    with override_settings(BUMAIL_QUEUE={**SETTINGS, "CLAIM_BATCH_SIZE": 4}):
        for n in range(8):
            enqueue([f"user{n}@example.org"])
        store = get_store()
        claimed_again = threading.Event()
        claims = spy_on_claims(monkeypatch, store, lambda claims: len(claims) == 2 and claimed_again.set())
        overlapped = []

        def third_of_the_first_batch(envelope):
            if len(transport.envelopes) == 3:  # its session waits for the second claim
                overlapped.append(claimed_again.wait(5))

        transport = ScriptedTransport(on_deliver=third_of_the_first_batch)
        stats = Worker(store=store, transport=transport, clock=lambda: T0, concurrency=1, burst=True).run()
    assert stats.delivered == 8
    assert overlapped == [True]  # claimed with one item still waiting, not once none did
    assert claims[:2] == [4, 4]


def test_a_worker_that_emptied_the_queue_does_not_claim_again_after_each_delivery(monkeypatch):
    for n in range(5):
        enqueue([f"user{n}@example.org"])
    store = get_store()
    claims = spy_on_claims(monkeypatch, store)
    stats = Worker(store=store, transport=ScriptedTransport(), clock=lambda: T0, concurrency=1, burst=True).run()
    assert stats.delivered == 5
    assert claims == [5, 0]  # the batch, then the look that ends the burst


def test_attempts_that_end_while_sessions_are_under_way_are_recorded_together(told, monkeypatch):
    items = [enqueue([f"user{n}@example.org"]) for n in range(10)]
    store = get_store()
    real = store.complete_many
    batches = []
    monkeypatch.setattr(
        store, "complete_many", lambda results, *, owner: (batches.append(len(results)), real(results, owner=owner))[1]
    )
    # Long enough that only the end of the sessions, not the clock, ends the wait.
    monkeypatch.setattr("bumail_queue.worker.recording.RECORD_LINGER_SECONDS", 30)
    # Each session takes a little while, as over a network, and lets the recorder run.
    transport = ScriptedTransport(on_deliver=lambda envelope: time.sleep(0.01))
    stats = Worker(store=store, transport=transport, clock=lambda: T0, concurrency=1, burst=True).run()
    assert stats.delivered == 10
    assert sum(batches) == 10
    assert batches[0] >= 9 and len(batches) <= 2  # not a commit per attempt
    assert [name for name, _ in told] == ["delivered"] * 10
    assert all(store.get(item.id) is None for item in items)


# -- each item's notifications on their own ----------------------------------------------


def _five_attempts_with_one_failure_each(worker):
    items = [enqueue([f"ok{n}@example.org", f"gone{n}@example.org"]) for n in range(5)]
    claimed = get_store().claim(owner=worker.owner, now=T0, lease_until=T0 + timedelta(minutes=10), limit=5)
    return items, [worker.attempt(item) for item in claimed]


def test_a_dsn_that_cannot_be_built_costs_only_its_own_item(told, monkeypatch):
    gone = {f"gone{n}@example.org": UNKNOWN for n in range(5)}
    worker = Worker(transport=ScriptedTransport(gone, default=OK), clock=lambda: T0, owner="w1")
    items, attempts = _five_attempts_with_one_failure_each(worker)
    broken = items[1].id
    real_build = outcomes_module.build_dsn

    def build_dsn(**kwargs):
        if kwargs["original"].id == broken:
            raise ValueError("a header the DSN cannot carry")
        return real_build(**kwargs)

    monkeypatch.setattr(outcomes_module, "build_dsn", build_dsn)
    recorded = worker.complete_many(attempts)

    assert [r is not None for r in recorded] == [True] * 5
    assert sorted(kw["of"] for name, kw in told if name == "dsn") == sorted(i.id for i in items if i.id != broken)
    assert [(kw["item_id"], type(kw["error"])) for name, kw in told if name == "error"] == [(broken, ValueError)]
    assert sum(name == "failed" for name, _ in told) == 5
    assert sum(name == "delivered" for name, _ in told) == 5
    assert DeliveryLog.objects.filter(item_id__in=[i.id for i in items]).count() == 10


def test_a_log_entry_the_database_refuses_costs_only_itself(told, monkeypatch, caplog):
    worker = Worker(transport=ScriptedTransport(default=OK), clock=lambda: T0, owner="w1")
    items, attempts = _five_attempts_with_one_failure_each(worker)
    real_write = delivery_log.write

    def write(entries):
        if any(e.recipient == "ok3@example.org" for e in entries):
            raise RuntimeError("value too long for the column")
        real_write(entries)

    monkeypatch.setattr(delivery_log, "write", write)
    worker.complete_many(attempts)

    logged = set(DeliveryLog.objects.values_list("recipient", flat=True))
    assert len(logged) == 9 and "ok3@example.org" not in logged
    assert f"a delivery log entry could not be written item={items[3].id}" in caplog.text
    assert sum(name == "delivered" for name, _ in told) == 10  # every signal was sent


def test_an_exception_while_telling_one_item_leaves_the_others_told(told, monkeypatch):
    worker = Worker(transport=ScriptedTransport(default=OK), clock=lambda: T0, owner="w1")
    items, attempts = _five_attempts_with_one_failure_each(worker)
    real_tell = worker.recorder._tell_outcomes

    def tell(attempt, recorded):
        if attempt.item.id == items[0].id:
            raise RuntimeError("a bug while telling")
        real_tell(attempt, recorded)

    monkeypatch.setattr(worker.recorder, "_tell_outcomes", tell)
    recorded = worker.complete_many(attempts)

    assert all(r is not None for r in recorded)
    assert {kw["item_id"] for name, kw in told if name == "delivered"} == {i.id for i in items[1:]}
    assert [kw["item_id"] for name, kw in told if name == "error"] == [items[0].id]
    assert all(get_store().get(i.id) is None for i in items)  # recorded all the same


def test_the_log_says_whether_the_session_ran_over_tls():
    class TLSTransport(ScriptedTransport):
        def deliver(self, envelope, *, route, hosts):
            delivery = super().deliver(envelope, route=route, hosts=hosts)
            return dataclasses.replace(delivery, tls=envelope.recipients[0].startswith("tls"))

    enqueue(["tls@example.org"])
    enqueue(["plain@example.org"])
    run(TLSTransport(default=OK))
    assert dict(DeliveryLog.objects.values_list("recipient", "tls")) == {
        "tls@example.org": True,
        "plain@example.org": False,
    }


@pytest.mark.parametrize(
    ("setting", "seconds"),
    [({}, 300.0), ({"UNREACHABLE_HOST_MEMORY": timedelta(minutes=2)}, 120.0), ({"UNREACHABLE_HOST_MEMORY": 0}, 0.0)],
)
def test_the_worker_gives_its_smtp_transport_the_unreachable_host_memory(monkeypatch, setting, seconds):
    made = []

    def transport(**options):
        made.append(options)
        return ScriptedTransport()

    monkeypatch.setattr("bumail_queue.delivery.smtp.SMTPTransport", transport)
    with override_settings(BUMAIL_QUEUE={**SETTINGS, **setting}):
        worker = Worker(clock=lambda: T0, owner="w1")
        assert made == []  # made when the first delivery needs it, not before
        assert worker.transport is worker.transport
    assert [options["unreachable_memory_seconds"] for options in made] == [seconds]
