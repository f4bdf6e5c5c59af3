"""TLS reporting (RFC 8460): the worker's counts, written now and then, and the reports."""

from __future__ import annotations

from datetime import date

from bumail_queue.conf import get_settings
from bumail_queue.delivery.tlsrpt import TLSReportCounter, reports
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.stores.memory import MemoryStore
from bumail_queue.sts import TLSResult, TLSSessionCount
from bumail_queue.testing import tls_count
from tests.helpers import FakeClock

DAY = date(2026, 3, 1)


class CountingStore(MemoryStore):
    """A memory store that says how often it was asked to count, and can refuse to."""

    def __init__(self) -> None:
        super().__init__(get_settings())
        self.writes = 0
        self.down = False

    def count_tls_sessions(self, counts):
        self.writes += 1
        if self.down:
            raise QueueError(ErrorCode.STORE_UNAVAILABLE, "the store is down")
        super().count_tls_sessions(counts)


def test_the_counts_are_added_up_in_memory_and_written_every_ten_seconds():
    store, clock = CountingStore(), FakeClock()
    counter = TLSReportCounter(store, clock=clock)
    for _ in range(3):
        counter.add([tls_count(DAY, result=None)])
        counter.flush_if_due()
    assert (store.writes, store.tls_session_counts(DAY)) == (0, [])
    clock.now += 10
    counter.flush_if_due()
    assert store.writes == 1
    assert [c.count for c in store.tls_session_counts(DAY)] == [3]
    assert counter.pending() == []


def test_counts_a_store_refused_are_kept_for_the_next_write():
    store, clock = CountingStore(), FakeClock()
    counter = TLSReportCounter(store, clock=clock)
    counter.add([tls_count(DAY, result=TLSResult.CERTIFICATE_EXPIRED, count=2)])
    store.down = True
    counter.flush()
    counter.add([tls_count(DAY, result=TLSResult.CERTIFICATE_EXPIRED)])
    assert [c.count for c in counter.pending()] == [3]
    store.down = False
    counter.flush()
    assert [c.count for c in store.tls_session_counts(DAY)] == [3]


def test_a_report_holds_one_entry_per_policy_with_its_counts():
    enforce = ("version: STSv1", "mode: enforce", "mx: mx.example.org", "mx: *.example.org", "max_age: 86400")
    counts = [
        tls_count(DAY, result=None, count=7, policy=enforce),
        tls_count(DAY, result=TLSResult.STARTTLS_NOT_SUPPORTED, count=2, mx_host="mx.example.org", address="192.0.2.1", policy=enforce),
        tls_count(DAY, result=None, count=1, policy_id="0", policy=("version: STSv1", "mode: testing", "mx: a.example.org", "max_age: 60")),
        TLSSessionCount(day=DAY, domain="example.net", policy_id="x", policy=(), result=TLSResult.STS_WEBPKI_INVALID, reason="expired"),
        tls_count(date(2026, 3, 2), result=None),  # another day
    ]  # fmt: skip
    made = reports(counts, day=DAY, organization="Example", contact="tls@example.com", sender="mta.example.com")
    assert [r["report-id"] for r in made] == [
        "2026-03-01T00:00:00Z_example.net_mta.example.com",
        "2026-03-01T00:00:00Z_example.org_mta.example.com",
    ]
    net, org = made
    assert net["policies"] == [
        {
            "policy": {"policy-type": "no-policy-found", "policy-domain": "example.net"},
            "summary": {"total-successful-session-count": 0, "total-failure-session-count": 1},
            "failure-details": [{"result-type": "sts-webpki-invalid", "failed-session-count": 1, "failure-reason-code": "expired"}],
        }
    ]  # fmt: skip
    testing, enforced = org["policies"]  # by policy id: "0", then "1"
    assert testing["summary"] == {"total-successful-session-count": 1, "total-failure-session-count": 0}
    assert enforced["policy"]["mx-host"] == ["mx.example.org", "*.example.org"]
    assert enforced["summary"] == {"total-successful-session-count": 7, "total-failure-session-count": 2}
    assert enforced["failure-details"] == [
        {
            "result-type": "starttls-not-supported",
            "receiving-mx-hostname": "mx.example.org",
            "receiving-ip": "192.0.2.1",
            "failed-session-count": 2,
            "failure-reason-code": "said first",
        }
    ]
    assert (org["organization-name"], org["contact-info"]) == ("Example", "tls@example.com")
    assert org["date-range"] == {"start-datetime": "2026-03-01T00:00:00Z", "end-datetime": "2026-03-01T23:59:59Z"}
