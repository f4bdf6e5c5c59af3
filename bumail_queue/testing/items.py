# mypy: disable-error-code="union-attr"
# The tests read what a store returned without narrowing it first: a ``None`` where an
# item was due fails the test there, as it should.
"""The promises of a store about its items: add, read, renew, complete, reschedule, cancel."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from bumail_queue.errors import QueueError
from bumail_queue.items import RecipientStatus as S
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
)


class ItemsContract:
    """What a store keeps of an item and how it lets go of one: add, read, renew, complete,
    reschedule and cancel."""

    # -- add, get, list, count, read_message ------------------------------------------

    def test_add_returns_the_item_with_every_recipient_pending(self, store: QueueStore) -> None:
        added = store.add(new_item(recipients=["a@example.org", "b@example.org"], sender="s@example.com"))
        assert added.sender == "s@example.com"
        assert [(r.address, r.status, r.reply) for r in added.recipients] == [
            ("a@example.org", S.PENDING, None),
            ("b@example.org", S.PENDING, None),
        ]
        assert added.attempts == 0
        assert added.lease_owner is None
        assert added.next_attempt_at == T0
        assert store.get(added.id) == added

    def test_message_comes_back_byte_for_byte(self, store: QueueStore) -> None:
        data = b"Subject: all bytes\r\n\r\n" + bytes(range(256)) + b"\r\n"
        added = store.add(new_item(message=data))
        assert store.read_message(added.id) == data
        assert added.size == len(data)

    def test_read_messages_returns_each_known_message_by_id(self, store: QueueStore) -> None:
        first = store.add(new_item(message=b"first\r\n"))
        second = store.add(new_item(message=bytes(range(256))))
        gone = store.add(new_item())
        store.cancel(gone.id)
        found = store.read_messages([first.id, second.id, gone.id, "not-an-id", "bad\x00id"])
        assert found == {first.id: b"first\r\n", second.id: bytes(range(256))}
        assert store.read_messages([]) == {}

    def test_get_and_read_message_of_an_unknown_id_are_none(self, store: QueueStore) -> None:
        assert store.get("00000000-0000-4000-8000-000000000000") is None
        assert store.get("not-an-id") is None
        assert store.read_message("00000000-0000-4000-8000-000000000000") is None

    def test_list_is_earliest_due_first_then_oldest(self, store: QueueStore) -> None:
        late = store.add(new_item(next_attempt_at=T0 + timedelta(hours=1)))
        first = store.add(new_item())
        second = store.add(new_item())
        assert [i.id for i in store.list()] == [first.id, second.id, late.id]
        assert [i.id for i in store.list(offset=1, limit=1)] == [second.id]
        assert store.count() == 3

    def test_add_many_adds_all(self, store: QueueStore) -> None:
        added = store.add_many([new_item(), new_item(), new_item()])
        assert store.count() == 3
        assert {i.id for i in store.list()} == {i.id for i in added}

    def test_a_known_key_returns_the_queued_item_and_adds_nothing(self, store: QueueStore) -> None:
        first = store.add(new_item(key="order-42"))
        again = store.add(new_item(key="order-42", sender="other@example.com"))
        assert again.id == first.id
        assert again.sender == first.sender
        assert store.count() == 1

    def test_a_key_is_free_again_once_its_item_left(self, store: QueueStore) -> None:
        first = store.add(new_item(key="once"))
        store.cancel(first.id)
        assert store.add(new_item(key="once")).id != first.id

    def test_max_items_refuses_beyond_the_limit_and_adds_nothing(self, store: QueueStore) -> None:
        store.add_many([new_item(), new_item()], max_items=3)
        with pytest.raises(QueueError) as error:
            store.add_many([new_item(), new_item()], max_items=3)
        assert error.value.code == "FULL"
        assert store.count() == 2
        store.add(new_item(), max_items=3)
        assert store.count() == 3

    @pytest.mark.parametrize("field", ["sender", "recipient", "key"])
    @pytest.mark.parametrize("bad", ["nul\x00here@example.org", "lone\ud800@example.org"])
    def test_text_a_store_cannot_keep_is_invalid(self, store: QueueStore, field: str, bad: str) -> None:
        fields: dict[str, dict[str, Any]] = {
            "sender": {"sender": bad},
            "recipient": {"recipients": [bad]},
            "key": {"key": bad},
        }
        kwargs = fields[field]
        with pytest.raises(QueueError) as error:
            store.add(new_item(**kwargs))
        assert error.value.code == "INVALID"
        assert store.count() == 0

    def test_nothing_returned_is_shared_with_what_is_kept(self, store: QueueStore) -> None:
        added = store.add(new_item())
        added.recipients.clear()
        got = store.get(added.id)
        assert len(got.recipients) == 1
        got.recipients.append(got.recipients[0])
        assert len(store.get(added.id).recipients) == 1

    # -- renew ------------------------------------------------------------------------

    def test_renew_extends_the_owners_lease_only(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store, "w1")
        assert store.renew(added.id, owner="w2", lease_until=T0 + 2 * LEASE) is False
        assert store.renew(added.id, owner="w1", lease_until=T0 + 2 * LEASE) is True
        assert claim_one(store, "w2", now=T0 + LEASE + timedelta(seconds=1)) is None
        assert store.get(added.id).lease_expires_at == T0 + 2 * LEASE

    def test_renew_of_an_unknown_item_is_false(self, store: QueueStore) -> None:
        assert store.renew("00000000-0000-4000-8000-000000000000", owner="w1", lease_until=T0) is False

    # -- complete ---------------------------------------------------------------------

    def test_complete_records_outcomes_schedule_count_and_lets_go(self, store: QueueStore) -> None:
        added = store.add(new_item(recipients=["a@example.org", "b@example.org"]))
        claim_one(store)
        next_at = T0 + timedelta(minutes=15)
        recorded = store.complete(
            added.id,
            owner="w1",
            result=result(next_at, **{"a@example.org": (S.DELIVERED, OK), "b@example.org": (S.DEFERRED, LATER)}),
        )
        assert [(r.status, r.reply) for r in recorded.recipients] == [(S.DELIVERED, OK), (S.DEFERRED, LATER)]
        assert recorded.attempts == 1
        assert recorded.next_attempt_at == next_at
        assert recorded.lease_owner is None
        assert recorded.lease_expires_at is None
        assert store.get(added.id) == recorded
        assert claim_one(store, "w2", now=next_at - timedelta(seconds=1)) is None
        assert claim_one(store, "w2", now=next_at).id == added.id

    def test_a_final_status_never_changes(self, store: QueueStore) -> None:
        added = store.add(new_item(recipients=["a@example.org", "b@example.org"]))
        claim_one(store)
        store.complete(
            added.id,
            owner="w1",
            result=result(T0, **{"a@example.org": (S.DELIVERED, OK), "b@example.org": (S.DEFERRED, LATER)}),
        )
        claim_one(store, now=T0)
        recorded = store.complete(
            added.id,
            owner="w1",
            result=result(T0, **{"a@example.org": (S.FAILED, NO_SUCH_USER), "b@example.org": (S.DEFERRED, LATER)}),
        )
        assert recorded.recipients[0].status == S.DELIVERED
        assert recorded.recipients[0].reply == OK

    def test_an_item_whose_recipients_are_all_final_is_dropped_with_its_message(self, store: QueueStore) -> None:
        added = store.add(new_item(recipients=["a@example.org", "b@example.org"]))
        claim_one(store)
        recorded = store.complete(
            added.id,
            owner="w1",
            result=result(T0, **{"a@example.org": (S.DELIVERED, OK), "b@example.org": (S.FAILED, NO_SUCH_USER)}),
        )
        assert recorded.is_finished
        assert store.get(added.id) is None
        assert store.read_message(added.id) is None
        assert store.count() == 0

    def test_a_stale_owner_records_nothing(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store, "w1")
        claim_one(store, "w2", now=T0 + LEASE)  # w1's lease expired; w2 took the item
        with pytest.raises(QueueError) as error:
            store.complete(added.id, owner="w1", result=result(T0, **{added.recipients[0].address: (S.DELIVERED, OK)}))
        assert error.value.code == "LEASE_LOST"
        item = store.get(added.id)
        assert item.recipients[0].status == S.PENDING
        assert item.attempts == 0
        assert item.lease_owner == "w2"

    def test_complete_of_an_item_cancelled_meanwhile_is_none(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store, "w1")
        assert store.cancel(added.id) is not None
        assert store.complete(added.id, owner="w1", result=result(T0)) is None

    def test_complete_without_counting_an_attempt(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store)
        assert store.complete(added.id, owner="w1", result=result(T0, count=False)).attempts == 0

    def test_complete_refuses_reply_text_it_cannot_keep(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store)
        bad = dataclasses.replace(LATER, text="bad\x00text")
        with pytest.raises(QueueError) as error:
            store.complete(added.id, owner="w1", result=result(T0, **{added.recipients[0].address: (S.DEFERRED, bad)}))
        assert error.value.code == "INVALID"
        assert store.get(added.id).recipients[0].status == S.PENDING

    def test_complete_many_records_each_as_complete_would(self, store: QueueStore) -> None:
        finished = store.add(new_item(recipients=["a@example.org"]))
        deferred = store.add(new_item(recipients=["b@example.org"]))
        lost = store.add(new_item(recipients=["c@example.org"]))
        cancelled = store.add(new_item(recipients=["d@example.org"]))
        assert len(store.claim(owner="w1", now=T0, lease_until=T0 + LEASE, limit=4)) == 4
        store.reschedule(lost.id, at=T0, owner="w1")
        claim_one(store, "w2")  # w1 gave ``lost`` back and w2 took it
        store.cancel(cancelled.id)
        next_at = T0 + timedelta(minutes=15)
        done = store.complete_many(
            owner="w1",
            results=[
                (finished.id, result(next_at, **{"a@example.org": (S.DELIVERED, OK)})),
                (deferred.id, result(next_at, **{"b@example.org": (S.DEFERRED, LATER)})),
                (lost.id, result(next_at, **{"c@example.org": (S.DELIVERED, OK)})),
                (cancelled.id, result(next_at, **{"d@example.org": (S.DELIVERED, OK)})),
                ("not-an-id", result(next_at)),
            ],
        )
        assert done[0].is_finished
        assert store.get(finished.id) is None
        assert store.read_message(finished.id) is None
        assert done[1] == store.get(deferred.id)
        assert (done[1].recipients[0].status, done[1].attempts, done[1].next_attempt_at) == (S.DEFERRED, 1, next_at)
        assert done[1].lease_owner is None
        assert isinstance(done[2], QueueError)
        assert done[2].code == "LEASE_LOST"
        assert store.get(lost.id).recipients[0].status == S.PENDING  # nothing recorded for w1
        assert store.get(lost.id).lease_owner == "w2"
        assert done[3:] == [None, None]

    def test_complete_many_of_nothing_is_nothing(self, store: QueueStore) -> None:
        assert store.complete_many([], owner="w1") == []

    # -- reschedule, cancel -----------------------------------------------------------

    def test_reschedule_by_the_owner_gives_the_item_back_without_an_attempt(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store, "w1")
        assert store.reschedule(added.id, at=T0, owner="w2") is False
        assert store.reschedule(added.id, at=T0, owner="w1") is True
        item = store.get(added.id)
        assert (item.lease_owner, item.lease_expires_at, item.attempts, item.next_attempt_at) == (None, None, 0, T0)
        assert claim_one(store, "w2").id == added.id

    def test_reschedule_with_an_empty_owner_is_invalid(self, store: QueueStore) -> None:
        with pytest.raises(QueueError) as error:
            store.reschedule("00000000-0000-4000-8000-000000000000", at=T0, owner="")
        assert error.value.code == "INVALID"

    def test_reschedule_of_an_unknown_item_is_false(self, store: QueueStore) -> None:
        assert store.reschedule("00000000-0000-4000-8000-000000000000", at=T0) is False
        assert store.reschedule("nul\x00id", at=T0) is False

    def test_cancel_drops_the_item_and_message_and_returns_it(self, store: QueueStore) -> None:
        added = store.add(new_item())
        cancelled = store.cancel(added.id)
        assert cancelled == added
        assert store.get(added.id) is None
        assert store.read_message(added.id) is None
        assert store.cancel(added.id) is None
