"""The store-neutral values: what an item is, whatever store keeps it.

Stores exchange these frozen dataclasses, never model instances, so the service,
the worker and the admin read an item the same way from the ORM or from Redis.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from .errors import ErrorCode, QueueError

#: The lowest and highest priority an item may have; higher is claimed first.
PRIORITY_MIN, PRIORITY_MAX = -100, 100
#: The priority of an item nobody gave one (Django's task framework says the same).
DEFAULT_PRIORITY = 0
#: The channel of an item nobody gave one.
DEFAULT_CHANNEL = "default"
#: The longest channel name.
CHANNEL_MAX_LENGTH = 64
# A name an operator can type and a Redis key or a URL can hold as it is.
CHANNEL_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{CHANNEL_MAX_LENGTH - 1}}}")


def check_priority(priority: Any, what: str = "'priority'") -> int:
    """Return ``priority``, or raise ``QueueError(INVALID)`` for one that is not a whole
    number from ``PRIORITY_MIN`` to ``PRIORITY_MAX`` (a ``bool`` is none)."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise QueueError(
            ErrorCode.INVALID,
            f"{what} must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX} (higher goes first); "
            f"got {priority!r}.",
        )
    return priority


def check_channel(channel: Any, what: str = "'channel'") -> str:
    """Return ``channel``, or raise ``QueueError(INVALID)`` for a name that is not 1 to 64
    ASCII letters, digits, ``.``, ``_``, ``:`` and ``-``, starting with a letter or digit."""
    if not isinstance(channel, str) or not CHANNEL_PATTERN.fullmatch(channel):
        raise QueueError(
            ErrorCode.INVALID,
            f"{what} must be a name of 1 to {CHANNEL_MAX_LENGTH} ASCII letters, digits, '.', '_', ':' and '-', "
            f"starting with a letter or digit; got {channel!r}.",
        )
    return channel


class RecipientStatus(enum.StrEnum):
    """Where one recipient stands. ``delivered`` and ``failed`` are final."""

    PENDING = "pending"
    DEFERRED = "deferred"
    DELIVERED = "delivered"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        """Return whether this status can no longer change."""
        return self in (RecipientStatus.DELIVERED, RecipientStatus.FAILED)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Reply:
    """The answer that decided a recipient's status.

    ``code`` is the SMTP reply code, or ``None`` when no server answered (DNS, a
    refused connection); ``status`` the enhanced status code (RFC 3463), ``"5.1.1"``.
    """

    code: int | None
    status: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form a store keeps."""
        return {"code": self.code, "status": self.status, "text": self.text}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reply:
        """Build a reply from its JSON form."""
        code = data.get("code")
        return cls(
            code=None if code is None else int(code),
            status=str(data["status"]),
            text=str(data["text"]),
        )


def reply_line(reply: Reply | None) -> str:
    """Return a reply as one line, ``550 5.1.1 No such user``, the status code said once.

    Parts left empty (no server answered, no enhanced status, no text) are left out;
    no reply at all is ``""``.
    """
    if reply is None:
        return ""
    status = "" if reply.text.startswith(reply.status) else reply.status
    code = "" if reply.code is None else str(reply.code)
    return " ".join(part for part in (code, status, reply.text) if part)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Recipient:
    """One recipient of an item and its own state."""

    address: str
    status: RecipientStatus = RecipientStatus.PENDING
    reply: Reply | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form a store keeps."""
        return {
            "address": self.address,
            "status": self.status.value,
            "reply": None if self.reply is None else self.reply.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipient:
        """Build a recipient from its JSON form."""
        reply = data.get("reply")
        return cls(
            address=str(data["address"]),
            status=RecipientStatus(data["status"]),
            reply=None if reply is None else Reply.from_dict(reply),
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class QueueItem:
    """An item in the queue: one message, its envelope, and each recipient's state.

    ``next_attempt_at`` is when the item is next due; while a worker holds it, that
    is the lease's expiry, so a crashed worker's items fall due by themselves.
    """

    id: str
    sender: str
    recipients: list[Recipient]
    size: int
    created_at: datetime
    next_attempt_at: datetime
    attempts: int = 0
    delay_notified: bool = False
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    key: str | None = None
    priority: int = DEFAULT_PRIORITY
    channel: str = DEFAULT_CHANNEL

    @property
    def pending_recipients(self) -> list[Recipient]:
        """Return the recipients whose status is not final yet."""
        return [r for r in self.recipients if not r.status.is_final]

    @property
    def is_finished(self) -> bool:
        """Return whether every recipient's status is final."""
        return all(r.status.is_final for r in self.recipients)

    def is_leased_at(self, now: datetime) -> bool:
        """Return whether a lease holds the item at ``now``."""
        return self.lease_owner is not None and self.lease_expires_at is not None and self.lease_expires_at > now


def pending_recipients_json(addresses: Iterable[str]) -> str:
    """Return the JSON form a store keeps of new recipients, every one pending: that of
    ``[Recipient(address=a).to_dict() for a in addresses]``, without building them."""
    return json.dumps([{**_PENDING_RECIPIENT, "address": a} for a in addresses])


# Recipient.to_dict() of a new recipient, whose address is all that differs.
_PENDING_RECIPIENT = Recipient(address="").to_dict()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NewItem:
    """What the service gives a store to add: the envelope, the message, the first due time."""

    id: str
    sender: str
    recipients: Sequence[str]
    message: bytes
    created_at: datetime
    next_attempt_at: datetime
    key: str | None = None
    priority: int = DEFAULT_PRIORITY
    channel: str = DEFAULT_CHANNEL

    @property
    def size(self) -> int:
        """Return the message's size in bytes."""
        return len(self.message)

    @property
    def pending_recipients(self) -> list[Recipient]:
        """Return the item's recipients as a store first keeps them: every one pending
        (``QueueItem.pending_recipients`` of the item once added)."""
        return [Recipient(address=a) for a in self.recipients]

    def to_queue_item(self) -> QueueItem:
        """Return the item as a store holds it once added: every recipient pending."""
        return QueueItem(
            id=self.id,
            sender=self.sender,
            recipients=self.pending_recipients,
            size=self.size,
            created_at=self.created_at,
            next_attempt_at=self.next_attempt_at,
            key=self.key,
            priority=self.priority,
            channel=self.channel,
        )


_Due = TypeVar("_Due")


def fair_order(
    due: Iterable[_Due],
    *,
    limit: int,
    lane: Callable[[_Due], tuple[str, int]],
    place: Callable[[_Due], Any],
    after: str = "",
) -> list[_Due]:
    """Return the first ``limit`` of the ``due`` items in the order a claim takes them.

    Channels take turns: each channel's items are ranked, the higher priority first,
    then by ``place`` (when due, then how old: ``(next_attempt_at, seq)``), and the
    first of every channel comes before the second of any. Within a turn the higher
    priority goes first, then the channels round-robin: those whose name comes after
    ``after`` (the channel the previous claim ended with), then the others, by name.
    ``lane`` gives an item's ``(channel, priority)``.

    Every store claims in this order; this is the plain-Python form, for a store that
    reads each lane's first ``limit`` due items and merges them (``limit`` per lane is
    enough: no channel gets more than ``limit`` turns).
    """
    if limit < 1:
        return []
    by_channel: dict[str, list[tuple[int, Any, _Due]]] = {}
    for entry in due:
        channel, priority = lane(entry)
        by_channel.setdefault(channel, []).append((-priority, place(entry), entry))
    ranked: list[tuple[int, int, bool, str, _Due]] = []
    for channel, entries in by_channel.items():
        entries.sort(key=lambda e: (e[0], e[1]))
        wrapped = channel <= after
        ranked.extend((turn, rank, wrapped, channel, entry) for turn, (rank, _, entry) in enumerate(entries[:limit]))
    ranked.sort(key=lambda e: (e[0], e[1], e[2], e[3]))
    return [entry for *_, entry in ranked[:limit]]


def fair_shares(lanes: Iterable[tuple[str, int, int]], *, limit: int, after: str = "") -> dict[tuple[str, int], int]:
    """Return how many of each lane's first due items a claim of ``limit`` takes.

    ``lanes`` gives each lane's ``(channel, priority, due)``, ``due`` the number of its
    items due (it may stop at ``limit``). Taking, from each lane, the number returned
    for it, earliest due first, takes the items ``fair_order`` would take from every
    lane's due items: a store counts first, then reads only what it takes.
    """
    if limit < 1:
        return {}
    by_channel: dict[str, list[tuple[int, int]]] = {}
    for channel, priority, due in lanes:
        if due > 0:
            by_channel.setdefault(channel, []).append((priority, min(due, limit)))
    totals = {channel: min(limit, sum(due for _, due in sources)) for channel, sources in by_channel.items()}
    # The turns the claim reaches: the fewest whose items fill it, found by bisection.
    turns = limit
    if sum(totals.values()) > limit:
        low, high = 1, limit
        while low < high:
            middle = (low + high) // 2
            if sum(min(total, middle) for total in totals.values()) >= limit:
                high = middle
            else:
                low = middle + 1
        turns = low
    # Each channel's items up to that turn, in the order fair_order ranks them.
    slots: list[tuple[int, int, bool, str, int]] = []
    for channel, sources in by_channel.items():
        wrapped, turn = channel <= after, 0
        for priority, due in sorted(sources, key=lambda source: -source[0]):
            for _ in range(min(due, turns - turn)):
                turn += 1
                slots.append((turn, -priority, wrapped, channel, priority))
    slots.sort()
    shares: dict[tuple[str, int], int] = {}
    for *_, channel, priority in slots[:limit]:
        shares[channel, priority] = shares.get((channel, priority), 0) + 1
    return shares


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What one attempt decided for one recipient.

    ``names_recipient`` says whether ``reply`` was about this recipient alone: a reply
    to its ``RCPT``, or the reply of a transaction it was the only recipient of. Only
    such a reply puts an address on the suppression list; a reply to ``MAIL FROM``, to
    the greeting, or after the data of several recipients may be about anything (the
    sender, the host, one of the others). It is what the attempt knew, not part of the
    outcome a store keeps, so it takes no part in comparisons.
    """

    status: RecipientStatus
    reply: Reply
    names_recipient: bool = dataclasses.field(default=True, compare=False)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AttemptResult:
    """What a worker records after an attempt, in one step, while it holds the lease.

    ``outcomes`` maps recipient addresses to what the attempt decided; recipients it
    does not name keep their state, and a final status is never changed.
    ``next_attempt_at`` is when the item falls due again if any recipient is left.
    """

    outcomes: Mapping[str, Outcome]
    next_attempt_at: datetime
    count_attempt: bool = True
    delay_notified: bool | None = None

    def recorded_on(self, item: QueueItem) -> QueueItem:
        """Return ``item`` as this attempt leaves it: outcomes, schedule, count, no lease."""
        return dataclasses.replace(
            item,
            recipients=self.apply_to(item.recipients),
            next_attempt_at=self.next_attempt_at,
            attempts=item.attempts + (1 if self.count_attempt else 0),
            delay_notified=item.delay_notified if self.delay_notified is None else self.delay_notified,
            lease_owner=None,
            lease_expires_at=None,
        )

    def apply_to(self, recipients: Sequence[Recipient]) -> list[Recipient]:
        """Return ``recipients`` with this attempt's outcomes applied; final ones stay."""
        updated = []
        for recipient in recipients:
            outcome = self.outcomes.get(recipient.address)
            if outcome is None or recipient.status.is_final:
                updated.append(recipient)
            else:
                updated.append(Recipient(address=recipient.address, status=outcome.status, reply=outcome.reply))
        return updated
