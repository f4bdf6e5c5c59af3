# mypy: disable-error-code="union-attr"
# The tests read what a store returned without narrowing it first: a ``None`` where an
# item was due fails the test there, as it should.
"""The promises of a store to its operators and monitors: retries, searches, summaries, gauges."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from bumail_queue.items import QueueItem
from bumail_queue.items import RecipientStatus as S
from bumail_queue.queries import ChannelGauges, ItemQuery, ItemState, QueueGauges, RetryResult
from bumail_queue.stores.base import QueueStore
from bumail_queue.testing.values import (
    LATER,
    LEASE,
    NO_SUCH_USER,
    OK,
    T0,
    claim_one,
    new_item,
    result,
    tried_once,
)


class OperatorsContract:
    """What operators and monitors ask of a store: retries, searches, summaries, gauges."""

    # -- retrying for operators: retry_deferred, retry_items (queue_retry) --------------

    def test_retry_deferred_makes_items_with_a_deferred_recipient_due_without_an_attempt(
        self, store: QueueStore
    ) -> None:
        deferred = tried_once(store, ["a@one.example"])
        partly = tried_once(store, ["b@one.example", "c@two.example"], deferred=["c@two.example"])
        scheduled = store.add(new_item(next_attempt_at=T0 + timedelta(hours=1)))  # never tried: no deferred recipient
        now = T0 + timedelta(minutes=1)
        assert store.retry_deferred(now=now) == 2
        for item in (deferred, partly):
            assert store.get(item.id) == dataclasses.replace(item, next_attempt_at=now)  # attempts stay at 1
        assert store.get(scheduled.id).next_attempt_at == T0 + timedelta(hours=1)
        assert store.retry_deferred(now=now + timedelta(seconds=1)) == 0  # due already: they keep their time
        assert store.get(deferred.id).next_attempt_at == now
        claimed = store.claim(owner="w2", now=now, lease_until=now + LEASE, limit=10)
        assert {item.id for item in claimed} == {deferred.id, partly.id}

    def test_retry_deferred_leaves_an_item_being_delivered_to_its_worker(self, store: QueueStore) -> None:
        item = tried_once(store, ["a@example.org"])
        leased = claim_one(store, "w2", now=item.next_attempt_at)
        now = item.next_attempt_at + timedelta(minutes=1)
        assert store.retry_deferred(now=now) == 0
        assert store.retry_deferred(now=now, domain="example.org") == 0
        assert store.get(item.id) == leased
        assert claim_one(store, "w3", now=now) is None

    def test_retry_deferred_at_a_domain_compares_domains_as_routes_do(self, store: QueueStore) -> None:
        slow = tried_once(store, ["Late@Slow.Example"])
        unicode = tried_once(store, ["ann@bücher.example"])
        upper = tried_once(store, ["bob@BÜCHER.example"])
        a_labels = tried_once(store, ["cid@xn--bcher-kva.example"])
        tried_once(store, ["d@fast.example", "e@slow.example"], deferred=["d@fast.example"])  # slow's delivered
        tried_once(store, ["f@mail.slow.example"])
        store.add(new_item(recipients=["g@slow.example"], next_attempt_at=T0 + timedelta(hours=1)))  # pending
        now = T0 + timedelta(minutes=1)
        assert store.retry_deferred(now=now, domain="slow.example") == 1
        assert store.retry_deferred(now=now, domain="xn--bcher-kva.example") == 3
        assert store.retry_deferred(now=now, domain="example") == 0
        due = {item.id for item in store.list() if item.next_attempt_at == now}
        assert due == {slow.id, unicode.id, upper.id, a_labels.id}

    def test_retry_items_makes_the_items_named_due_whatever_their_state(self, store: QueueStore) -> None:
        deferred = tried_once(store, ["a@example.org"])
        leased = store.add(new_item())
        claim_one(store, "w2")  # until T0 + LEASE
        scheduled = store.add(new_item(next_attempt_at=T0 + timedelta(hours=1)))
        early = store.add(new_item(next_attempt_at=T0 - timedelta(minutes=1)))
        unknown = "00000000-0000-4000-8000-000000000000"
        now = T0 + timedelta(minutes=1)
        done = store.retry_items(
            [deferred.id, leased.id, scheduled.id, early.id, unknown, "not-an-id", "nul\x00id", deferred.id], now=now
        )
        assert done == RetryResult(due=3, leased=(leased.id,), missing=(unknown, "not-an-id", "nul\x00id"))
        assert store.get(deferred.id) == dataclasses.replace(deferred, next_attempt_at=now)
        assert store.get(scheduled.id).next_attempt_at == now
        assert store.get(early.id).next_attempt_at == T0 - timedelta(minutes=1)  # due earlier: kept
        assert (store.get(leased.id).lease_owner, store.get(leased.id).next_attempt_at) == ("w2", T0 + LEASE)
        assert store.retry_items([], now=now) == RetryResult(due=0)

    def test_a_retry_that_made_an_item_due_reaches_idle_workers(self, store: QueueStore) -> None:
        # A store with a listener announces it; the workers of one without it poll,
        # and their next claim takes the item at once.
        listener = store.listener()
        if listener is None:
            item = tried_once(store, ["a@example.org"])
            now = T0 + timedelta(minutes=1)
            assert claim_one(store, "w1", now=now) is None  # deferred until T0 + 30 minutes
            assert store.retry_deferred(now=now) == 1
            claimed = claim_one(store, "w1", now=now)
            assert claimed is not None and claimed.id == item.id
            return
        try:
            item = tried_once(store, ["a@example.org"])
            while listener.wait(0.2):  # the add's announcement
                pass
            assert store.retry_deferred(now=T0 + timedelta(minutes=1), domain="other.example") == 0
            assert listener.wait(0.2) is False  # nothing was made due
            assert store.retry_deferred(now=T0 + timedelta(minutes=1)) == 1
            assert listener.wait(5) is True
            store.reschedule(item.id, at=T0 + timedelta(hours=1))
            while listener.wait(0.2):  # the reschedule's
                pass
            assert store.retry_items([item.id], now=T0 + timedelta(minutes=2)).due == 1
            assert listener.wait(5) is True
        finally:
            listener.close()

    # -- reading for operators: search, message heads, summary, estimated count --------

    def _three_states(self, store: QueueStore) -> tuple[QueueItem, QueueItem, QueueItem]:
        """An item queued, one deferred, one being delivered (at T0 + 1 minute)."""
        delivering = store.add(new_item(recipients=["d@leased.example"]))
        claim_one(store, "w1")  # lease until T0 + LEASE
        deferred = store.add(new_item(recipients=["Late@Slow.Example"], sender="Billing@Shop.example"))
        claim_one(store, "w2")
        store.complete(
            deferred.id,
            owner="w2",
            result=result(T0 + timedelta(minutes=30), **{"Late@Slow.Example": (S.DEFERRED, LATER)}),
        )
        queued = store.add(
            new_item(recipients=["q@fast.example", "r@slow.example"], next_attempt_at=T0 + timedelta(minutes=5))
        )
        return queued, deferred, delivering

    def test_search_without_a_filter_is_the_list(self, store: QueueStore) -> None:
        store.add_many([new_item(), new_item(next_attempt_at=T0 - timedelta(minutes=1)), new_item()])
        now = T0 + timedelta(minutes=1)
        assert store.search(ItemQuery(now=now)) == store.list()
        assert store.search(ItemQuery(now=now), offset=1, limit=1) == store.list(offset=1, limit=1)

    def test_search_by_state(self, store: QueueStore) -> None:
        queued, deferred, delivering = self._three_states(store)
        now = T0 + timedelta(minutes=1)
        found = {state: [i.id for i in store.search(ItemQuery(now=now, state=state))] for state in ItemState}
        assert found == {
            ItemState.QUEUED: [queued.id],
            ItemState.DEFERRED: [deferred.id],
            ItemState.DELIVERING: [delivering.id],
            ItemState.HELD: [],
        }
        # Once its lease has expired, an item is no longer being delivered.
        later = T0 + LEASE + timedelta(seconds=1)
        assert [i.id for i in store.search(ItemQuery(now=later, state=ItemState.QUEUED))] == [queued.id, delivering.id]

    def test_search_by_recipient_domain_ignores_case_and_takes_whole_domains(self, store: QueueStore) -> None:
        queued, deferred, _ = self._three_states(store)
        store.add(new_item(recipients=["x@notslow.example"]))
        now = T0 + timedelta(minutes=1)
        assert [i.id for i in store.search(ItemQuery(now=now, domain="SLOW.example"))] == [queued.id, deferred.id]
        assert [i.id for i in store.search(ItemQuery(now=now, domain="slow.example", state=ItemState.DEFERRED))] == [
            deferred.id
        ]
        assert store.search(ItemQuery(now=now, domain="example")) == []

    def test_search_by_text_matches_id_sender_and_recipients(self, store: QueueStore) -> None:
        queued, deferred, delivering = self._three_states(store)
        now = T0 + timedelta(minutes=1)

        def ids(text: str) -> set[str]:
            return {i.id for i in store.search(ItemQuery(now=now, text=text))}

        assert ids(delivering.id) == {delivering.id}
        assert ids(delivering.id.upper()) == {delivering.id}
        assert ids("billing@shop") == {deferred.id}
        assert ids("q@FAST") == {queued.id}
        assert ids("@slow.example") == {queued.id, deferred.id}
        assert ids("nobody-has-this") == set()
        assert ids("100%_") == set()

    def test_search_pages_count_matching_items_only(self, store: QueueStore) -> None:
        matching = [store.add(new_item(recipients=[f"m{n}@match.example"])).id for n in range(5)]
        store.add_many([new_item() for _ in range(5)])
        now = T0
        query = ItemQuery(now=now, domain="match.example")
        assert [i.id for i in store.search(query, offset=0, limit=2)] == matching[:2]
        assert [i.id for i in store.search(query, offset=2, limit=2)] == matching[2:4]
        assert [i.id for i in store.search(query, offset=4, limit=2)] == matching[4:]

    def test_read_message_heads_gives_the_start_of_each_message(self, store: QueueStore) -> None:
        one = store.add(new_item(message=b"Subject: one\r\n\r\n" + b"x" * 100))
        two = store.add(new_item(message=b"Subject: two\r\n\r\nshort"))
        heads = store.read_message_heads([one.id, two.id, "00000000-0000-4000-8000-000000000000", "not-an-id"], size=16)
        assert heads == {one.id: b"Subject: one\r\n\r\n", two.id: b"Subject: two\r\n\r\n"}
        assert store.read_message_heads([]) == {}

    def test_summary_counts_states_and_draws_the_shape(self, store: QueueStore) -> None:
        self._three_states(store)
        old = store.add(new_item(recipients=["o@slow.example"], created_at=T0 - timedelta(hours=30)))
        now = T0 + timedelta(minutes=1)
        summary = store.summary(now=now)
        assert summary.total == 4
        assert dict(summary.by_state) == {
            ItemState.QUEUED: 2,
            ItemState.DEFERRED: 1,
            ItemState.DELIVERING: 1,
            ItemState.HELD: 0,
        }
        assert summary.oldest_created_at == old.created_at
        assert summary.due == 1  # the old one; ``queued`` is due at T0 + 5 minutes
        assert summary.pending_recipients == 5
        shape = {d.domain: d.buckets for d in summary.shape}
        assert shape == {
            "slow.example": (2, 0, 0, 0, 0, 0, 0, 0, 0, 1),
            "fast.example": (1, 0, 0, 0, 0, 0, 0, 0, 0, 0),
            "leased.example": (1, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        }
        assert summary.shape[0].domain == "slow.example"  # the most pending first
        assert store.summary(now=now, age_buckets=[timedelta(minutes=2)]).shape[0].buckets == (2, 1)

    def test_summary_leaves_final_recipients_out(self, store: QueueStore) -> None:
        added = store.add(new_item(recipients=["a@one.example", "b@two.example"]))
        claim_one(store)
        store.complete(
            added.id,
            owner="w1",
            result=result(T0, **{"a@one.example": (S.DELIVERED, OK), "b@two.example": (S.DEFERRED, LATER)}),
        )
        summary = store.summary(now=T0)
        assert [(d.domain, d.total) for d in summary.shape] == [("two.example", 1)]
        assert summary.pending_recipients == 1

    def test_summary_of_an_empty_queue(self, store: QueueStore) -> None:
        summary = store.summary(now=T0)
        assert (summary.total, summary.oldest_created_at, summary.shape, summary.due) == (0, None, (), 0)

    # -- reading for monitors: the gauges of the metrics ---------------------------------

    def test_gauges_count_items_by_state_recipients_and_ages(self, store: QueueStore) -> None:
        self._three_states(store)
        old = store.add(new_item(recipients=["o@slow.example"], created_at=T0 - timedelta(hours=30)))
        gauges = store.gauges(now=T0 + timedelta(minutes=1))
        assert gauges == QueueGauges(
            now=T0 + timedelta(minutes=1),
            items={ItemState.QUEUED: 2, ItemState.DEFERRED: 1, ItemState.DELIVERING: 1, ItemState.HELD: 0},
            recipients={S.PENDING: 4, S.DEFERRED: 1},
            oldest={
                ItemState.QUEUED: old.created_at,
                ItemState.DEFERRED: T0,
                ItemState.DELIVERING: T0,
                ItemState.HELD: None,
            },
            due=1,  # the old one: ``queued`` is due at T0 + 5 minutes, ``deferred`` at T0 + 30
            first_due_at=old.created_at,
            exact=True,
        )
        assert gauges.total == 4

    def test_gauges_take_an_expired_lease_for_due(self, store: QueueStore) -> None:
        self._three_states(store)
        later = T0 + LEASE + timedelta(seconds=1)
        gauges = store.gauges(now=later)
        assert gauges.items == {ItemState.QUEUED: 2, ItemState.DEFERRED: 1, ItemState.DELIVERING: 0, ItemState.HELD: 0}
        assert gauges.oldest[ItemState.DELIVERING] is None
        # The item whose lease expired (due at its lease's end) and the queued one.
        assert (gauges.due, gauges.first_due_at) == (2, T0 + timedelta(minutes=5))

    def test_gauges_leave_final_recipients_out(self, store: QueueStore) -> None:
        added = store.add(new_item(recipients=["a@one.example", "b@two.example", "c@two.example"]))
        claim_one(store)
        store.complete(
            added.id,
            owner="w1",
            result=result(
                T0 + timedelta(minutes=30),
                **{
                    "a@one.example": (S.DELIVERED, OK),
                    "b@two.example": (S.DEFERRED, LATER),
                    "c@two.example": (S.FAILED, NO_SUCH_USER),
                },
            ),
        )
        store.add(new_item(recipients=["d@three.example"]))
        gauges = store.gauges(now=T0)
        assert gauges.recipients == {S.PENDING: 1, S.DEFERRED: 1}
        assert gauges.items == {ItemState.QUEUED: 1, ItemState.DEFERRED: 1, ItemState.DELIVERING: 0, ItemState.HELD: 0}

    def test_gauges_of_an_empty_queue(self, store: QueueStore) -> None:
        gauges = store.gauges(now=T0)
        assert gauges == QueueGauges(
            now=T0,
            items=dict.fromkeys(ItemState, 0),
            recipients={S.PENDING: 0, S.DEFERRED: 0},
            oldest=dict.fromkeys(ItemState),
            due=0,
            first_due_at=None,
            exact=True,
        )

    def test_channel_gauges_count_each_channels_items_by_state_and_its_oldest(self, store: QueueStore) -> None:
        tried_once(store, ["a@one.example"])  # the default channel's, deferred
        store.add(new_item(channel="alerts", created_at=T0 - timedelta(minutes=9)))
        assert claim_one(store, "w1").channel == "alerts"
        store.add_many(
            [
                new_item(channel="news", created_at=T0 - timedelta(minutes=3)),
                new_item(channel="news", created_at=T0 - timedelta(minutes=1)),
            ]
        )
        now = T0 + timedelta(minutes=1)
        by_channel = store.channel_gauges(now=now)
        zero, none = dict.fromkeys(ItemState, 0), dict.fromkeys(ItemState)
        assert by_channel == {
            "default": ChannelGauges(items=zero | {ItemState.DEFERRED: 1}, oldest=none | {ItemState.DEFERRED: T0}),
            "alerts": ChannelGauges(
                items=zero | {ItemState.DELIVERING: 1},
                oldest=none | {ItemState.DELIVERING: T0 - timedelta(minutes=9)},
            ),
            "news": ChannelGauges(
                items=zero | {ItemState.QUEUED: 2}, oldest=none | {ItemState.QUEUED: T0 - timedelta(minutes=3)}
            ),
        }
        # Summed over the channels, the queue's own gauges.
        gauges = store.gauges(now=now)
        for state in ItemState:
            assert sum(channel.items[state] for channel in by_channel.values()) == gauges.items[state]

    def test_channel_gauges_of_an_empty_queue(self, store: QueueStore) -> None:
        assert store.channel_gauges(now=T0) == {}

    def test_estimated_count_of_a_small_queue_is_exact(self, store: QueueStore) -> None:
        store.add_many([new_item(), new_item(), new_item()])
        assert store.estimated_count() == 3
