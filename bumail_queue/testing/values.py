# mypy: disable-error-code="union-attr"
# The helpers read what a store returned without narrowing it first: a ``None`` where an
# item was due fails the test there, as it should.
"""The values and helpers the store contract is written with: a fixed start time, replies,
new items and suppression entries to add, and the steps a test repeats."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from bumail_queue.items import AttemptResult, NewItem, Outcome, QueueItem, Reply
from bumail_queue.items import RecipientStatus as S
from bumail_queue.shaping import Limits, Permit, PermitRequest, Rate
from bumail_queue.stores.base import QueueStore
from bumail_queue.sts import STSFailure, STSMode, STSPolicy, TLSResult, TLSSessionCount
from bumail_queue.suppression import Suppression, SuppressionReason

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
    priority: int = 0,
    channel: str = "default",
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
        priority=priority,
        channel=channel,
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
    scope: str = "",
) -> Suppression:
    """Return an entry for ``address`` (in its normal form), made at ``at``."""
    return Suppression(address=address, reason=reason, reply=reply, created_at=at, expires_at=at + lasts, scope=scope)


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


def require_claims_by_id(store: QueueStore) -> None:
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
    cost: int = 1,
) -> Permit:
    """Ask ``store`` for room at ``key`` at ``at``, holding ``slot`` (if given) for
    ``lease``, for a message that counts ``cost`` against a quota."""
    request = PermitRequest(
        key=key,
        limits=limits,
        now=at,
        slot=slot,
        slot_until=None if slot is None else at + lease,
        held=held,
        held_until=held_until,
        cost=cost,
    )
    return store.take_permit(request)


TWO_A_SECOND = Limits(rate=Rate(count=2, period=1.0))
TWO_AT_ONCE = Limits(concurrency=2)
SECOND = timedelta(seconds=1)


def close_connections() -> None:
    """Close this thread's database connections (a thread's own, as a worker's are)."""
    from django.db import connections

    connections.close_all()


def sts_policy(domain: str, *, id: str, max_age: int = 86400, fetched_at: datetime = T0) -> STSPolicy:
    """Return an ``enforce`` policy of ``domain`` whose mx is ``mx.<domain>``."""
    return STSPolicy(
        domain=domain, id=id, mode=STSMode.ENFORCE, mx=(f"mx.{domain}",), max_age=max_age, fetched_at=fetched_at
    )


def sts_failure(domain: str, *, id: str, until: datetime = T0 + timedelta(minutes=5)) -> STSFailure:
    """Return a failed fetch of ``domain``'s policy ``id``, kept until ``until``."""
    return STSFailure(
        domain=domain, policy_id=id, result=TLSResult.STS_POLICY_FETCH_ERROR, reason="HTTP 503", until=until
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
