# mypy: disable-error-code="union-attr"
# The tests read what a store returned without narrowing it first: a ``None`` where an
# item was due fails the test there, as it should.
"""The store contract as tests, shipped for stores of your own.

``StoreContract`` holds the promises every ``QueueStore`` keeps (``stores/base.py``
lists them). A store is held to them by a pytest test class that inherits it and a
``store`` fixture that yields a fresh, empty store::

    import pytest

    from bumail_queue.testing import StoreContract


    @pytest.fixture
    def store(settings):
        return MyStore(get_settings())


    @pytest.mark.django_db(transaction=True)
    class TestMyStore(StoreContract):
        pass

Times are made here and given to the store: a store keeps no clock. Importing this
module imports pytest; nothing else in ``bumail_queue`` does.
"""

from __future__ import annotations

import builtins
import dataclasses
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.db import connections

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import AttemptResult, NewItem, Outcome, QueueItem, Reply
from bumail_queue.items import RecipientStatus as S
from bumail_queue.queries import ItemQuery, ItemState, QueueGauges, RetryResult
from bumail_queue.shaping import Limits, Permit, PermitRequest, Rate, WindowChange
from bumail_queue.stores.base import QueueStore
from bumail_queue.sts import STSMode, STSPolicy, TLSResult, TLSSessionCount
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason

__all__ = [
    "LATER",
    "LEASE",
    "NO_SUCH_USER",
    "OK",
    "T0",
    "ShapingContract",
    "StoreContract",
    "claim_one",
    "new_item",
    "result",
    "sts_policy",
    "suppression",
    "tls_count",
    "tried_once",
]

#: The time every contract test starts at.
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
#: How long the contract's claims lease an item.
LEASE = timedelta(minutes=10)

OK = Reply(code=250, status="2.0.0", text="OK")
LATER = Reply(code=451, status="4.3.0", text="Try again later")
NO_SUCH_USER = Reply(code=550, status="5.1.1", text="No such user")

_numbers = iter(range(1, 2**63))


def new_item(
    *,
    id: str | None = None,
    sender: str | None = None,
    recipients: Sequence[str] | None = None,
    message: bytes | None = None,
    created_at: datetime = T0,
    next_attempt_at: datetime | None = None,
    key: str | None = None,
) -> NewItem:
    """Return a ``NewItem`` to add, due at its creation unless told; unique addresses each call."""
    n = next(_numbers)
    item_id = id if id is not None else str(uuid.uuid4())
    sender = sender if sender is not None else f"sender{n}@example.com"
    recipients = list(recipients) if recipients is not None else [f"rcpt{n}@example.org"]
    if message is None:
        message = f"From: {sender}\r\nTo: {', '.join(recipients)}\r\nSubject: test\r\n\r\nbody of {item_id}\r\n".encode(
            "utf-8", "replace"
        )
    return NewItem(
        id=item_id,
        sender=sender,
        recipients=recipients,
        message=message,
        created_at=created_at,
        next_attempt_at=created_at if next_attempt_at is None else next_attempt_at,
        key=key,
    )


#: How long the contract's suppression entries last, and its notes of a first expiry.
SUPPRESSED_FOR = timedelta(days=30)
EXPIRED = Reply(code=451, status="4.4.7", text="Delivery time expired after 5 days; last reply: 451 4.3.0 Later")


def suppression(
    address: str,
    *,
    at: datetime = T0,
    reason: SuppressionReason = SuppressionReason.FAILED,
    reply: Reply = NO_SUCH_USER,
    lasts: timedelta = SUPPRESSED_FOR,
) -> Suppression:
    """Return an entry for ``address`` (in its normal form), made at ``at``."""
    return Suppression(address=address, reason=reason, reply=reply, created_at=at, expires_at=at + lasts)


def claim_one(store: QueueStore, owner: str = "w1", now: datetime = T0, lease: timedelta = LEASE) -> QueueItem | None:
    """Claim the first due item at ``now`` for ``owner``, or return ``None``."""
    claimed = store.claim(owner=owner, now=now, lease_until=now + lease, limit=1)
    return claimed[0] if claimed else None


def result(next_at: datetime, **outcomes: Any) -> AttemptResult:
    """Return an attempt's result: ``address=(status, reply)`` for each recipient it decided.

    ``count=False`` records it without counting an attempt.
    """
    count = bool(outcomes.pop("count", True))
    return AttemptResult(
        outcomes={address: Outcome(status=status, reply=reply) for address, (status, reply) in outcomes.items()},
        next_attempt_at=next_at,
        count_attempt=count,
    )


def tried_once(
    store: QueueStore,
    recipients: Sequence[str],
    *,
    deferred: Sequence[str] | None = None,
    until: datetime = T0 + timedelta(minutes=30),
) -> QueueItem:
    """Add an item and record one attempt at ``T0``: ``deferred`` (every recipient unless
    told) deferred until ``until``, the others delivered. Return the item as recorded.

    It claims what is due at ``T0``: call it before adding other items due then.
    """
    added = store.add(new_item(recipients=recipients))
    claimed = claim_one(store, "tried-once")
    assert claimed.id == added.id, "another item was due at T0"
    later = set(recipients if deferred is None else deferred)
    outcomes = {address: (S.DEFERRED, LATER) if address in later else (S.DELIVERED, OK) for address in recipients}
    recorded = store.complete(added.id, owner="tried-once", result=result(until, **outcomes))
    assert recorded is not None
    return recorded


def _claims_by_id(store: QueueStore) -> None:
    """Skip a claim-by-id test for a store that says it does not claim by id: its delivery
    tasks run a pass over everything due instead (every built-in store claims by id)."""
    if not store.claims_by_id:
        pytest.skip(f"{type(store).__name__} does not claim by id (claims_by_id is False)")


def ask(
    store: QueueStore,
    limits: Limits,
    *,
    at: datetime = T0,
    slot: str | None = None,
    key: str = "example.org",
    lease: timedelta = LEASE,
    held: int = 0,
    held_until: datetime | None = None,
) -> Permit:
    """Ask ``store`` for room at ``key`` at ``at``, holding ``slot`` (if given) for ``lease``."""
    request = PermitRequest(
        key=key,
        limits=limits,
        now=at,
        slot=slot,
        slot_until=None if slot is None else at + lease,
        held=held,
        held_until=held_until,
    )
    return store.take_permit(request)


TWO_A_SECOND = Limits(rate=Rate(count=2, period=1.0))
TWO_AT_ONCE = Limits(concurrency=2)
SECOND = timedelta(seconds=1)


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


def close_connections() -> None:
    """Close this thread's database connections (a thread's own, as a worker's are)."""
    from django.db import connections

    connections.close_all()


class StoreContract(ShapingContract):
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
        _claims_by_id(store)
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
        _claims_by_id(store)
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
        _claims_by_id(store)
        added = store.add(new_item())
        first = store.claim_items([added.id], owner="task-1", now=T0, lease_until=T0 + LEASE)
        second = store.claim_items([added.id], owner="task-2", now=T0, lease_until=T0 + LEASE)
        assert ([i.id for i in first], second) == ([added.id], [])
        assert claim_one(store, "w1", now=T0 + LEASE - timedelta(seconds=1)) is None
        again = store.claim_items([added.id], owner="task-2", now=T0 + LEASE, lease_until=T0 + 2 * LEASE)
        assert [(i.id, i.lease_owner) for i in again] == [(added.id, "task-2")]

    def test_claim_items_racing_in_threads_never_hands_an_item_out_twice(self, store: QueueStore) -> None:
        _claims_by_id(store)
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
        _claims_by_id(store)
        added = store.add(new_item(recipients=["a@example.org"]))
        store.claim_items([added.id], owner="task", now=T0, lease_until=T0 + LEASE)
        with pytest.raises(QueueError) as error:
            store.complete(added.id, owner="w1", result=result(T0, **{"a@example.org": (S.DELIVERED, OK)}))
        assert error.value.code == "LEASE_LOST"
        assert store.complete(added.id, owner="task", result=result(T0, **{"a@example.org": (S.DELIVERED, OK)}))
        assert store.get(added.id) is None

    def test_claim_items_with_an_empty_owner_is_invalid(self, store: QueueStore) -> None:
        _claims_by_id(store)
        with pytest.raises(QueueError) as error:
            store.claim_items([str(uuid.uuid4())], owner="", now=T0, lease_until=T0 + LEASE)
        assert error.value.code == "INVALID"

    def test_retry_now_on_a_leased_item_keeps_the_lease(self, store: QueueStore) -> None:
        added = store.add(new_item())
        claim_one(store, "w1")
        assert store.reschedule(added.id, at=T0) is True
        assert claim_one(store, "w2", now=T0 + timedelta(seconds=1)) is None
        assert store.get(added.id).lease_owner == "w1"

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
        assert dict(summary.by_state) == {ItemState.QUEUED: 2, ItemState.DEFERRED: 1, ItemState.DELIVERING: 1}
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
            items={ItemState.QUEUED: 2, ItemState.DEFERRED: 1, ItemState.DELIVERING: 1},
            recipients={S.PENDING: 4, S.DEFERRED: 1},
            oldest={ItemState.QUEUED: old.created_at, ItemState.DEFERRED: T0, ItemState.DELIVERING: T0},
            due=1,  # the old one: ``queued`` is due at T0 + 5 minutes, ``deferred`` at T0 + 30
            first_due_at=old.created_at,
            exact=True,
        )
        assert gauges.total == 4

    def test_gauges_take_an_expired_lease_for_due(self, store: QueueStore) -> None:
        self._three_states(store)
        later = T0 + LEASE + timedelta(seconds=1)
        gauges = store.gauges(now=later)
        assert gauges.items == {ItemState.QUEUED: 2, ItemState.DEFERRED: 1, ItemState.DELIVERING: 0}
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
        assert gauges.items == {ItemState.QUEUED: 1, ItemState.DEFERRED: 1, ItemState.DELIVERING: 0}

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

    def test_estimated_count_of_a_small_queue_is_exact(self, store: QueueStore) -> None:
        store.add_many([new_item(), new_item(), new_item()])
        assert store.estimated_count() == 3

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

    # -- the suppression list -----------------------------------------------------------

    def _suppress(self, store: QueueStore, *entries: Suppression) -> None:
        store.update_suppressions(SuppressionChange(add=entries), now=entries[0].created_at)

    def _expire(self, store: QueueStore, address: str, at: datetime) -> tuple[Suppression, ...]:
        """Note one expiry of ``address`` at ``at``; return the entries it put in force."""
        entry = suppression(address, at=at, reason=SuppressionReason.EXPIRED, reply=EXPIRED)
        change = SuppressionChange(expired=(entry,), note_until=at + SUPPRESSED_FOR)
        return store.update_suppressions(change, now=at).suppressed

    def test_a_suppressed_address_is_found_however_its_domain_is_written(self, store: QueueStore) -> None:
        entry = suppression("Ann@xn--bcher-kva.example")
        self._suppress(store, entry)
        asked = ["Ann@Bücher.example", "Ann@BÜCHER.EXAMPLE.", "Ann@xn--bcher-kva.example", "ann@bücher.example"]
        found = store.suppressions_of(asked, now=T0 + timedelta(days=1))
        # The local part as written (RFC 5321 §2.4): "ann" is another mailbox.
        assert found == dict.fromkeys(asked[:3], entry)

    def test_a_batch_is_answered_for_the_suppressed_alone(self, store: QueueStore) -> None:
        gone, moved = (
            suppression("gone@example.org"),
            suppression("moved@example.net", reply=Reply(code=550, status="5.1.6", text="Moved")),
        )
        self._suppress(store, gone, moved)
        asked = [f"ok{n}@example.org" for n in range(600)] + ["gone@example.org", "moved@example.net", "nul\x00@x.org"]
        assert store.suppressions_of(asked, now=T0) == {"gone@example.org": gone, "moved@example.net": moved}
        assert store.suppressions_of([], now=T0) == {}

    def test_an_entry_past_its_time_is_never_returned(self, store: QueueStore) -> None:
        entry = suppression("gone@example.org", lasts=timedelta(days=1))
        self._suppress(store, entry)
        assert store.suppressions_of(["gone@example.org"], now=entry.expires_at - timedelta(seconds=1))
        assert store.count_suppressions(now=entry.expires_at - timedelta(seconds=1)) == 1
        after = entry.expires_at
        assert store.suppressions_of(["gone@example.org"], now=after) == {}
        assert store.search_suppressions(now=after) == []
        assert store.count_suppressions(now=after) == 0

    def test_an_entry_replaces_the_one_of_its_address(self, store: QueueStore) -> None:
        self._suppress(store, suppression("gone@example.org"))
        later = suppression(
            "gone@example.org", at=T0 + timedelta(days=3), reply=Reply(code=550, status="5.1.10", text="Null MX")
        )
        self._suppress(store, later)
        assert store.suppressions_of(["gone@example.org"], now=later.created_at) == {"gone@example.org": later}
        assert store.count_suppressions(now=later.created_at) == 1

    def test_clear_takes_entries_off_and_says_which_were_in_force(self, store: QueueStore) -> None:
        self._suppress(store, suppression("a@example.org"), suppression("b@example.org", lasts=timedelta(hours=1)))
        now = T0 + timedelta(hours=2)  # b's entry has expired
        done = store.update_suppressions(
            SuppressionChange(clear=("a@example.org", "b@example.org", "never@example.org")), now=now
        )
        assert (done.suppressed, sorted(done.removed)) == ((), ["a@example.org"])
        assert store.suppressions_of(["a@example.org", "b@example.org"], now=T0) == {}

    def test_a_second_expiry_while_the_note_lasts_suppresses(self, store: QueueStore) -> None:
        assert self._expire(store, "slow@example.org", T0) == ()
        assert store.suppressions_of(["slow@example.org"], now=T0) == {}
        assert store.search_suppressions(now=T0) == [] and store.count_suppressions(now=T0) == 0
        second = T0 + timedelta(days=29)
        [entry] = self._expire(store, "slow@example.org", second)
        assert entry == suppression("slow@example.org", at=second, reason=SuppressionReason.EXPIRED, reply=EXPIRED)
        assert store.suppressions_of(["slow@example.org"], now=second) == {"slow@example.org": entry}
        assert store.search_suppressions(now=second) == [entry]

    def test_an_expiry_after_the_note_lapsed_is_a_first_again(self, store: QueueStore) -> None:
        self._expire(store, "slow@example.org", T0)
        again = T0 + SUPPRESSED_FOR
        assert self._expire(store, "slow@example.org", again) == ()
        assert store.suppressions_of(["slow@example.org"], now=again) == {}
        assert len(self._expire(store, "slow@example.org", again + timedelta(days=1))) == 1

    def test_an_expiry_of_a_suppressed_address_keeps_its_entry(self, store: QueueStore) -> None:
        entry = suppression("gone@example.org")
        self._suppress(store, entry)
        for day in (1, 2):
            assert self._expire(store, "gone@example.org", T0 + timedelta(days=day)) == ()
        assert store.suppressions_of(["gone@example.org"], now=T0 + timedelta(days=3)) == {"gone@example.org": entry}

    def test_clear_forgets_a_note_and_no_note_forgets_nothing(self, store: QueueStore) -> None:
        self._expire(store, "slow@example.org", T0)
        store.update_suppressions(SuppressionChange(clear=("slow@example.org",)), now=T0 + timedelta(days=1))
        assert self._expire(store, "slow@example.org", T0 + timedelta(days=2)) == ()
        # Without a note_until, an expiry notes nothing but still completes a note that lasts.
        entry = suppression(
            "slow@example.org", at=T0 + timedelta(days=3), reason=SuppressionReason.EXPIRED, reply=EXPIRED
        )
        done = store.update_suppressions(SuppressionChange(expired=(entry,)), now=entry.created_at)
        assert done.suppressed == (entry,)

    def test_search_is_the_newest_first_page_by_page(self, store: QueueStore) -> None:
        entries = [suppression(f"m{n}@example.org", at=T0 + timedelta(minutes=n)) for n in range(5)]
        for entry in entries:
            self._suppress(store, entry)
        now = T0 + timedelta(hours=1)
        newest_first = entries[::-1]
        assert store.search_suppressions(now=now) == newest_first
        assert store.search_suppressions(now=now, offset=1, limit=2) == newest_first[1:3]
        assert store.search_suppressions(now=now, offset=4, limit=2) == newest_first[4:]
        assert store.search_suppressions(now=now, limit=0) == []
        assert store.count_suppressions(now=now) == 5

    def test_search_by_text_takes_part_of_an_address_ascii_case_aside(self, store: QueueStore) -> None:
        ann, bob, cy = (
            suppression("Ann@xn--bcher-kva.example", at=T0 + timedelta(minutes=2)),
            suppression("bob@example.org", at=T0 + timedelta(minutes=1)),
            suppression("cy_100%@example.org"),
        )
        self._suppress(store, ann)
        self._suppress(store, bob)
        self._suppress(store, cy)
        now = T0 + timedelta(hours=1)

        def found(text: str) -> list[str]:
            return [entry.address for entry in store.search_suppressions(now=now, text=text)]

        assert found("ANN@") == [ann.address]
        assert found("ann@bücher.example") == [ann.address]
        assert found("Bücher") == [ann.address]
        assert found("@example.org") == [bob.address, cy.address]
        assert found("_100%") == [cy.address]
        assert found("y_1") == [cy.address] and found("y11") == []
        assert found("nobody") == []
        assert [e.address for e in store.search_suppressions(now=now, text="example", offset=1, limit=1)] == [
            bob.address
        ]

    def test_purge_drops_what_expired_and_keeps_the_rest(self, store: QueueStore) -> None:
        short = suppression("short@example.org", lasts=timedelta(days=1))
        long = suppression("long@example.org")
        self._suppress(store, short, long)
        self._expire(store, "slow@example.org", T0)  # its note lasts SUPPRESSED_FOR
        now = T0 + timedelta(days=2)
        assert store.purge_suppressions(now=now) == 1
        assert store.purge_suppressions(now=now) == 0
        assert store.search_suppressions(now=T0) == [long]
        assert len(self._expire(store, "slow@example.org", now)) == 1  # the note was kept
        assert store.purge_suppressions(now=T0 + timedelta(days=100)) == 2

    def test_expiries_noted_at_once_by_several_workers_suppress_once(self, store: QueueStore) -> None:
        # The second expiry suppresses, whichever of the four it is; the others find the
        # note, or the entry, the one before wrote.
        start = threading.Barrier(4)
        done: builtins.list[int] = []
        failures: builtins.list[BaseException] = []

        def note() -> None:
            try:
                start.wait(10)
                done.append(len(self._expire(store, "slow@example.org", T0)))
            except BaseException as error:  # reported below, in the test's thread
                failures.append(error)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=note) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert failures == []
        assert sorted(done) == [0, 0, 0, 1]
        assert store.count_suppressions(now=T0) == 1

    def test_suppression_text_a_store_cannot_keep_is_invalid(self, store: QueueStore) -> None:
        for bad in (
            suppression("nul\x00@example.org"),
            suppression("a@example.org", reply=Reply(code=550, status="5.1.1", text="no\udc80such")),
        ):
            with pytest.raises(QueueError) as raised:
                store.update_suppressions(SuppressionChange(add=(bad,)), now=T0)
            assert raised.value.code == "INVALID"
        assert store.count_suppressions(now=T0) == 0


def sts_policy(domain: str, *, id: str, max_age: int = 86400, fetched_at: datetime = T0) -> STSPolicy:
    """Return an ``enforce`` policy of ``domain`` whose mx is ``mx.<domain>``."""
    return STSPolicy(
        domain=domain, id=id, mode=STSMode.ENFORCE, mx=(f"mx.{domain}",), max_age=max_age, fetched_at=fetched_at
    )


def tls_count(day: date, *, result: TLSResult | None, count: int = 1, **fields: Any) -> TLSSessionCount:
    """Return a count of ``example.org``'s TLS sessions under its policy ``1``."""
    fields.setdefault("policy", ("version: STSv1", "mode: enforce", "mx: mx.example.org", "max_age: 86400"))
    fields.setdefault("reason", "" if result is None else "said first")
    return TLSSessionCount(
        day=day,
        domain=fields.pop("domain", "example.org"),
        policy_id=fields.pop("policy_id", "1"),
        result=result,
        count=count,
        **fields,
    )
