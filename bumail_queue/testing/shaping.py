# mypy: disable-error-code="union-attr"
# The tests read what a store returned without narrowing it first: a ``None`` where an
# item was due fails the test there, as it should.
"""The promises of a store that shapes: rates, concurrency slots, suspensions, slow start."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.quota import Quota
from bumail_queue.shaping import Limits, Rate, WindowChange
from bumail_queue.stores.base import QueueStore
from bumail_queue.testing.values import (
    LEASE,
    SECOND,
    T0,
    TWO_A_SECOND,
    TWO_AT_ONCE,
    ask,
    close_connections,
)


class ShapingContract:
    """The promises of a store that ``supports_shaping``; a store that does not must say
    so with ``QueueError(INVALID_OPTION)``, which is what these tests then check."""

    @staticmethod
    def _shapes(store: QueueStore) -> bool:
        if store.supports_shaping:
            return True
        with pytest.raises(QueueError) as refused:
            ask(store, TWO_AT_ONCE, slot="s1")
        assert refused.value.code == ErrorCode.INVALID_OPTION
        assert "SHAPING" in refused.value.message
        return False

    def test_a_rate_grants_its_tokens_then_says_when_the_next_comes(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        assert [ask(store, TWO_A_SECOND).granted for _ in range(2)] == [True, True]
        refused = ask(store, TWO_A_SECOND)
        assert (refused.granted, refused.reason, refused.retry_at) == (False, "rate", T0 + SECOND / 2)
        assert ask(store, TWO_A_SECOND, at=T0 + SECOND / 2).granted
        assert not ask(store, TWO_A_SECOND, at=T0 + SECOND / 2).granted
        # A long pause refills the bucket to one second's worth, no more.
        later = T0 + timedelta(hours=1)
        assert [ask(store, TWO_A_SECOND, at=later).granted for _ in range(3)] == [True, True, False]

    def test_an_hourly_rate_spaces_messages_out(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        hourly = Limits(rate=Rate(count=60, period=3600.0))
        assert ask(store, hourly).granted
        refused = ask(store, hourly, at=T0 + SECOND)
        assert (refused.reason, refused.retry_at) == ("rate", T0 + timedelta(minutes=1))

    def test_concurrency_grants_its_slots_and_frees_one_when_a_session_ends(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        first, second = ask(store, TWO_AT_ONCE, slot="s1"), ask(store, TWO_AT_ONCE, slot="s2")
        assert (first.granted, second.granted, second.sessions, second.limit) == (True, True, 2, 2)
        refused = ask(store, TWO_AT_ONCE, slot="s3")
        assert (refused.granted, refused.reason, refused.retry_at, refused.sessions) == (False, "concurrency", None, 2)
        store.release_permit("example.org", slot="s1", now=T0 + SECOND)
        assert ask(store, TWO_AT_ONCE, slot="s3", at=T0 + SECOND).granted

    def test_a_crashed_workers_slot_is_free_once_its_lease_ends(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        ask(store, TWO_AT_ONCE, slot="crashed-1", lease=timedelta(minutes=1))
        ask(store, TWO_AT_ONCE, slot="crashed-2", lease=timedelta(minutes=1))
        assert not ask(store, TWO_AT_ONCE, slot="s3", at=T0 + timedelta(seconds=59)).granted
        assert ask(store, TWO_AT_ONCE, slot="s3", at=T0 + timedelta(minutes=1, seconds=1)).granted

    def test_a_renewed_slot_outlives_its_first_lease(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        ask(store, Limits(concurrency=1), slot="long", lease=timedelta(minutes=1))
        assert store.renew_permit("example.org", slot="long", now=T0 + SECOND, until=T0 + timedelta(minutes=5))
        assert not ask(store, Limits(concurrency=1), slot="s2", at=T0 + timedelta(minutes=2)).granted
        store.release_permit("example.org", slot="long", now=T0 + timedelta(minutes=3))
        assert not store.renew_permit(
            "example.org", slot="long", now=T0 + timedelta(minutes=3), until=T0 + timedelta(minutes=9)
        )
        assert not store.renew_permit("never.example", slot="x", now=T0, until=T0 + LEASE)

    def test_a_refusal_takes_nothing(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        one_a_second_alone = Limits(concurrency=1, rate=Rate(count=1, period=1.0))
        assert ask(store, one_a_second_alone, slot="s1").granted
        # The token is back a second later, but the slot is taken: refused, the token kept.
        assert ask(store, one_a_second_alone, slot="s2", at=T0 + SECOND).reason == "concurrency"
        store.release_permit("example.org", slot="s1", now=T0 + SECOND)
        assert ask(store, one_a_second_alone, slot="s2", at=T0 + SECOND).granted

    def test_a_suspension_refuses_everything_until_it_ends_and_a_later_one_stays(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        ask(store, TWO_AT_ONCE, slot="s1")
        until = T0 + timedelta(minutes=5)
        store.release_permit("example.org", slot="s1", now=T0, suspend_until=until)
        store.release_permit("example.org", slot=None, now=T0, suspend_until=T0 + timedelta(minutes=1))
        refused = ask(store, TWO_AT_ONCE, slot="s2", at=T0 + timedelta(minutes=4))
        assert (refused.granted, refused.reason, refused.retry_at) == (False, "suspended", until)
        assert ask(store, TWO_AT_ONCE, slot="s2", at=until + SECOND).granted
        # A destination never asked before can be suspended too.
        store.release_permit("other.example", slot=None, now=T0, suspend_until=until)
        assert ask(store, TWO_A_SECOND, key="other.example").reason == "suspended"

    def test_slow_start_grows_by_one_per_success_and_halves_on_a_connection_limit(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        slow = Limits(concurrency=4, slow_start=1)
        assert ask(store, slow, slot="a").granted
        refused = ask(store, slow, slot="b")
        assert (refused.granted, refused.limit) == (False, 1)
        store.release_permit("example.org", slot="a", now=T0, change=WindowChange.GROW, concurrency=4)
        assert [ask(store, slow, slot=s).granted for s in "abc"] == [True, True, False]
        for s in "ab":
            store.release_permit("example.org", slot=s, now=T0, change=WindowChange.GROW, concurrency=4)
        for _ in range(5):  # never beyond CONCURRENCY
            store.release_permit("example.org", slot=None, now=T0, change=WindowChange.GROW, concurrency=4)
        assert [ask(store, slow, slot=s).granted for s in "abcde"] == [True, True, True, True, False]
        store.release_permit("example.org", slot="a", now=T0, change=WindowChange.HALVE, concurrency=4)
        assert [state.window for state in store.destination_states(now=T0)] == [2]
        store.release_permit("example.org", slot="b", now=T0, change=WindowChange.HALVE, concurrency=4)
        store.release_permit("example.org", slot="c", now=T0, change=WindowChange.HALVE, concurrency=4)
        store.release_permit("example.org", slot="d", now=T0, change=WindowChange.HALVE, concurrency=4)
        assert [state.window for state in store.destination_states(now=T0)] == [1]  # at least one

    def test_slow_start_starts_again_after_a_quiet_spell(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        slow = Limits(concurrency=4, slow_start=2)
        ask(store, slow, slot="a")
        for _ in range(2):
            store.release_permit("example.org", slot="a", now=T0, change=WindowChange.GROW, concurrency=4)
        assert ask(store, slow, slot="b", at=T0 + SECOND).limit == 4
        store.release_permit("example.org", slot="b", now=T0 + SECOND)
        assert ask(store, slow, slot="c", at=T0 + timedelta(hours=1)).limit == 2

    def test_destinations_are_kept_apart(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        one = Limits(concurrency=1)
        assert ask(store, one, slot="a", key="one.example").granted
        assert ask(store, one, slot="b", key="two.example").granted
        assert not ask(store, one, slot="c", key="one.example").granted

    def test_states_show_sessions_suspension_and_held_items(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        assert store.destination_states(now=T0) == []
        ask(store, TWO_AT_ONCE, slot="s1", key="busy.example")
        ask(store, TWO_A_SECOND, key="held.example", held=7, held_until=T0 + timedelta(minutes=2))
        ask(store, TWO_A_SECOND, key="held.example", held=3, held_until=T0 + timedelta(minutes=1))
        store.release_permit("slow.example", slot=None, now=T0, suspend_until=T0 + timedelta(minutes=5))
        states = {state.key: state for state in store.destination_states(now=T0 + SECOND)}
        assert set(states) == {"busy.example", "held.example", "slow.example"}
        assert (states["busy.example"].sessions, states["busy.example"].is_throttled(T0 + SECOND)) == (1, False)
        assert (states["held.example"].held, states["held.example"].held_until) == (10, T0 + timedelta(minutes=2))
        assert states["slow.example"].suspended_until == T0 + timedelta(minutes=5)
        assert states["slow.example"].is_throttled(T0 + SECOND)
        # Once its held items are due, a destination counts them from nothing again.
        later = T0 + timedelta(minutes=3)
        ask(store, TWO_A_SECOND, key="held.example", at=later, held=1, held_until=later + SECOND)
        assert {s.key: s.held for s in store.destination_states(now=later)}["held.example"] == 1

    def test_idle_destinations_are_forgotten_and_start_anew(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        ask(store, Limits(rate=Rate(count=1, period=3600.0)), key="idle.example")
        store.release_permit("slow.example", slot=None, now=T0, suspend_until=T0 + timedelta(hours=3))
        later = T0 + timedelta(hours=2)
        assert store.forget_idle_destinations(before=later - timedelta(hours=1), now=later) == 1
        assert [state.key for state in store.destination_states(now=later)] == ["slow.example"]
        assert ask(store, Limits(rate=Rate(count=1, period=3600.0)), key="idle.example", at=later).granted

    def test_slots_hold_under_concurrent_requests(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        three = Limits(concurrency=3)
        granted: list[bool] = []
        start = threading.Barrier(12)

        def take(n: int) -> None:
            start.wait()
            try:
                granted.append(ask(store, three, slot=f"s{n}").granted)
            finally:
                close_connections()

        threads = [threading.Thread(target=take, args=(n,)) for n in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(granted) == [False] * 9 + [True] * 3

    # -- QUOTA and WARMUP ---------------------------------------------------------------

    def test_a_quota_counts_what_was_sent_in_the_rolling_window(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        assert ask(store, FIVE_A_DAY, cost=2).granted
        assert ask(store, FIVE_A_DAY, cost=2, at=T0 + HOUR).granted
        refused = ask(store, FIVE_A_DAY, cost=2, at=T0 + 2 * HOUR)
        # Room for two comes when the first hour's bin has left the 24 hours behind.
        assert (refused.granted, refused.reason, refused.retry_at) == (False, "quota", T0 + DAY + HOUR)
        assert ask(store, FIVE_A_DAY, cost=1, at=T0 + 2 * HOUR).granted  # one more fits: 5 of 5
        assert not ask(store, FIVE_A_DAY, cost=1, at=T0 + DAY).granted  # T0's bin is still within it
        assert ask(store, FIVE_A_DAY, cost=2, at=T0 + DAY + HOUR).granted
        assert not ask(store, FIVE_A_DAY, cost=1, at=T0 + DAY + HOUR).granted

    def test_a_refusal_for_the_quota_counts_nothing_and_other_limits_come_after_it(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        one_a_second = Limits(rate=Rate(count=1, period=1.0), quota=Quota(count=2, period=3600.0))
        assert ask(store, one_a_second).granted
        assert ask(store, one_a_second, at=T0 + SECOND).granted
        assert ask(store, one_a_second, at=T0 + 2 * SECOND).reason == "quota"
        assert ask(store, one_a_second, at=T0 + 3 * SECOND).reason == "quota"  # no token was taken meanwhile
        # An hour's quota is counted in bins of 150 seconds: the first leaves at 1:02:30.
        later = T0 + timedelta(hours=1, seconds=150)
        assert [ask(store, one_a_second, at=later).granted for _ in range(2)] == [True, False]

    def test_a_message_larger_than_the_quota_goes_alone_into_an_empty_window(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        assert ask(store, FIVE_A_DAY, cost=8).granted
        refused = ask(store, FIVE_A_DAY, cost=1, at=T0 + HOUR)
        assert (refused.reason, refused.retry_at) == ("quota", T0 + DAY + HOUR)

    def test_a_warm_up_follows_its_schedule_day_by_day(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        # Two a day for the first day, four a day for the next two, then 100.
        warming = Limits(quota=Quota(count=100, warmup=((1, 2), (2, 4)), warmup_start=T0 - 12 * HOUR))
        assert [ask(store, warming, at=T0).granted for _ in range(3)] == [True, True, False]
        day_two = T0 + 12 * HOUR  # the second day of the warm-up; the first day's two still count
        assert [ask(store, warming, at=day_two).granted for _ in range(3)] == [True, True, False]
        # Later on the second day the first day's two have left the window, the second's not.
        assert [ask(store, warming, at=T0 + DAY + HOUR).granted for _ in range(3)] == [True, True, False]
        warmed = T0 + 4 * DAY
        assert sum(ask(store, warming, at=warmed).granted for _ in range(101)) == 100

    def test_states_show_a_quotas_count_and_keep_it_while_it_is_in_the_window(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        ask(store, FIVE_A_DAY, cost=3, key="quota.example")
        states = {state.key: state for state in store.destination_states(now=T0 + 2 * HOUR)}
        assert (states["quota.example"].quota_used, states["quota.example"].quota_period) == (3, 86400.0)
        assert states["quota.example"].to_dict()["quota_used"] == 3
        later = T0 + 3 * HOUR  # idle for hours, but what it counted is still in its window
        assert store.forget_idle_destinations(before=later - HOUR, now=later) == 0
        assert not ask(store, FIVE_A_DAY, cost=3, key="quota.example", at=later).granted
        gone = T0 + DAY + 2 * HOUR
        assert {s.key: s.quota_used for s in store.destination_states(now=gone)} == {"quota.example": 0}
        assert store.forget_idle_destinations(before=gone - HOUR, now=gone) == 1

    def test_a_quota_holds_under_concurrent_requests(self, store: QueueStore) -> None:
        if not self._shapes(store):
            return
        granted: list[bool] = []
        start = threading.Barrier(12)

        def take() -> None:
            start.wait()
            try:
                granted.append(ask(store, FIVE_A_DAY).granted)
            finally:
                close_connections()

        threads = [threading.Thread(target=take) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(granted) == [False] * 7 + [True] * 5


HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
FIVE_A_DAY = Limits(quota=Quota(count=5))
