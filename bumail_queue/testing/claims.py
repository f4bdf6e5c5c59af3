# mypy: disable-error-code="union-attr"
# The tests read what a store returned without narrowing it first: a ``None`` where an
# item was due fails the test there, as it should.
"""The promises of a store about its claims: what is due, by id, and in which order."""

from __future__ import annotations

import builtins
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

from bumail_queue.errors import QueueError
from bumail_queue.items import RecipientStatus as S
from bumail_queue.queries import ItemQuery
from bumail_queue.stores.base import QueueStore
from bumail_queue.testing.values import (
    LATER,
    LEASE,
    OK,
    T0,
    claim_one,
    new_item,
    require_claims_by_id,
    result,
)


class ClaimsContract:
    """Which items a claim hands out, to whom, and in which order: what is due, named items
    (the delivery tasks' claims by id), priorities and channels."""

    # -- claim --------------------------------------------------------------------------

    def test_claim_takes_due_items_earliest_first_and_leases_them(self, store: QueueStore) -> None:
        later = store.add(new_item(next_attempt_at=T0 - timedelta(minutes=1)))
        earliest = store.add(new_item(next_attempt_at=T0 - timedelta(minutes=5)))
        store.add(new_item(next_attempt_at=T0 + timedelta(minutes=1)))  # not due
        claimed = store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=10)
        assert [i.id for i in claimed] == [earliest.id, later.id]
        for item in claimed:
            assert item.lease_owner == "w1"
            assert item.lease_expires_at == T0 + LEASE
            # The lease doubles as the retry time: a crashed worker's item falls due.
            assert item.next_attempt_at == T0 + LEASE
            assert store.get(item.id) == item

    def test_claim_respects_the_limit(self, store: QueueStore) -> None:
        store.add_many([new_item() for _ in range(5)])
        assert len(store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=3)) == 3
        assert len(store.claim(owner="w2", now=T0, lease_until=T0 + LEASE, limit=3)) == 2

    def test_a_leased_item_is_not_claimed_again(self, store: QueueStore) -> None:
        store.add(new_item())
        assert claim_one(store, "w1") is not None
        assert claim_one(store, "w2", now=T0 + LEASE - timedelta(seconds=1)) is None

    def test_an_expired_lease_is_claimable(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store, "w1")
        again = claim_one(store, "w2", now=T0 + LEASE)
        assert again.id == added.id
        assert again.lease_owner == "w2"

    def test_equally_due_items_come_oldest_first(self, store: QueueStore) -> None:
        ids = [store.add(new_item()).id for _ in range(4)]
        assert [claim_one(store).id for _ in ids] == ids

    def test_claim_with_an_empty_owner_is_invalid(self, store: QueueStore) -> None:
        with pytest.raises(QueueError) as error:
            store.claim(owner="", now=T0, lease_until=T0 + LEASE)
        assert error.value.code == "INVALID"

    # -- claim by id: the delivery tasks ------------------------------------------------

    def test_claim_items_leases_the_named_due_items_oldest_first_and_no_other(self, store: QueueStore) -> None:
        require_claims_by_id(store)
        older = store.add(new_item(next_attempt_at=T0 - timedelta(minutes=1)))
        other = store.add(new_item(next_attempt_at=T0 - timedelta(minutes=5)))  # due earlier, not named
        newer = store.add(new_item(next_attempt_at=T0 - timedelta(minutes=9)))
        claimed = store.claim_items([newer.id, older.id], owner="task", now=T0, lease_until=T0 + LEASE)
        assert [i.id for i in claimed] == [older.id, newer.id]
        for item in claimed:
            assert (item.lease_owner, item.lease_expires_at, item.next_attempt_at) == ("task", T0 + LEASE, T0 + LEASE)
            assert store.get(item.id) == item
        assert store.get(other.id).lease_owner is None
        assert [i.id for i in store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=10)] == [other.id]

    def test_claim_items_passes_over_items_not_due_leased_or_unknown(self, store: QueueStore) -> None:
        require_claims_by_id(store)
        later = store.add(new_item(next_attempt_at=T0 + timedelta(seconds=1)))
        leased = store.add(new_item())
        assert claim_one(store, "w1").id == leased.id
        due = store.add(new_item())
        unknown = ["00000000-0000-4000-8000-000000000000", "not-an-id", "nul\x00", ""]
        claimed = store.claim_items(
            [later.id, leased.id, *unknown, due.id, due.id], owner="task", now=T0, lease_until=T0 + LEASE
        )
        assert [i.id for i in claimed] == [due.id]
        assert store.get(later.id).lease_owner is None
        assert store.get(leased.id).lease_owner == "w1"
        assert store.claim_items([], owner="task", now=T0, lease_until=T0 + LEASE) == []

    def test_of_two_claimers_naming_one_item_one_gets_it_until_its_lease_expires(self, store: QueueStore) -> None:
        require_claims_by_id(store)
        added = store.add(new_item())
        first = store.claim_items([added.id], owner="task-1", now=T0, lease_until=T0 + LEASE)
        second = store.claim_items([added.id], owner="task-2", now=T0, lease_until=T0 + LEASE)
        assert ([i.id for i in first], second) == ([added.id], [])
        assert claim_one(store, "w1", now=T0 + LEASE - timedelta(seconds=1)) is None
        again = store.claim_items([added.id], owner="task-2", now=T0 + LEASE, lease_until=T0 + 2 * LEASE)
        assert [(i.id, i.lease_owner) for i in again] == [(added.id, "task-2")]

    def test_claim_items_racing_in_threads_never_hands_an_item_out_twice(self, store: QueueStore) -> None:
        require_claims_by_id(store)
        ids = [item.id for item in store.add_many([new_item() for _ in range(30)])]
        start = threading.Barrier(4)

        def claim(owner: str) -> builtins.list[str]:
            try:
                start.wait()
                return [i.id for i in store.claim_items(ids, owner=owner, now=T0, lease_until=T0 + LEASE)]
            finally:
                connections.close_all()

        with ThreadPoolExecutor(max_workers=4) as pool:
            got = list(pool.map(claim, ["t1", "t2", "t3", "t4"]))
        handed_out = [item_id for claimed in got for item_id in claimed]
        assert sorted(handed_out) == sorted(ids)

    def test_an_item_claimed_by_id_is_completed_by_its_owner_only(self, store: QueueStore) -> None:
        require_claims_by_id(store)
        added = store.add(new_item(recipients=["a@example.org"]))
        store.claim_items([added.id], owner="task", now=T0, lease_until=T0 + LEASE)
        with pytest.raises(QueueError) as error:
            store.complete(added.id, owner="w1", result=result(T0, **{"a@example.org": (S.DELIVERED, OK)}))
        assert error.value.code == "LEASE_LOST"
        assert store.complete(added.id, owner="task", result=result(T0, **{"a@example.org": (S.DELIVERED, OK)}))
        assert store.get(added.id) is None

    def test_claim_items_with_an_empty_owner_is_invalid(self, store: QueueStore) -> None:
        require_claims_by_id(store)
        with pytest.raises(QueueError) as error:
            store.claim_items([str(uuid.uuid4())], owner="", now=T0, lease_until=T0 + LEASE)
        assert error.value.code == "INVALID"

    def test_retry_now_on_a_leased_item_keeps_the_lease(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store, "w1")
        assert store.reschedule(added.id, at=T0) is True
        assert claim_one(store, "w2", now=T0 + timedelta(seconds=1)) is None
        assert store.get(added.id).lease_owner == "w1"

    # -- priorities and channels: the claim's order -------------------------------------

    def test_an_item_keeps_its_priority_and_channel(self, store: QueueStore) -> None:
        added = store.add(new_item(priority=-7, channel="news.weekly"))
        plain = store.add(new_item())
        assert (added.priority, added.channel) == (-7, "news.weekly")
        assert (plain.priority, plain.channel) == (0, "default")
        assert store.get(added.id) == added
        assert {(i.priority, i.channel) for i in store.list()} == {(-7, "news.weekly"), (0, "default")}
        claimed = store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=2)
        assert {(i.priority, i.channel) for i in claimed} == {(-7, "news.weekly"), (0, "default")}

    @pytest.mark.parametrize(
        ("field", "bad"),
        [("priority", 101), ("priority", -101), ("priority", True), ("channel", ""), ("channel", "two words")],
    )
    def test_a_priority_or_channel_out_of_range_is_invalid(self, store: QueueStore, field: str, bad: Any) -> None:
        with pytest.raises(QueueError) as error:
            store.add_many([new_item(), new_item(**{field: bad})])
        assert error.value.code == "INVALID"
        assert store.count() == 0

    def test_claim_takes_higher_priorities_first_among_due_items(self, store: QueueStore) -> None:
        low = store.add(new_item(priority=-3, next_attempt_at=T0 - timedelta(minutes=9)))
        normal = store.add(new_item(next_attempt_at=T0 - timedelta(minutes=5)))
        high_late = store.add(new_item(priority=5, next_attempt_at=T0 - timedelta(minutes=1)))
        high_early = store.add(new_item(priority=5, next_attempt_at=T0 - timedelta(minutes=2)))
        store.add(new_item(priority=100, next_attempt_at=T0 + timedelta(seconds=1)))  # not due
        claimed = store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=10)
        assert [i.id for i in claimed] == [high_early.id, high_late.id, normal.id, low.id]

    def test_five_high_priority_items_behind_300_others_come_in_the_first_batch(self, store: QueueStore) -> None:
        store.add_many([new_item(created_at=T0 - timedelta(minutes=1)) for _ in range(300)])
        urgent = {item.id for item in store.add_many([new_item(priority=10) for _ in range(5)])}
        claimed = store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=50)
        assert len(claimed) == 50
        assert [i.id for i in claimed[:5]] == [i.id for i in claimed if i.id in urgent]
        assert {i.id for i in claimed[:5]} == urgent

    def test_five_items_of_another_channel_behind_300_of_a_bulk_one_come_in_the_first_batch(
        self, store: QueueStore
    ) -> None:
        store.add_many([new_item(channel="bulk", created_at=T0 - timedelta(minutes=1)) for _ in range(300)])
        alerts = {item.id for item in store.add_many([new_item(channel="alerts") for _ in range(5)])}
        claimed = store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=50)
        assert len(claimed) == 50
        assert alerts <= {i.id for i in claimed}
        # The channels take turns: one of each, until the smaller has no more.
        assert [i.channel for i in claimed[:10]] == ["alerts", "bulk"] * 5 or [i.channel for i in claimed[:10]] == [
            "bulk",
            "alerts",
        ] * 5
        assert {i.channel for i in claimed[10:]} == {"bulk"}

    def test_channels_take_turns_and_priority_orders_each_turn(self, store: QueueStore) -> None:
        a1 = store.add(new_item(channel="a", next_attempt_at=T0 - timedelta(minutes=3)))
        a2 = store.add(new_item(channel="a", next_attempt_at=T0 - timedelta(minutes=2)))
        a3 = store.add(new_item(channel="a", next_attempt_at=T0 - timedelta(minutes=1)))
        b_low = store.add(new_item(channel="b", priority=-1, next_attempt_at=T0 - timedelta(minutes=9)))
        b_high = store.add(new_item(channel="b", priority=1))
        c1 = store.add(new_item(channel="c", next_attempt_at=T0 - timedelta(minutes=4)))
        claimed = store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=10)
        # Turn 1: the first of each channel, the higher priority first, then the
        # channels by name; turn 2: the second of each; turn 3: what is left.
        assert [i.id for i in claimed] == [b_high.id, a1.id, c1.id, a2.id, b_low.id, a3.id]

    def test_claims_go_round_the_channels_when_they_take_fewer_than_there_are(self, store: QueueStore) -> None:
        # The first channel holds the oldest mail, and most of it; the others still
        # have their turn, one claim after another, round and round.
        store.add_many([new_item(channel="a", created_at=T0 - timedelta(hours=1)) for _ in range(20)])
        for channel in ("b", "c", "d", "e"):
            store.add_many([new_item(channel=channel) for _ in range(2)])
        taken = [
            "".join(i.channel for i in store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=2))
            for _ in range(7)
        ]
        assert taken == ["ab", "cd", "ea", "bc", "de", "aa", "aa"]

    def test_a_lane_of_items_not_due_yet_hides_no_other(self, store: QueueStore) -> None:
        # A priority's items waiting for later sort before a lower priority's due ones
        # in any one index; the claim reads each lane's front instead.
        store.add_many([new_item(priority=9, next_attempt_at=T0 + timedelta(hours=n + 1)) for n in range(50)])
        due = store.add_many([new_item(priority=1) for _ in range(3)])
        claimed = store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=5)
        assert [i.id for i in claimed] == [i.id for i in due]

    def test_an_item_keeps_its_lane_through_leases_and_retries(self, store: QueueStore) -> None:
        urgent = store.add(new_item(priority=50, channel="alerts"))
        claim_one(store, "w1")
        store.add_many([new_item(channel="alerts") for _ in range(3)])
        address = urgent.recipients[0].address
        store.complete(
            urgent.id, owner="w1", result=result(T0 + timedelta(minutes=1), **{address: (S.DEFERRED, LATER)})
        )
        later = T0 + timedelta(minutes=2)
        assert claim_one(store, "w2", now=later).id == urgent.id
        # Given back by a stopping worker, then its lease expired: first again each time.
        assert store.reschedule(urgent.id, at=later, owner="w2") is True
        assert claim_one(store, "w3", now=later).id == urgent.id
        assert claim_one(store, "w4", now=later + LEASE).id == urgent.id
        retried = store.get(urgent.id)
        assert (retried.priority, retried.channel, retried.attempts) == (50, "alerts", 1)

    def test_lanes_lists_the_lanes_that_hold_an_item(self, store: QueueStore) -> None:
        assert store.lanes() == []
        store.add_many([new_item(channel="bulk", priority=-5), new_item(), new_item(priority=3), new_item()])
        leased = store.add(new_item(channel="alerts", priority=9))
        claim_one(store)  # the alert: its lane stays while it is being delivered
        assert store.get(leased.id).lease_owner == "w1"
        assert store.lanes() == [("alerts", 9), ("bulk", -5), ("default", 3), ("default", 0)]
        store.cancel(leased.id)
        assert ("alerts", 9) not in store.lanes()

    def test_search_by_channel_and_priority(self, store: QueueStore) -> None:
        bulk = store.add_many([new_item(channel="bulk", priority=-5), new_item(channel="bulk")])
        store.add(new_item())
        assert [i.id for i in store.search(ItemQuery(now=T0, channel="bulk"))] == [i.id for i in bulk]
        assert [i.id for i in store.search(ItemQuery(now=T0, channel="bulk", priority=-5))] == [bulk[0].id]
        assert len(store.search(ItemQuery(now=T0, priority=0))) == 2
        assert store.search(ItemQuery(now=T0, channel="none")) == []

    def test_summary_counts_each_lane(self, store: QueueStore) -> None:
        store.add_many([new_item(channel="bulk", priority=-5) for _ in range(3)])
        store.add(new_item(channel="bulk", priority=-5, next_attempt_at=T0 + timedelta(hours=1)))
        store.add_many([new_item(), new_item()])
        claim_one(store)  # being delivered: not due
        lanes = [(n.channel, n.priority, n.total, n.due) for n in store.summary(now=T0).lanes]
        assert lanes == [("bulk", -5, 4, 3), ("default", 0, 2, 1)]

    def test_claim_items_takes_each_item_out_of_its_lane(self, store: QueueStore) -> None:
        require_claims_by_id(store)
        alert = store.add(new_item(priority=9, channel="alerts"))
        bulk = store.add_many([new_item(priority=-5, channel="bulk") for _ in range(3)])
        plain = store.add(new_item())
        claimed = store.claim_items([bulk[1].id, alert.id], owner="task", now=T0, lease_until=T0 + LEASE)
        assert [(i.id, i.priority, i.channel) for i in claimed] == [(alert.id, 9, "alerts"), (bulk[1].id, -5, "bulk")]
        # A claim takes only the others: no item claimed by id is handed out twice.
        rest = store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=10)
        assert sorted(i.id for i in rest) == sorted([bulk[0].id, bulk[2].id, plain.id])
        assert ("alerts", 9) in store.lanes()  # its lane stays while it is delivered
        # Deferred, it is due again in its lane, before its channel's lower priorities.
        address = alert.recipients[0].address
        later = T0 + timedelta(minutes=1)
        store.complete(alert.id, owner="task", result=result(later, **{address: (S.DEFERRED, LATER)}))
        store.add(new_item(channel="alerts"))
        assert [i.id for i in store.claim(owner="w2", now=later, lease_until=later + LEASE, limit=1)] == [alert.id]

    def test_an_item_held_back_goes_back_to_its_lane_with_no_attempt(self, store: QueueStore) -> None:
        # As the worker gives back an item whose destination shaping had no room for:
        # no outcome, no attempt, due when the destination has room.
        held = store.add(new_item(priority=20, channel="alerts"))
        claim_one(store, "w1")
        store.add_many([new_item(channel="alerts") for _ in range(2)])
        room_at = T0 + timedelta(seconds=30)
        recorded = store.complete(held.id, owner="w1", result=result(room_at, count=False))
        assert recorded is not None
        assert (recorded.attempts, recorded.lease_owner, recorded.next_attempt_at) == (0, None, room_at)
        assert (recorded.priority, recorded.channel) == (20, "alerts")
        before = room_at - timedelta(seconds=1)
        assert [i.id for i in store.claim(owner="w2", now=before, lease_until=before + LEASE, limit=1)] != [held.id]
        assert claim_one(store, "w3", now=room_at).id == held.id

    def test_retries_make_deferred_items_due_in_their_lanes(self, store: QueueStore) -> None:
        lanes = [("bulk", -5), ("alerts", 9), ("alerts", 0)]
        added = [store.add(new_item(channel=c, priority=p)) for c, p in lanes]
        first = {i.id for i in store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=3)}
        assert first == {i.id for i in added}
        until = T0 + timedelta(hours=1)
        for item in added:
            store.complete(
                item.id, owner="w1", result=result(until, **{item.recipients[0].address: (S.DEFERRED, LATER)})
            )
        # In the fair order: the higher priority first in a turn, then the channel's next.
        expected = [added[1].id, added[0].id, added[2].id]
        now = T0 + timedelta(minutes=1)
        assert store.retry_deferred(now=now) == 3
        claimed = store.claim(owner="w2", now=now, lease_until=now + LEASE, limit=3)
        assert [i.id for i in claimed] == expected
        for item in claimed:
            store.complete(
                item.id, owner="w2", result=result(until, **{item.recipients[0].address: (S.DEFERRED, LATER)})
            )
        later = now + timedelta(minutes=1)
        assert store.retry_items([i.id for i in added], now=later).due == 3
        again = store.claim(owner="w3", now=later, lease_until=later + LEASE, limit=3)
        assert [(i.id, i.priority, i.channel, i.attempts) for i in again] == [
            (item.id, item.priority, item.channel, 2) for item in (added[1], added[0], added[2])
        ]

    def test_gauges_count_the_due_items_of_every_lane(self, store: QueueStore) -> None:
        store.add_many([new_item(channel="bulk", priority=-5, created_at=T0 - timedelta(minutes=n)) for n in range(3)])
        oldest = store.add(new_item(channel="alerts", priority=9, created_at=T0 - timedelta(minutes=7)))
        store.add(new_item(priority=3, next_attempt_at=T0 + timedelta(hours=1)))
        gauges = store.gauges(now=T0)
        assert (gauges.total, gauges.due, gauges.first_due_at) == (5, 4, oldest.created_at)
