# mypy: disable-error-code="union-attr"
# The tests read what a store returned without narrowing it first: a ``None`` where an
# item was due fails the test there, as it should.
"""The promises of a store about MTA-STS: policies kept per domain and TLS report counts."""

from __future__ import annotations

import dataclasses
from datetime import date, timedelta

import pytest

from bumail_queue.errors import QueueError
from bumail_queue.stores.base import QueueStore
from bumail_queue.sts import STSMode, TLSResult
from bumail_queue.testing.values import (
    LEASE,
    T0,
    sts_failure,
    sts_policy,
    tls_count,
)


class STSContract:
    """The MTA-STS policies a store keeps per domain, and the TLS report counts it adds up."""

    # -- MTA-STS policies and TLS report counts -----------------------------------------

    def test_an_sts_policy_is_kept_per_domain_the_last_put_replacing_the_one_before(self, store: QueueStore) -> None:
        assert store.get_sts_policy("example.org") is None
        first = sts_policy("example.org", id="one")
        store.put_sts_policy(first)
        store.put_sts_policy(sts_policy("example.net", id="other"))
        assert store.get_sts_policy("example.org") == first
        second = dataclasses.replace(
            first, id="two", mode=STSMode.TESTING, mx=("*.mx.example.org",), max_age=60, fetched_at=T0 + LEASE
        )
        store.put_sts_policy(second)
        assert store.get_sts_policy("example.org") == second
        assert store.get_sts_policy("example.net").id == "other"

    def test_an_expired_sts_policy_is_kept_for_the_caller_to_judge(self, store: QueueStore) -> None:
        expired = sts_policy("example.org", id="old", max_age=1, fetched_at=T0 - timedelta(days=400))
        store.put_sts_policy(expired)
        assert store.get_sts_policy("example.org") == expired

    def test_sts_policy_text_a_store_cannot_keep_is_invalid(self, store: QueueStore) -> None:
        with pytest.raises(QueueError) as caught:
            store.put_sts_policy(sts_policy("example.org", id="bad\x00"))
        assert caught.value.code == "INVALID"
        assert store.get_sts_policy("example.org") is None

    def test_a_failed_fetch_is_kept_per_domain_for_its_policy_id_until_it_lapses(self, store: QueueStore) -> None:
        failure = sts_failure("example.org", id="one", until=T0 + timedelta(minutes=5))
        store.put_sts_failure(failure)
        assert store.get_sts_failure("example.org", "one", now=T0) == failure
        assert store.get_sts_failure("example.org", "two", now=T0) is None  # another id is fetched
        assert store.get_sts_failure("example.net", "one", now=T0) is None
        assert store.get_sts_failure("example.org", "one", now=T0 + timedelta(minutes=5)) is None  # lapsed
        later = sts_failure("example.org", id="two", until=T0 + timedelta(minutes=10))
        store.put_sts_failure(later)
        assert store.get_sts_failure("example.org", "one", now=T0) is None  # replaced
        assert store.get_sts_failure("example.org", "two", now=T0) == later

    def test_a_purge_drops_the_expired_policies_and_lapsed_failures_only(self, store: QueueStore) -> None:
        store.put_sts_policy(sts_policy("old.example", id="1", max_age=60, fetched_at=T0 - timedelta(minutes=2)))
        fresh = sts_policy("fresh.example", id="1", max_age=86400, fetched_at=T0)
        store.put_sts_policy(fresh)
        store.put_sts_failure(sts_failure("lapsed.example", id="1", until=T0))
        kept = sts_failure("failing.example", id="1", until=T0 + timedelta(minutes=5))
        store.put_sts_failure(kept)
        assert store.purge_sts(now=T0) == 2
        assert store.get_sts_policy("old.example") is None
        assert store.get_sts_policy("fresh.example") == fresh
        assert store.get_sts_failure("failing.example", "1", now=T0) == kept
        assert store.purge_sts(now=T0) == 0

    def test_a_policy_fetched_again_is_not_purged_by_its_old_expiry(self, store: QueueStore) -> None:
        store.put_sts_policy(sts_policy("example.org", id="1", max_age=60, fetched_at=T0 - timedelta(minutes=2)))
        again = sts_policy("example.org", id="1", max_age=86400, fetched_at=T0)
        store.put_sts_policy(again)
        assert store.purge_sts(now=T0) == 0
        assert store.get_sts_policy("example.org") == again

    def test_failure_text_a_store_cannot_keep_is_invalid(self, store: QueueStore) -> None:
        with pytest.raises(QueueError) as caught:
            store.put_sts_failure(dataclasses.replace(sts_failure("example.org", id="1"), reason="bad\x00"))
        assert caught.value.code == "INVALID"
        assert store.get_sts_failure("example.org", "1", now=T0) is None

    def test_tls_session_counts_of_one_kind_add_up_and_keep_their_first_reason(self, store: QueueStore) -> None:
        day = date(2026, 1, 1)
        ok = tls_count(day, result=None, count=3)
        failed = tls_count(day, result=TLSResult.STARTTLS_NOT_SUPPORTED, mx_host="mx.example.org", address="192.0.2.1")
        store.count_tls_sessions([ok, failed, dataclasses.replace(ok, count=2)])
        store.count_tls_sessions([dataclasses.replace(failed, reason="said later", count=4)])
        counted = sorted(store.tls_session_counts(day), key=lambda c: c.result or "")
        assert counted == [dataclasses.replace(ok, count=5), dataclasses.replace(failed, count=5)]

    def test_tls_session_counts_of_other_kinds_stay_apart(self, store: QueueStore) -> None:
        day = date(2026, 1, 1)
        base = tls_count(day, result=TLSResult.CERTIFICATE_EXPIRED, mx_host="mx1.example.org", address="192.0.2.1")
        others = [
            dataclasses.replace(base, mx_host="mx2.example.org"),
            dataclasses.replace(base, address="2001:db8::1"),
            dataclasses.replace(base, result=TLSResult.CERTIFICATE_NOT_TRUSTED),
            dataclasses.replace(base, policy_id="2", policy=("version: STSv1", "mode: none", "max_age: 1")),
            dataclasses.replace(base, domain="example.net"),
            dataclasses.replace(base, day=date(2026, 1, 2)),
        ]
        store.count_tls_sessions([base, *others])
        assert sorted(c.kind for c in store.tls_session_counts(day)) == sorted(c.kind for c in [base, *others[:-1]])
        assert store.tls_session_counts(date(2026, 1, 2)) == [others[-1]]
        assert store.tls_session_counts(date(2026, 1, 3)) == []

    def test_a_policy_that_could_not_be_had_is_counted_without_lines(self, store: QueueStore) -> None:
        day = date(2026, 1, 1)
        fetch_error = tls_count(day, result=TLSResult.STS_POLICY_FETCH_ERROR, policy=(), reason="HTTP 404")
        store.count_tls_sessions([fetch_error])
        assert store.tls_session_counts(day) == [fetch_error]

    def test_counting_no_tls_session_writes_nothing(self, store: QueueStore) -> None:
        store.count_tls_sessions([])
        assert store.tls_session_counts(date(2026, 1, 1)) == []

    def test_tls_count_text_a_store_cannot_keep_is_invalid_and_nothing_is_counted(self, store: QueueStore) -> None:
        day = date(2026, 1, 1)
        with pytest.raises(QueueError) as caught:
            store.count_tls_sessions([tls_count(day, result=None), tls_count(day, result=None, reason="\ud800")])
        assert caught.value.code == "INVALID"
        assert store.tls_session_counts(day) == []

    def test_purging_tls_session_counts_drops_the_days_before_the_one_given(self, store: QueueStore) -> None:
        days = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]
        store.count_tls_sessions(
            [tls_count(day, result=result) for day in days for result in (None, TLSResult.VALIDATION_FAILURE)]
        )
        assert store.purge_tls_session_counts(before=date(2026, 1, 3)) == 4
        assert store.tls_session_counts(days[0]) == store.tls_session_counts(days[1]) == []
        assert len(store.tls_session_counts(days[2])) == 2
        assert store.purge_tls_session_counts(before=date(2026, 1, 3)) == 0
