"""What the worker knows of a session from its own side, and the limits it holds them to:
which messages are read with their claim, when a session counts as slow, what a
follower takes over from its predecessor."""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING

from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import (
    Host,
    Transport,
)
from bumail_queue.items import QueueItem, Reply

if TYPE_CHECKING:
    from bumail_queue.delivery.mta_sts import AppliedPolicy


PREFETCH_MESSAGE_LIMIT = 256 * 1024
PREFETCH_BATCH_LIMIT = 16 * 1024 * 1024
"""A claim's messages up to this size are read with it, in one query, at most this
much per claim; larger ones are read when their session starts."""

SLOW_SESSION_SECONDS = 2.0
"""A session under way this long, its message small, is waiting on its peer and stops
counting against ``CONCURRENCY``. A healthy session ends sooner, TLS included, even
across the world (about ten round trips); honest servers can be slower (Postfix's
postscreen may hold its greeting for 6 s), and they should not hold a slot either."""

SLOW_SESSIONS_PER_SLOT = 10
"""How many sessions waiting on their peers a worker keeps beyond ``CONCURRENCY``, for
each of its slots: a thread blocked in ``recv`` costs little, but a flood of slow
servers must not make threads without end."""

SLOW_SESSION_MESSAGE_LIMIT = PREFETCH_MESSAGE_LIMIT
"""A session whose message is larger keeps its ``CONCURRENCY`` slot however long it
runs: sending it may be what takes the time, and the session holds it in memory."""

LOST_MESSAGE_REPLY = Reply(
    code=None, status="5.3.0", text="Message unreadable: the queue store holds the item but not its message"
)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Session:
    """A session under way, as the worker sees it from its own side."""

    started: float  # time.monotonic()
    may_turn_slow: bool

    @property
    def turns_slow_at(self) -> float:
        return self.started + SLOW_SESSION_SECONDS

    def is_slow(self, now: float) -> bool:
        # A small message goes out in a round trip or two: a session of one that has
        # run this long spends its time waiting for the peer's replies.
        return self.may_turn_slow and now >= self.turns_slow_at


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Path:
    """How a destination's sessions go: its route and hosts as its MTA-STS policy leaves
    them (the policy's TLS, only the MX hosts it allows), and that policy, for the TLS
    reports (``None`` without one)."""

    route: Route
    hosts: tuple[Host, ...]
    policy: AppliedPolicy | None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Follower:
    """An item started on the session its predecessor was ending: the same
    destination, the same path, its message read with its claim."""

    item: QueueItem
    keys: set[str]
    path: Path
    message: bytes


@dataclasses.dataclass(slots=True)
class Handoff:
    """The follower that took over the session of the item being delivered, if one did."""

    follower: Follower | None = None


def takes_follow(transport: Transport) -> bool:
    """Return whether ``transport.deliver`` takes ``follow`` (a ``FollowingTransport``)."""
    try:
        return "follow" in inspect.signature(transport.deliver).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return False
