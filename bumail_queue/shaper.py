"""The worker's side of ``SHAPING``: ask the store for room before a session, tell it after.

A ``Shaper`` exists only when ``SHAPING`` has an entry: without one the worker never
calls it, and the hot path costs nothing. With one, a session to a shaped destination
costs one store round trip before it starts (``take_permit``) and, when it held a
slot, changed the slow-start window or met a "slow down" reply, one after it ends
(``release_permit``).

When the store refuses, the item is held back: it goes back to the queue, due when
the destination should have room, with no attempt counted and no signal. The shaper
remembers the refusal, so the next items for that destination are held back without
asking again until then, and spreads them out: each held item is due one message's
worth of the destination's pace after the one before (``1/RATE``, or a session's
length over ``CONCURRENCY``), so a backlog comes back at the pace it can go out
instead of all at once. The items it held since it last asked are told to the store
with its next request, for the admin and ``queue_status``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from bumail_queue.conf import QueueSettings
from bumail_queue.delivery.envelope import Delivery, Host
from bumail_queue.delivery.routes import Destination
from bumail_queue.errors import QueueError
from bumail_queue.items import RecipientStatus, reply_line
from bumail_queue.outcomes import report_error
from bumail_queue.shaping import Patterns, PermitRequest, Pushback, Shape, WindowChange, pushback_of
from bumail_queue.stores import QueueStore

logger = logging.getLogger("bumail_queue.worker")

Clock = Callable[[], datetime]

FIRST_SESSION_SECONDS = 1.0
"""What a session to a destination is taken to last before one has been timed: the
pace at which items held for a full set of slots come back."""

SHORTEST_HOLD = timedelta(milliseconds=50)
"""The least an item waits for a slot: a slot frees when a session ends, which the
store does not announce, so the items waiting for one come back this soon at least."""

FORGET_EVERY = timedelta(minutes=10)
"""How often a worker drops the buckets of destinations idle for ``FORGET_AFTER``."""
FORGET_AFTER = timedelta(hours=1)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Held:
    """A destination had no room: its recipients wait until ``until``, not attempted."""

    key: str
    until: datetime
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Ticket:
    """Room at a destination for one session: the slot it holds, if any."""

    shape: Shape
    slot: str | None
    started: float  # time.monotonic()


@dataclasses.dataclass(kw_only=True, slots=True)
class _Hold:
    """What this worker knows of a destination that refused it: no room before ``until``."""

    until: datetime
    spacing: timedelta
    reason: str
    last_due: datetime | None = None

    def next_due(self) -> datetime:
        """The due time of the next item held: ``spacing`` after the last one, from ``until``."""
        due = self.until if self.last_due is None else max(self.until, self.last_due + self.spacing)
        self.last_due = due
        return due


@dataclasses.dataclass(kw_only=True, slots=True)
class _Untold:
    """Items held back without asking the store, to tell it with the next request."""

    count: int = 0
    until: datetime | None = None


class Shaper:
    """Asks the store for room at shaped destinations and tells it how sessions went."""

    def __init__(self, *, settings: QueueSettings, store: QueueStore, owner: str, clock: Clock) -> None:
        self.settings = settings
        self.store = store
        self.owner = owner
        self.clock = clock
        self.patterns = Patterns(settings.shaping)
        self._lock = threading.Lock()
        self._holds: dict[str, _Hold] = {}
        self._untold: dict[str, _Untold] = {}
        self._seconds: dict[str, float] = {}  # how long a session to each destination lasts
        self._slots: dict[str, str] = {}  # slot -> destination, the slots this worker holds
        self._serial = 0
        self._forgotten_at: datetime | None = None

    @classmethod
    def of(cls, *, settings: QueueSettings, store: QueueStore, owner: str, clock: Clock) -> Shaper | None:
        """Return a shaper when ``SHAPING`` has an entry, else ``None``: no shaping, no cost."""
        if not settings.shaping:
            return None
        return cls(settings=settings, store=store, owner=owner, clock=clock)

    def shape(self, destination: Destination, hosts: Sequence[Host]) -> Shape | None:
        """Return the shaping entry of ``destination``, or ``None`` when none applies.

        An MX route is shaped by its recipient domain and its MX hosts' names; a
        smarthost route by the smarthost's host name: the session, and any "slow down"
        it answers, is the smarthost's; a backend route by its ``NAME``.
        """
        if destination.domain is not None:
            return self.patterns.match(destination.domain, [host.name for host in hosts])
        if destination.route.type == "backend":
            return self.patterns.match(destination.route.name or "")  # its NAME: no hosts to match
        host = destination.route.host or ""
        return self.patterns.match(host, [host])

    # -- before a session -----------------------------------------------------------

    def enter(self, shape: Shape, *, recipients: int = 1) -> Ticket | Held:
        """Ask for room: a ``Ticket`` to start the session, or ``Held`` to wait.

        ``recipients``: how many the session's message has at the destination, what a
        ``QUOTA`` counts unless it counts messages.
        """
        now = self.clock()
        key, limits = shape.key, shape.limits
        with self._lock:
            hold = self._holds.get(key)
            if hold is not None and hold.until > now:
                return self._held_here(key, hold)
            self._holds.pop(key, None)
            untold = self._untold.pop(key, _Untold())
            slot = self._new_slot() if limits.uses_slots else None
        request = PermitRequest(
            key=key,
            limits=limits,
            now=now,
            slot=slot,
            slot_until=now + self.settings.lease if slot is not None else None,
            held=untold.count,
            held_until=untold.until,
            cost=1 if limits.quota is None else limits.quota.cost(recipients),
        )
        try:
            permit = self.store.take_permit(request)
        except QueueError as error:  # the store is down: nothing goes out unshaped
            report_error(error, None)
            return self._hold(key, now + timedelta(seconds=self.settings.poll_seconds), timedelta(0), "store")
        if permit.granted:
            if slot is not None:
                with self._lock:
                    self._slots[slot] = key
            return Ticket(shape=shape, slot=slot, started=time.monotonic())
        pace = self._pace(shape, permit.limit, now=now, reason=permit.reason)
        until = permit.retry_at if permit.retry_at is not None else now + max(pace, SHORTEST_HOLD)
        rise = limits.quota.next_rise(now) if permit.reason == "quota" and limits.quota else None
        if rise is not None and rise < until:
            until = rise  # a warm-up's next step makes room sooner than the window's move
        return self._hold(key, until, pace, permit.reason or "concurrency")

    def _pace(self, shape: Shape, limit: int | None, *, now: datetime, reason: str | None = None) -> timedelta:
        """The time between two messages to ``shape``'s destination at the pace it allows.

        Held for a quota, the items come back a bin's length over the quota apart: a
        bin's worth of room, all a bin can have taken, in a bin's length at most.
        """
        limits = shape.limits
        allowed = None if limits.quota is None else limits.quota.allowed_at(now)
        if reason == "quota" and limits.quota is not None and allowed:
            return timedelta(seconds=limits.quota.width / allowed)
        if limits.rate is not None:
            return timedelta(seconds=1 / limits.rate.per_second)
        if limits.concurrency is not None:
            with self._lock:
                session = self._seconds.get(shape.key, FIRST_SESSION_SECONDS)
            return timedelta(seconds=session / (limit or limits.concurrency))
        return timedelta(0)

    def _hold(self, key: str, until: datetime, spacing: timedelta, reason: str) -> Held:
        with self._lock:
            hold = self._holds[key] = _Hold(until=until, spacing=spacing, reason=reason)
            return self._held_here(key, hold)

    def _held_here(self, key: str, hold: _Hold) -> Held:
        """Hold one item at the next due time of ``hold`` (call with the lock held)."""
        due = hold.next_due()
        untold = self._untold.setdefault(key, _Untold())
        untold.count += 1
        untold.until = due if untold.until is None else max(untold.until, due)
        return Held(key=key, until=due, reason=hold.reason)

    def _new_slot(self) -> str:
        """A slot name unique to this worker's session (call with the lock held)."""
        self._serial += 1
        return f"{self.owner[-40:]}-{os.getpid()}-{self._serial}"

    # -- after a session ------------------------------------------------------------

    def leave(self, ticket: Ticket, delivery: Delivery | None) -> None:
        """Tell the store how the session went: free its slot, grow or halve the
        slow-start window, suspend the destination on a "slow down" reply."""
        shape, limits = ticket.shape, ticket.shape.limits
        now = self.clock()
        with self._lock:
            if ticket.slot is not None:
                self._slots.pop(ticket.slot, None)
                hold = self._holds.get(shape.key)
                if hold is not None and hold.reason == "concurrency":
                    del self._holds[shape.key]  # its slot is free: the next item asks again
            seconds = time.monotonic() - ticket.started
            before = self._seconds.get(shape.key)
            self._seconds[shape.key] = seconds if before is None else 0.8 * before + 0.2 * seconds
        change, suspend_until, reply = self._feedback(shape, delivery, now)
        if suspend_until is not None:
            spacing = self._spacing_after(shape)  # takes the lock itself
            with self._lock:
                self._holds[shape.key] = _Hold(until=suspend_until, spacing=spacing, reason="suspended")
        if ticket.slot is None and change is WindowChange.KEEP and suspend_until is None:
            return  # nothing to tell: RATE alone, and the session went well
        try:
            self.store.release_permit(
                shape.key,
                slot=ticket.slot,
                now=now,
                change=change,
                concurrency=limits.concurrency,
                suspend_until=suspend_until,
            )
        except QueueError as error:  # its slot comes back when its lease ends
            report_error(error, None)
        if suspend_until is not None:
            logger.warning(
                "suspended destination=%s until=%s reply=%s",
                shape.key,
                suspend_until.isoformat(timespec="seconds"),
                reply,
                extra={"action": "suspend"},
            )

    def _feedback(
        self, shape: Shape, delivery: Delivery | None, now: datetime
    ) -> tuple[WindowChange, datetime | None, str | None]:
        """What a session's replies say: the window's change, a suspension, the reply that asked."""
        if delivery is None:
            return WindowChange.KEEP, None, None
        limits = shape.limits
        for outcome in delivery.outcomes.values():
            said = pushback_of(outcome.reply)
            if said is Pushback.SLOW_DOWN or (said is Pushback.CONNECTIONS and limits.slow_start is None):
                return WindowChange.HALVE, now + limits.suspend, reply_line(outcome.reply)
            if said is Pushback.CONNECTIONS:
                return WindowChange.HALVE, None, reply_line(outcome.reply)
        if limits.slow_start is not None and any(
            o.status == RecipientStatus.DELIVERED for o in delivery.outcomes.values()
        ):
            return WindowChange.GROW, None, None
        return WindowChange.KEEP, None, None

    def _spacing_after(self, shape: Shape) -> timedelta:
        """How far apart the items held by a suspension come back once it ends."""
        return self._pace(shape, shape.limits.slow_start, now=self.clock())

    # -- the worker's side threads --------------------------------------------------

    def renew(self, until: datetime) -> None:
        """Extend the leases of the slots this worker's sessions hold (with the items' leases)."""
        with self._lock:
            held = list(self._slots.items())
        now = self.clock()
        for slot, key in held:
            try:
                self.store.renew_permit(key, slot=slot, now=now, until=until)
            except QueueError as error:
                report_error(error, None)

    def forget_idle(self) -> None:
        """Drop the buckets of destinations idle an hour, every ten minutes at most."""
        now = self.clock()
        if self._forgotten_at is not None and now - self._forgotten_at < FORGET_EVERY:
            return
        self._forgotten_at = now
        try:
            self.store.forget_idle_destinations(before=now - FORGET_AFTER, now=now)
        except QueueError as error:
            report_error(error, None)
