"""How the Redis store lays the queue out: its keys' names, and values as Redis keeps them.

Times are whole microseconds since the epoch (``micros``), so each comes back exactly
as it was given; an item is a hash whose fields ``item_from_fields`` reads back.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

from bumail_queue.items import DEFAULT_CHANNEL, DEFAULT_PRIORITY, QueueItem, Recipient
from bumail_queue.stores.base import QueueStore
from bumail_queue.suppression import Suppression

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


@dataclasses.dataclass(frozen=True, slots=True)
class RedisKeys:
    """The names of the queue's keys under one prefix."""

    prefix: str

    @property
    def items(self) -> str:
        """Every item, scored by its next attempt: ``list`` and ``count``."""
        return f"{self.prefix}items"

    @property
    def lanes(self) -> str:
        """The lanes (``<priority>:<channel>``) whose ready set may hold an item."""
        return f"{self.prefix}lanes"

    def ready(self, priority: int, channel: str) -> str:
        """The items of a lane that no lease holds, scored by their next attempt."""
        return self.lane_ready(f"{priority}:{channel}")

    def lane_ready(self, lane: str) -> str:
        """The ready set of a lane as ``lanes`` names it (``<priority>:<channel>``)."""
        return f"{self.prefix}ready:{lane}"

    @property
    def leases(self) -> str:
        """The leased items, scored by when their leases end."""
        return f"{self.prefix}leases"

    @property
    def turn(self) -> str:
        """The channel the last claim ended with: where the channels' round-robin stands."""
        return f"{self.prefix}turn"

    @property
    def seq(self) -> str:
        """The counter that orders items equally due."""
        return f"{self.prefix}seq"

    @property
    def schema(self) -> str:
        """The layout version."""
        return f"{self.prefix}schema"

    @property
    def keys(self) -> str:
        """A hash of idempotency key to the id of the item holding it."""
        return f"{self.prefix}keys"

    @property
    def wake(self) -> str:
        """The Pub/Sub channel that adds, retries and give-backs announce work on."""
        return f"{self.prefix}wake"

    @property
    def sts_policies(self) -> str:
        """A hash of recipient domain to its MTA-STS policy, as JSON."""
        return f"{self.prefix}mta-sts"

    @property
    def sts_expiry(self) -> str:
        """The domains of ``sts_policies``, scored by when their policy expires (microseconds)."""
        return f"{self.prefix}mta-sts:expires"

    @property
    def sts_failures(self) -> str:
        """A hash of recipient domain to the MTA-STS fetch that failed for it, as JSON."""
        return f"{self.prefix}mta-sts:failed"

    @property
    def sts_failures_until(self) -> str:
        """The domains of ``sts_failures``, scored by when their failure lapses (microseconds)."""
        return f"{self.prefix}mta-sts:failed:until"

    @property
    def tls_days(self) -> str:
        """The days that have TLS report counts, scored by their ordinal."""
        return f"{self.prefix}tlsrpt:days"

    def tls_counts(self, day: date) -> str:
        """A hash of each kind of TLS session of ``day`` to its count."""
        return f"{self.prefix}tlsrpt:{day.isoformat()}"

    def tls_about(self, day: date) -> str:
        """A hash of each kind of TLS session of ``day`` to its policy and first reason, as JSON."""
        return f"{self.prefix}tlsrpt:{day.isoformat()}:about"

    @property
    def suppressed(self) -> str:
        """The suppression list: a hash of entry (``suppression_member``) to the entry
        (JSON, with its times)."""
        return f"{self.prefix}suppressed"

    @property
    def suppression_scopes(self) -> str:
        """The scopes other than the global one that entries were ever kept in (a set: a
        handful, one per channel), so an address can be looked up in all of them."""
        return f"{self.prefix}suppressed:scopes"

    @property
    def suppressed_expires(self) -> str:
        """The suppressed addresses, scored by when their entries expire: the purge, the count."""
        return f"{self.prefix}suppressed:expires"

    @property
    def suppressed_created(self) -> str:
        """The suppressed addresses, scored by when they were added: the newest first."""
        return f"{self.prefix}suppressed:created"

    @property
    def expiry_notes(self) -> str:
        """The addresses whose delivery time expired once, scored by when the note lapses."""
        return f"{self.prefix}suppressed:notes"

    @property
    def suppression_keys(self) -> list[str]:
        """The keys of the suppression list, in the order its scripts take them."""
        return [
            self.suppressed,
            self.suppressed_expires,
            self.suppressed_created,
            self.expiry_notes,
            self.suppression_scopes,
        ]

    @property
    def shaping(self) -> str:
        """The destinations with a shaping bucket, scored by when their keys expire."""
        return f"{self.prefix}shaping"

    def bucket(self, destination: str) -> str:
        """A destination's shaping bucket (a hash); its slots are ``<bucket>:slots``."""
        return f"{self.prefix}shaping:{destination}"

    def item(self, item_id: str) -> str:
        return f"{self.prefix}item:{item_id}"

    def message(self, item_id: str) -> str:
        return f"{self.prefix}message:{item_id}"


def micros(value: datetime) -> str:
    """Return a time as whole microseconds since the epoch (a naive time is taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return str((value - EPOCH) // MICROSECOND)


def from_micros(raw: bytes | str | int) -> datetime:
    return EPOCH + timedelta(microseconds=int(raw))


def own_id(item_id: Any) -> str | None:
    """Return the id in the form the store writes it, or ``None`` for one it never made.

    Only a UUID reaches a key's name, so no id a caller gives names another key.
    """
    if not QueueStore.is_known_id(item_id):
        return None
    try:
        return str(uuid.UUID(item_id))
    except (ValueError, TypeError, AttributeError):
        return None


def recipients_json(recipients: Iterator[Recipient] | Sequence[Recipient]) -> str:
    return json.dumps([r.to_dict() for r in recipients], ensure_ascii=False, separators=(",", ":"))


def hash_fields(reply: Any) -> dict[bytes, bytes]:
    """Return ``HGETALL``'s reply typed: bytes, since the store's connections decode nothing."""
    return cast("dict[bytes, bytes]", reply)


def pairs(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """Return a hash's fields from the flat list a script returns for ``HGETALL``."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def item_from_fields(fields: Mapping[bytes, bytes]) -> QueueItem:
    owner, expires, key = (
        fields.get(b"owner"),
        fields.get(b"expires"),
        fields.get(b"key"),
    )
    return QueueItem(
        id=fields[b"id"].decode(),
        sender=fields[b"from"].decode(),
        recipients=[Recipient.from_dict(r) for r in json.loads(fields[b"recipients"])],
        size=int(fields[b"size"]),
        created_at=from_micros(fields[b"created"]),
        next_attempt_at=from_micros(fields[b"next"]),
        attempts=int(fields[b"attempts"]),
        delay_notified=fields[b"delay"] == b"1",
        lease_owner=None if owner is None else owner.decode(),
        lease_expires_at=None if expires is None else from_micros(expires),
        key=None if key is None else key.decode(),
        # An item of layout 1 has neither: it is in the lane every such item is in.
        priority=int(fields.get(b"priority", DEFAULT_PRIORITY)),
        channel=fields.get(b"channel", DEFAULT_CHANNEL.encode()).decode(),
    )


def copy_item(item: QueueItem) -> QueueItem:
    return dataclasses.replace(item, recipients=list(item.recipients))


def suppression_json(entry: Suppression) -> str:
    """Return an entry as the list's hash keeps it: its JSON form and its times."""
    data = {**entry.to_dict(), "created": int(micros(entry.created_at)), "expires": int(micros(entry.expires_at))}
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def suppression_member(address: str, scope: str) -> str:
    """Return the member that names an address's entry in ``scope`` in the list's hash
    and sets: the address alone for the global scope, so entries kept before scopes
    read as they were; else the address, a line end (which no address holds), the scope."""
    return f"{address}\n{scope}" if scope else address


def member_address(member: str) -> str:
    """Return the address a member of the list (``suppression_member``) names."""
    return member.partition("\n")[0]


def suppression_from_json(member: str, raw: bytes) -> Suppression:
    data = json.loads(raw)
    return Suppression.from_dict(
        member_address(member),
        data,
        created_at=from_micros(data["created"]),
        expires_at=from_micros(data["expires"]),
    )
