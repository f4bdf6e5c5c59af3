# mypy: disable-error-code="union-attr, arg-type"
# The tests read what a store returned without narrowing it first: a ``None`` where an
# item was expected fails the test there, as it should.
"""The promises of a store's bulk actions: holding and releasing, and paging a filter's items."""

from __future__ import annotations

from datetime import timedelta

from bumail_queue.queries import HELD_AT, ItemQuery, ItemState, state_of
from bumail_queue.stores.base import QueueStore
from bumail_queue.testing.values import LEASE, T0, claim_one, new_item, tried_once

#: A claim's ``now`` far past any real time, and still before ``HELD_AT``.
FAR_FUTURE = T0 + timedelta(days=365 * 500)


def every_page(store: QueueStore, query: ItemQuery, *, limit: int) -> list[list[str]]:
    """Return the ids of each page of ``query``'s items, to the last."""
    pages, cursor = [], None
    while True:
        page = store.bulk_page(query, cursor=cursor, limit=limit)
        pages.append([item.id for item in page.items])
        cursor = page.cursor
        if cursor is None:
            return pages


def ids_of(store: QueueStore, query: ItemQuery, *, limit: int = 1000) -> set[str]:
    return {item_id for page in every_page(store, query, limit=limit) for item_id in page}


class BulkContract:
    """What ``queue_hold``, ``queue_release`` and the bulk actions ask of a store."""

    # -- hold and release ---------------------------------------------------------------

    def test_a_held_item_is_never_claimed_until_released(self, store: QueueStore) -> None:
        held, other = store.add(new_item()), store.add(new_item())
        done = store.hold([held.id], now=T0)
        assert done.changed == (held.id,) and done.leased == () and done.unchanged == ()
        assert state_of(store.get(held.id), T0) == ItemState.HELD
        assert store.get(held.id).next_attempt_at == HELD_AT
        for now in (T0, T0 + timedelta(days=30), FAR_FUTURE):
            # ``other``'s lease outlasts every claim here: only ``held`` could be claimed again.
            claimed = store.claim(owner="w1", now=now, lease_until=FAR_FUTURE + LEASE, limit=10)
            assert [item.id for item in claimed] == ([other.id] if now == T0 else [])
        assert store.claim_items([held.id], owner="w2", now=FAR_FUTURE, lease_until=FAR_FUTURE + LEASE) == []

    def test_an_item_added_held_is_held_until_released(self, store: QueueStore) -> None:
        # The staging firewall adds items held: one add, no moment when a claim could take them.
        held, other = store.add_many([new_item(next_attempt_at=HELD_AT, channel="news"), new_item(channel="news")])
        assert store.get(held.id).next_attempt_at == HELD_AT
        assert state_of(store.get(held.id), T0) == ItemState.HELD
        for now in (T0, FAR_FUTURE):
            claimed = store.claim(owner="w1", now=now, lease_until=FAR_FUTURE + LEASE, limit=10)
            assert [item.id for item in claimed] == ([other.id] if now == T0 else [])
        assert store.claim_items([held.id], owner="w2", now=FAR_FUTURE, lease_until=FAR_FUTURE + LEASE) == []
        assert [item.id for item in store.search(ItemQuery(now=T0, state=ItemState.HELD))] == [held.id]
        assert store.summary(now=T0).by_state[ItemState.HELD] == 1
        assert store.hold([held.id], now=T0).unchanged == (held.id,)
        now = T0 + timedelta(minutes=5)
        assert store.release([held.id], now=now).changed == (held.id,)
        assert claim_one(store, "w3", now=now).id == held.id

    def test_a_release_makes_the_item_due_at_its_now(self, store: QueueStore) -> None:
        item = store.add(new_item(next_attempt_at=T0 + timedelta(hours=2)))
        store.hold([item.id], now=T0)
        now = T0 + timedelta(minutes=5)
        done = store.release([item.id], now=now)
        assert done.changed == (item.id,)
        released = store.get(item.id)
        assert released.next_attempt_at == now and released.attempts == 0
        assert state_of(released, now) == ItemState.QUEUED
        assert claim_one(store, "w1", now=now).id == item.id

    def test_a_hold_leaves_an_item_being_delivered_to_its_worker(self, store: QueueStore) -> None:
        item = store.add(new_item())
        leased = claim_one(store, "w1", now=T0)
        done = store.hold([item.id], now=T0 + timedelta(minutes=1))
        assert done.changed == () and done.leased == (item.id,)
        assert store.get(item.id) == leased
        # Once its lease ended without a word from its worker, it can be held.
        after = T0 + LEASE + timedelta(seconds=1)
        assert store.hold([item.id], now=after).changed == (item.id,)
        assert claim_one(store, "w2", now=after) is None
        assert state_of(store.get(item.id), after) == ItemState.HELD

    def test_what_is_not_changed_is_said(self, store: QueueStore) -> None:
        held, free = store.add(new_item()), store.add(new_item())
        store.hold([held.id], now=T0)
        missing = "00000000-0000-4000-8000-000000000000"
        again = store.hold([held.id, missing, "not an id", held.id], now=T0)
        assert again.changed == () and again.leased == ()
        assert again.unchanged == (held.id, missing, "not an id")
        released = store.release([free.id, missing, held.id], now=T0)
        assert released.changed == (held.id,) and released.unchanged == (free.id, missing)
        assert store.get(free.id).next_attempt_at == T0

    def test_held_items_are_counted_and_found_as_held(self, store: QueueStore) -> None:
        held, waiting = store.add(new_item()), store.add(new_item())
        deferred = store.add(new_item())
        store.hold([held.id], now=T0)
        now = T0 + timedelta(minutes=1)
        assert [item.id for item in store.search(ItemQuery(now=now, state=ItemState.HELD))] == [held.id]
        assert {item.id for item in store.search(ItemQuery(now=now, state=ItemState.QUEUED))} == {
            waiting.id,
            deferred.id,
        }
        summary = store.summary(now=now)
        assert summary.by_state[ItemState.HELD] == 1 and summary.by_state[ItemState.QUEUED] == 2
        assert summary.due == 2
        gauges = store.gauges(now=now)
        assert gauges.items[ItemState.HELD] == 1 and gauges.items[ItemState.QUEUED] == 2 and gauges.due == 2

    def test_retry_deferred_leaves_a_held_item_held(self, store: QueueStore) -> None:
        item = tried_once(store, ["a@example.org"])
        store.hold([item.id], now=T0 + timedelta(minutes=1))
        now = T0 + timedelta(minutes=2)
        assert store.retry_deferred(now=now) == 0
        assert store.retry_deferred(now=now, domain="example.org") == 0
        assert state_of(store.get(item.id), now) == ItemState.HELD
        assert claim_one(store, "w1", now=now) is None

    def test_a_hold_keeps_the_item_s_recipients_and_attempts(self, store: QueueStore) -> None:
        item = tried_once(store, ["a@example.org", "b@example.org"], deferred=["b@example.org"])
        store.hold([item.id], now=T0 + timedelta(minutes=1))
        store.release([item.id], now=T0 + timedelta(minutes=2))
        back = store.get(item.id)
        assert back.recipients == item.recipients and back.attempts == 1
        assert store.read_message(item.id) == store.read_message(item.id) is not None

    # -- a filter's items, a page at a time -----------------------------------------------

    def test_bulk_page_matches_each_filter(self, store: QueueStore) -> None:
        now = T0 + timedelta(hours=3)
        old = store.add(new_item(sender="News@Shop.example", recipients=["ann@one.example"], channel="news"))
        young = store.add(
            new_item(
                sender="alerts@shop.example",
                recipients=["bob@two.example", "anna@One.Example"],
                created_at=T0 + timedelta(hours=2),
            )
        )
        other = store.add(new_item(sender="x@elsewhere.example", recipients=["carl@three.example"]))
        store.hold([other.id], now=T0)

        def matching(**fields: object) -> set[str]:
            return ids_of(store, ItemQuery(now=now, **fields))

        assert matching() == {old.id, young.id, other.id}
        assert matching(domain="one.example") == {old.id, young.id}
        assert matching(channel="news") == {old.id}
        assert matching(state=ItemState.HELD) == {other.id}
        assert matching(state=ItemState.QUEUED) == {old.id, young.id}
        assert matching(older_than=timedelta(hours=2)) == {old.id, other.id}
        assert matching(sender="*@shop.example") == {old.id, young.id}
        assert matching(sender="news@shop.example") == {old.id}
        assert matching(sender="news") == set()  # the whole address
        assert matching(recipient="ann*") == {old.id, young.id}
        assert matching(recipient="ann@*") == {old.id}
        assert matching(recipient="*@THREE.example") == {other.id}
        assert matching(recipient="a_n*") == set()  # no wildcard but *
        assert matching(domain="one.example", recipient="bob*", older_than=timedelta(minutes=30)) == {young.id}

    def test_bulk_page_pages_every_item_while_items_change(self, store: QueueStore) -> None:
        items = store.add_many([new_item() for _ in range(200)])
        query = ItemQuery(now=T0)
        seen: list[str] = []
        page = store.bulk_page(query, limit=50)
        pages = 1
        gone = {items[-1].id, items[3].id}
        for item_id in gone:
            store.cancel(item_id)
        while True:
            seen += [item.id for item in page.items]
            # Between pages: hold what was read, release some, add more.
            store.hold([item.id for item in page.items], now=T0)
            store.release([item.id for item in page.items[:2]], now=T0 + timedelta(seconds=pages))
            store.add(new_item())
            if page.cursor is None:
                break
            page = store.bulk_page(query, cursor=page.cursor, limit=50)
            pages += 1
        assert {item.id for item in items} - gone <= set(seen)
        assert pages >= 2
        # Every item present throughout is on a page; none is read twice by the ORM and
        # memory stores (``seq``), and Redis's ZSCAN returns a member twice only when
        # its table is resized meanwhile.
        assert len(seen) <= len(items) + pages

    def test_bulk_page_of_an_empty_queue_ends_at_once(self, store: QueueStore) -> None:
        page = store.bulk_page(ItemQuery(now=T0), limit=10)
        assert page.items == () and page.cursor is None
