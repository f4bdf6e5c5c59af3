"""The worker: claims due items, delivers them over SMTP, has every outcome recorded.

This module holds the scheduling together: the claim loop, which items start when
(``CONCURRENCY``, ``DOMAIN_CONCURRENCY``, slow sessions), the threads that deliver,
renew leases, listen for new mail and record, and a graceful stop. What one attempt
decided and how it is recorded and told (signals, delivery log, DSNs) is the
``Recorder``'s (``outcomes``); the delivery threads are a ``ThreadPool``
(``threads``); the SMTP and DNS work is the delivery layer's, behind the
``Transport`` and ``Resolver`` protocols.

One ``Worker`` runs one claim loop in the calling thread and delivers on a pool of
threads, one per session (SMTP is I/O, and ``smtplib`` blocks). The loop:

1. claims up to ``CLAIM_BATCH_SIZE`` due items once fewer than half a batch (or
   ``CONCURRENCY``) wait to start, so the claim overlaps the last deliveries, and
   looks their pending recipients up in the suppression list (one round trip): a
   suppressed recipient fails without a session;
2. starts each on a thread once fewer than ``CONCURRENCY`` sessions are making
   progress and its destinations have a free ``DOMAIN_CONCURRENCY`` slot (an item
   waiting for a busy domain never blocks the others). A session of a small message
   that has run ``SLOW_SESSION_SECONDS`` is waiting on its peer: it leaves
   ``CONCURRENCY`` for a budget of its own, so slow servers never starve the rest;
3. sleeps until a delivery ends, a session turns slow while items wait, the store
   announces new work, or ``POLL_SECONDS``.

A delivery thread whose message's final dot is about to go on a kept connection to a
server that offers PIPELINING takes a follower (``_take_follower``): the next waiting
item for the same destination starts on that session, in its slot, its commands sent
with the dot (RFC 2920), and the thread delivers it next: one round trip a message.
Not at a destination ``SHAPING`` limits, where every session asks for its own room.

A delivery thread hands its attempt to the recorder thread and takes the next item
while the outcome is written: the recorder thread lets a batch fill while sessions
are under way, and the ``Recorder`` writes it in one commit, then sends the signals
and DSNs. A side thread renews every held lease each third of ``LEASE_SECONDS``.
``stop()`` claims nothing more, lets deliveries under way end and records them, and
gives back what was claimed but not started: due at once, no attempt counted.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import queue as queue_module
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Container, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

from django.db import connections
from django.utils import timezone

from bumail_queue.conf import QueueSettings, Route, get_settings
from bumail_queue.delivery.dkim import Signatures
from bumail_queue.delivery.dsn import header_block
from bumail_queue.delivery.envelope import (
    Delivery,
    Envelope,
    Follow,
    FollowingTransport,
    Host,
    Resolver,
    TLSSession,
    Transport,
)
from bumail_queue.delivery.routes import Destination, group_by_destination
from bumail_queue.delivery.tlsrpt import TLSReportCounter
from bumail_queue.errors import QueueError
from bumail_queue.items import AttemptResult, Outcome, QueueItem, RecipientStatus, Reply
from bumail_queue.outcomes import (
    Attempt,
    Enqueue,
    Meter,
    Recorder,
    Stats,
    close_broken_connections,
    decide_attempt,
    report_error,
    store_enqueue,
)
from bumail_queue.shaper import Held, Shaper
from bumail_queue.stores import QueueStore, get_store
from bumail_queue.stores.base import WorkListener
from bumail_queue.suppression import Suppression, suppressed_reply
from bumail_queue.threads import ThreadPool

if TYPE_CHECKING:
    from bumail_queue.delivery.mta_sts import AppliedPolicy, STSPolicies

__all__ = [
    "Attempt",
    "Meter",
    "Resolver",
    "Stats",
    "Transport",
    "Worker",
    "close_broken_connections",
    "default_owner",
]

logger = logging.getLogger(__name__)

RECORD_BATCH_LIMIT = 200
"""The most attempts the recorder writes in one commit."""

RECORD_LINGER_SECONDS = 0.02
"""How long the recorder lets a batch fill while sessions are under way; it records
at once when none is."""

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

Clock = Callable[[], datetime]

LOST_MESSAGE_REPLY = Reply(
    code=None, status="5.3.0", text="Message unreadable: the queue store holds the item but not its message"
)


def default_owner() -> str:
    """Return a lease owner name unique to this process: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{random.randrange(16**6):06x}"  # noqa: S311 - a name, not a secret


class Worker:
    """Claims due items and delivers them; see the module's docstring."""

    def __init__(
        self,
        *,
        settings: QueueSettings | None = None,
        store: QueueStore | None = None,
        transport: Transport | None = None,
        resolver: Resolver | None = None,
        mta_sts: STSPolicies | None = None,
        owner: str | None = None,
        concurrency: int | None = None,
        domain_concurrency: int | None = None,
        burst: bool = False,
        clock: Clock = timezone.now,
        rng: random.Random | None = None,
        enqueue: Enqueue | None = None,
        item_ids: Sequence[str] | None = None,
        claim_seconds: float | None = None,
        meter: Meter | None = None,
    ) -> None:
        """``item_ids``: claim only those items (``QueueStore.claim_items``), each once if
        due and free, rather than whatever is due. ``claim_seconds``: once this long
        has passed since the worker was made, stop after the claim under way, as
        ``stop()`` does (a task's bounded run; one claim at least)."""
        self.settings = settings or get_settings()
        self.store = store or get_store()
        self.owner = owner or default_owner()
        QueueStore.validate_owner(self.owner)
        self.concurrency = concurrency or self.settings.concurrency
        self.domain_concurrency = domain_concurrency or self.settings.domain_concurrency
        self.burst = burst
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not a secret
        self.transport = transport or self._default_transport()
        # Whether the transport last seen can begin a transaction with a final dot.
        self._follows: tuple[Transport, bool] | None = None
        self._resolver = resolver
        self._mta_sts = mta_sts
        self._mta_sts_lock = threading.Lock()  # delivery threads ask for it at once
        # The TLS sessions under MTA-STS policies, counted here and written now and then.
        self.tls_reports = TLSReportCounter(self.store)
        self.stats = Stats()
        self.meter = meter
        self._lease_until: dict[str, datetime] = {}
        self.recorder = Recorder(
            store=self.store,
            settings=self.settings,
            owner=self.owner,
            clock=clock,
            enqueue=enqueue or store_enqueue(self.store, self.settings, clock),
            stats=self.stats,
            lease_until=self._lease_until.get,
            meter=meter,
        )
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._stop_requested = False
        self._done = threading.Event()
        # Claimed items not started yet, each with the destinations it needs a slot at.
        self._waiting: list[tuple[QueueItem, set[str]]] = []
        # Started and not yet recorded; of those, the ones whose session has ended.
        self._in_flight: dict[str, QueueItem] = {}
        self._ended: set[str] = set()
        # The sessions under way: when each started, and whether it may turn slow.
        self._sessions: dict[str, _Session] = {}
        self._to_record: queue_module.SimpleQueue[Attempt | None] = queue_module.SimpleQueue()
        self._prefetched: dict[str, bytes] = {}
        # Per claimed item, its pending recipients the suppression list held at the claim.
        self._suppressed: dict[str, dict[str, Suppression]] = {}
        self._busy: Counter[str] = Counter()
        # The last claim took fewer items than it asked for: the queue had no more due,
        # so finished sessions need not wake the loop to claim until mail is announced.
        self._drained = False
        # Set while no session is under way: the recorder stops waiting for more.
        self._sessions_idle = threading.Event()
        self._sessions_idle.set()
        # SHAPING's side: None without it, so an unshaped worker never asks the store.
        self.shaper = Shaper.of(settings=self.settings, store=self.store, owner=self.owner, clock=clock)
        # The earliest time an item this worker held back for shaping falls due again:
        # the loop wakes for it rather than waiting for its poll.
        self._held_due: datetime | None = None
        # The ids still to claim, when this worker was given ids rather than the queue.
        self._ids_to_claim = None if item_ids is None else list(dict.fromkeys(item_ids))
        self._claim_until = None if claim_seconds is None else time.monotonic() + claim_seconds

    def _default_transport(self) -> Transport:
        from bumail_queue.delivery.smtp import SMTPTransport

        return SMTPTransport(
            hostname=self.settings.hostname,
            timeouts=self.settings.timeouts,
            reuse_seconds=self.settings.connection_reuse_seconds,
            mx_session_limit=self.settings.mx_session_limit,
            unreachable_memory_seconds=self.settings.unreachable_host_memory.total_seconds(),
            # Without signers it signs nothing, and the transport leaves it out.
            dkim=Signatures(self.settings.dkim, unsigned_on_error=self.settings.dkim_unsigned_on_error),
            ca_file=self.settings.tls_ca_file,
        )

    @property
    def resolver(self) -> Resolver:
        """The MX resolver, made when first needed: smarthost-only set-ups never need one."""
        if self._resolver is None:
            self._resolver = self._default_resolver()
        return self._resolver

    def _default_resolver(self) -> Resolver:
        from bumail_queue.delivery.dns import MXResolver

        return MXResolver(
            nameservers=self.settings.dns_nameservers,
            port=self.settings.mx_port,
            timeout=min(30.0, self.settings.timeouts.session),
            allowed_networks=self.settings.allowed_private_networks,
            address_limit=self.settings.mx_address_limit,
        )

    @property
    def mta_sts(self) -> STSPolicies | None:
        """The MTA-STS policies of recipient domains (``None`` with ``MTA_STS`` off),
        made when first needed, kept in the store for every worker."""
        if self._mta_sts is None and self.settings.mta_sts:
            with self._mta_sts_lock:
                if self._mta_sts is None:  # one for all threads: one fetch per domain
                    # Imported here: a worker whose mail all goes through smarthosts
                    # starts without dnspython and urllib3 (a tenth of its start-up).
                    from bumail_queue.delivery.mta_sts import STSPolicies

                    self._mta_sts = STSPolicies(
                        cache=self.store,
                        nameservers=self.settings.dns_nameservers,
                        https_port=self.settings.mta_sts_https_port,
                        ca_file=self.settings.tls_ca_file,
                        allowed_networks=self.settings.allowed_private_networks,
                        clock=self.clock,
                    )
        return self._mta_sts

    # -- control ----------------------------------------------------------------------

    def stop(self) -> None:
        """Claim nothing more; deliveries under way end, unstarted claims are given back."""
        self._stop_requested = True
        self._stopping.set()
        self.wake()

    def request_stop(self) -> None:
        """Ask the loop to stop, from a signal handler: it takes no lock, so it cannot
        deadlock with the thread it interrupts; the loop sees it within half a second."""
        self._stop_requested = True

    def sessions_under_way(self) -> int:
        """Return how many items are being delivered now (for a monitor)."""
        with self._changed:
            return len(self._sessions)

    @property
    def stopping(self) -> bool:
        return self._stop_requested or self._stopping.is_set()

    def wake(self) -> None:
        """Make an idle loop look for due items now (new mail was queued)."""
        with self._changed:
            self._drained = False
            self._changed.notify_all()

    def run_until_idle(self) -> Stats:
        """Deliver everything due, then return (``--burst``, ``queue.deliver_due()``)."""
        self.burst = True
        return self.run()

    def run(self) -> Stats:
        """Run the claim loop until ``stop()`` (or, in burst mode, until nothing is due)."""
        pool = ThreadPool(size=self.concurrency, limit=self.concurrency + self._slow_session_limit)
        renewer = threading.Thread(target=self._renew_leases, name="bumail-queue-leases", daemon=True)
        renewer.start()
        recorder = threading.Thread(target=self._record_loop, name="bumail-queue-recorder", daemon=True)
        recorder.start()
        listener = threading.Thread(target=self._listen, name="bumail-queue-listener", daemon=True)
        if not self.burst:
            listener.start()
        try:
            self._loop(pool)
        finally:
            self._stopping.set()
            self._give_back_waiting()
            self._wait_for_deliveries()
            self._done.set()
            pool.shutdown()
            self._to_record.put(None)
            recorder.join()
            renewer.join()
            if listener.is_alive():
                listener.join()
            self.transport.close()
            self.tls_reports.flush()
        return self.stats

    # -- the loop ---------------------------------------------------------------------

    def _loop(self, pool: ThreadPool) -> None:
        while not self.stopping:
            close_broken_connections()
            self.tls_reports.flush_if_due()
            claimed = self._claim()
            self._start_what_fits(pool)
            if self._claim_until is not None and time.monotonic() >= self._claim_until:
                # A bounded run: what was claimed and not started is given back, due at once.
                logger.info("claim time over owner=%s", self.owner, extra={"action": "stop"})
                self.stop()
                return
            if claimed and not self._drained:
                continue
            with self._changed:
                if self.burst and not self._waiting and not self._in_flight:
                    return
            self._idle(self._idle_seconds())
            self.transport.close_idle()
            if self.shaper is not None:
                self.shaper.forget_idle()

    def _idle(self, seconds: float) -> None:
        """Wait until woken, or ``seconds`` pass, or a stop is requested."""
        deadline = time.monotonic() + seconds
        with self._changed:
            while not self._stop_requested:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._changed.wait(timeout=min(remaining, 0.5)):
                    break
        if self._stop_requested and not self._stopping.is_set():
            logger.info("stopping after the deliveries under way owner=%s", self.owner, extra={"action": "stop"})
            self.stop()

    @property
    def _refill_below(self) -> int:
        """Claim again once fewer items than this wait to start.

        Half a batch ahead, so the next claim runs while the delivery threads work
        through what is left; claiming only once nothing waits would leave them idle
        for a claim's round trips every batch.
        """
        return max(self.concurrency, self.settings.claim_batch_size // 2)

    def _claim(self) -> list[QueueItem]:
        # Claim in batches (a claim is a commit), and only once the items waiting run
        # low, so a worker never hoards more than one batch beyond what it delivers.
        with self._changed:
            if len(self._waiting) >= self._refill_below:
                return []
        if self.stopping:
            return []
        now = self.clock()
        until = now + self.settings.lease
        limit = self.settings.claim_batch_size
        try:
            claimed, drained = self._claim_batch(now, until, limit)
        except QueueError as error:
            self.stats.store_errors += 1
            if self.meter is not None:
                self.meter.store_failed()
            report_error(error, None)
            self._stopping.wait(min(self.settings.poll_seconds, 5))
            return []
        if self.meter is not None:
            self.meter.claimed(len(claimed))
        prefetched = self._prefetch(claimed)
        suppressed = self._suppressed_in(claimed, now)
        with self._changed:
            self._drained = drained
            self._waiting.extend((item, self._limit_keys(item, suppressed.get(item.id, {}))) for item in claimed)
            self._prefetched.update(prefetched)
            self._suppressed.update(suppressed)
            for item in claimed:
                self._lease_until[item.id] = until
        return claimed

    def _claim_batch(self, now: datetime, until: datetime, limit: int) -> tuple[list[QueueItem], bool]:
        """Claim up to ``limit`` items; return them and whether nothing more is to claim."""
        if self._ids_to_claim is None:
            claimed = self.store.claim(owner=self.owner, now=now, lease_until=until, limit=limit)
            return claimed, len(claimed) < limit
        batch = self._ids_to_claim[:limit]
        claimed = self.store.claim_items(batch, owner=self.owner, now=now, lease_until=until) if batch else []
        del self._ids_to_claim[: len(batch)]  # after the claim: a store error leaves them to try again
        return claimed, not self._ids_to_claim

    def _prefetch(self, claimed: list[QueueItem]) -> dict[str, bytes]:
        # One query for a claim's messages, instead of one per session in the threads
        # that hold an SMTP connection open meanwhile. A failure here costs nothing:
        # each session then reads its own.
        small, budget = [], PREFETCH_BATCH_LIMIT
        for item in claimed:
            if item.size <= min(PREFETCH_MESSAGE_LIMIT, budget):
                small.append(item.id)
                budget -= item.size
        if not small:
            return {}
        try:
            return self.store.read_messages(small)
        except QueueError:
            return {}

    def _suppressed_in(self, claimed: list[QueueItem], now: datetime) -> dict[str, dict[str, Suppression]]:
        """Look a claim's pending recipients up in the suppression list, in one round trip.

        Here, before routing, rather than at enqueue: enqueue reads nothing more, an
        address suppressed after its mail was queued (a deferred recipient's) is caught
        at its next attempt, and a suppressed recipient fails through the recorder, with
        its signal, log entry and DSN, as any other failure.
        """
        if not self.settings.suppression or not claimed:
            return {}
        addresses = {r.address for item in claimed for r in item.pending_recipients}
        try:
            found = self.store.suppressions_of(addresses, now=now)
        except QueueError as error:
            # The lesser harm is to deliver: a remote that refuses a dead mailbox says so again.
            report_error(error, None)
            return {}
        by_item = {}
        for item in claimed:
            held = {r.address: found[r.address] for r in item.pending_recipients if r.address in found}
            if held:
                by_item[item.id] = held
        return by_item

    def _limit_keys(self, item: QueueItem, suppressed: Container[str] = ()) -> set[str]:
        # A suppressed recipient needs no session, so no slot at its destination.
        pending = [r.address for r in item.pending_recipients if r.address not in suppressed]
        return {d.limit_key for d in group_by_destination(pending, self.settings)}

    def _take_follower(self, destination: Destination, path: _Path, handoff: _Handoff) -> Envelope | None:
        """Start the next waiting item for ``destination`` on the session of the one
        whose final dot is about to go, and return its envelope; ``None`` if none waits.

        Called by the transport from a delivery thread. The follower takes over its
        predecessor's session and its ``DOMAIN_CONCURRENCY`` slot: the destination gets
        no more sessions than before, and its next message costs one round trip. Only
        an item whose every recipient goes to ``destination`` (but those the claim found
        suppressed, which fail without a session), and whose message was read with its
        claim, follows: the thread then goes straight to the session, on ``path``.
        """
        key = destination.limit_key
        with self._changed:
            if self.stopping or handoff.follower is not None:
                return None
            for index, (item, keys) in enumerate(self._waiting):
                if keys != {key} or (message := self._prefetched.get(item.id)) is None:
                    continue
                suppressed = self._suppressed.get(item.id, {})
                addresses = [r.address for r in item.pending_recipients if r.address not in suppressed]
                if list(group_by_destination(addresses, self.settings)) != [destination]:
                    continue  # the same smarthost host and port, another route (user, TLS)
                del self._waiting[index]
                del self._prefetched[item.id]
                self._in_flight[item.id] = item
                self._sessions[item.id] = _Session(
                    started=time.monotonic(), may_turn_slow=item.size <= SLOW_SESSION_MESSAGE_LIMIT
                )
                handoff.follower = _Follower(item=item, keys=keys, path=path, message=message)
                self._wake_loop_if_needed()  # a follower leaves fewer waiting: claim again in time
                return Envelope(item_id=item.id, sender=item.sender, recipients=tuple(addresses), message=message)
        return None

    def _start_what_fits(self, pool: ThreadPool) -> None:
        with self._changed:
            if self.stopping:
                return  # what waits is given back, not started
            now = time.monotonic()
            sessions = self._sessions_making_progress(now)
            still_waiting = []
            for index, (item, keys) in enumerate(self._waiting):
                if sessions >= self.concurrency:
                    still_waiting.extend(self._waiting[index:])
                    break
                if any(self._busy[key] >= self.domain_concurrency for key in keys):
                    still_waiting.append((item, keys))
                    continue
                self._busy.update(keys)
                self._in_flight[item.id] = item
                self._sessions[item.id] = _Session(started=now, may_turn_slow=item.size <= SLOW_SESSION_MESSAGE_LIMIT)
                sessions += 1
                self._sessions_idle.clear()
                pool.submit(functools.partial(self._deliver, item, keys, pool))
            self._waiting = still_waiting

    def _session_ended(
        self, item: QueueItem, keys: set[str], pool: ThreadPool, *, to_record: bool, kept: set[str]
    ) -> None:
        # The session's slots are free for the next item, but those a follower took
        # over with the session itself (``kept``); the lease stays until recorded.
        with self._changed:
            session = self._sessions.pop(item.id, None)
            if self.meter is not None and session is not None:
                self.meter.session_ended(time.monotonic() - session.started)
            self._busy.subtract(keys - kept)
            self._busy += Counter()  # drop the keys that reached zero
            if to_record:
                self._ended.add(item.id)
            else:
                self._forget(item.id)
            self._start_what_fits(pool)  # before the recorder can see no session under way
            if not self._sessions_under_way():
                self._sessions_idle.set()
            self._wake_loop_if_needed()

    def _sessions_under_way(self) -> int:
        """How many items are being delivered (call with ``_changed`` held): started,
        their session not yet ended."""
        return len(self._in_flight) - len(self._ended)

    @property
    def _slow_session_limit(self) -> int:
        """How many slow sessions may run beyond ``CONCURRENCY``."""
        return self.concurrency * SLOW_SESSIONS_PER_SLOT

    def _slow_sessions(self, now: float) -> int:
        """How many sessions under way wait on their peers (call with ``_changed`` held)."""
        return sum(1 for session in self._sessions.values() if session.is_slow(now))

    def _sessions_making_progress(self, now: float) -> int:
        """The sessions that count against ``CONCURRENCY`` (call with ``_changed`` held):
        all those under way but the slow ones, up to the slow sessions' own limit."""
        return len(self._sessions) - min(self._slow_sessions(now), self._slow_session_limit)

    def _seconds_until_a_session_turns_slow(self) -> float | None:
        """When a session under way next frees a ``CONCURRENCY`` slot by turning slow,
        if an item waits for one and the slow sessions' budget can take it (call with
        ``_changed`` held); ``None`` if no turn would start anything."""
        now = time.monotonic()
        if not self._waiting or self._sessions_making_progress(now) < self.concurrency:
            return None  # nothing waits, or it waits for its destination, not for a slot
        if self._slow_sessions(now) >= self._slow_session_limit:
            return None  # a slot frees only when a session ends
        turns = [
            session.turns_slow_at - now
            for session in self._sessions.values()
            if session.may_turn_slow and not session.is_slow(now)
        ]
        return min(turns, default=None)

    def _idle_seconds(self) -> float:
        """How long the loop may sleep: ``POLL_SECONDS``, or less when a slot frees
        sooner or an item held back for shaping falls due."""
        with self._changed:
            turn = self._seconds_until_a_session_turns_slow()
            held_due, self._held_due = self._held_due, None
        seconds = self.settings.poll_seconds if turn is None else max(0.0, min(self.settings.poll_seconds, turn))
        if held_due is not None:
            seconds = max(0.0, min(seconds, (held_due - self.clock()).total_seconds()))
        return seconds

    def _wake_loop_if_needed(self) -> None:
        """Wake the loop when it has something to do (call with ``_changed`` held): claim
        more, or see that nothing is left in flight. Not on every delivery: a loop that
        wakes for nothing costs the delivery threads the GIL."""
        refill = len(self._waiting) < self._refill_below and not self._drained
        if refill or not self._in_flight or self._stopping.is_set():
            self._changed.notify_all()

    def _forget(self, item_id: str) -> None:
        """Drop an item the worker no longer holds (call with ``_changed`` held)."""
        self._prefetched.pop(item_id, None)
        self._suppressed.pop(item_id, None)
        self._in_flight.pop(item_id, None)
        self._ended.discard(item_id)
        self._lease_until.pop(item_id, None)

    def _give_back_waiting(self) -> None:
        with self._changed:
            waiting = [item for item, _ in self._waiting]
            self._waiting = []
            self._prefetched.clear()
            for item in waiting:
                self._suppressed.pop(item.id, None)
        now = self.clock()
        for item in waiting:
            try:
                self.store.reschedule(item.id, at=now, owner=self.owner)
            except QueueError as error:
                report_error(error, item.id)
            self._lease_until.pop(item.id, None)
        if waiting:
            logger.info("gave back items=%d owner=%s", len(waiting), self.owner, extra={"action": "give_back"})

    def _wait_for_deliveries(self) -> None:
        with self._changed:
            while self._in_flight:
                self._changed.wait(timeout=0.5)

    def _renew_leases(self) -> None:
        # Runs until the loop and every delivery are over: a stopping worker's
        # sessions under way still need their leases.
        try:
            while not self._done.wait(self.settings.lease_seconds / 3):
                with self._changed:
                    held = list(self._lease_until)
                until = self.clock() + self.settings.lease
                for item_id in held:
                    try:
                        renewed = self.store.renew(item_id, owner=self.owner, lease_until=until)
                    except QueueError as error:
                        report_error(error, item_id)
                        continue
                    with self._changed:
                        if renewed and item_id in self._lease_until:
                            self._lease_until[item_id] = until
                if self.shaper is not None:
                    self.shaper.renew(until)  # the slots of sessions under way, leased as items are
        finally:
            connections.close_all()

    def _listen(self) -> None:
        # Sleeps on the store's announcements (LISTEN/NOTIFY) and wakes the loop, so
        # new mail starts within milliseconds; the poll stays as the fall-back.
        listener: WorkListener | None = None
        try:
            while not self.stopping:
                try:
                    if listener is None:
                        listener = self.store.listener()
                        if listener is None:
                            return
                    if listener.wait(timeout=1.0):
                        self.wake()
                except Exception as error:  # a dropped connection: say so, then listen anew
                    report_error(error, None)
                    if listener is not None:
                        listener.close()
                    listener = None
                    self._stopping.wait(self.settings.poll_seconds)
        finally:
            if listener is not None:
                listener.close()
            connections.close_all()

    # -- one item ---------------------------------------------------------------------

    def _deliver(self, item: QueueItem, keys: set[str], pool: ThreadPool) -> None:
        # Then, on the same session, each follower that took it over as its
        # predecessor's final dot went (see _take_follower).
        follower: _Follower | None = None
        while True:
            handoff = _Handoff()
            attempt = None
            try:
                attempt = self._attempt(item, follower=follower, handoff=handoff)
            except QueueError as error:  # the store is down: said once, the lease brings the item back
                report_error(error, item.id)
            except Exception as error:  # a bug: the lease brings the item back
                logger.exception("delivery failed item=%s", item.id, extra={"action": "error", "item_id": item.id})
                report_error(error, item.id)
            finally:
                kept = handoff.follower.keys if handoff.follower is not None else set()
                self._session_ended(item, keys, pool, to_record=attempt is not None, kept=kept)
            if attempt is not None:
                self._to_record.put(attempt)
            if (follower := handoff.follower) is None:
                return
            item, keys = follower.item, follower.keys

    def _record_loop(self) -> None:
        # Every attempt that ended while the last batch was written goes in the next.
        try:
            while (first := self._to_record.get()) is not None:
                batch = [first]
                # Let the batch fill while sessions are under way: a commit per few
                # attempts costs the database and this process far more than the
                # milliseconds the outcomes wait (the leases hold meanwhile).
                self._sessions_idle.wait(RECORD_LINGER_SECONDS)
                while len(batch) < RECORD_BATCH_LIMIT:
                    try:
                        attempt = self._to_record.get_nowait()
                    except queue_module.Empty:
                        break
                    if attempt is None:
                        self._to_record.put(None)  # still the recorder's last call
                        break
                    batch.append(attempt)
                close_broken_connections()
                try:
                    self.complete_many(batch)
                except Exception as error:  # a bug: the leases bring the items back
                    logger.exception("recording failed items=%d", len(batch), extra={"action": "error"})
                    for attempt in batch:
                        report_error(error, attempt.item.id)
                finally:
                    with self._changed:
                        for attempt in batch:
                            self._forget(attempt.item.id)
                        self._wake_loop_if_needed()
        finally:
            connections.close_all()

    def attempt(self, item: QueueItem) -> Attempt | None:
        """Try every pending recipient of ``item`` once; ``None`` if the item is gone.

        Those the claim found on the suppression list fail at once, untried.
        """
        return self._attempt(item)

    def _attempt(
        self, item: QueueItem, *, follower: _Follower | None = None, handoff: _Handoff | None = None
    ) -> Attempt | None:
        """``attempt()``; a ``follower`` goes on the session its predecessor left it, and
        the item that takes over this one's session, if one does, is put in ``handoff``."""
        with self._changed:
            prefetched = self._prefetched.pop(item.id, None)
            suppressed = self._suppressed.pop(item.id, {})
        message = follower.message if follower is not None else prefetched
        if message is None:
            close_broken_connections()  # the only database use of a delivery thread
            message = self.store.read_message(item.id)
        if message is None:
            if self.store.get(item.id) is None:
                return None  # cancelled, or finished by another worker: not ours to tell
            lost = {
                r.address: Outcome(status=RecipientStatus.FAILED, reply=LOST_MESSAGE_REPLY)
                for r in item.pending_recipients
            }
            return self._attempt_from(item, lost, dict.fromkeys(lost), message=None)
        # A suppressed recipient fails at once, with no session: its reply says until when.
        outcomes = {
            address: Outcome(status=RecipientStatus.FAILED, reply=suppressed_reply(entry))
            for address, entry in suppressed.items()
        }
        remote_hosts: dict[str, str | None] = dict.fromkeys(suppressed)
        tls: dict[str, bool] = {}
        held: list[Held] = []
        pending = [r.address for r in item.pending_recipients if r.address not in suppressed]
        groups = list(group_by_destination(pending, self.settings).items())
        for index, (destination, addresses) in enumerate(groups):
            envelope = Envelope(item_id=item.id, sender=item.sender, recipients=tuple(addresses), message=message)
            delivery = self._deliver_to(
                destination,
                envelope,
                path=follower.path if follower is not None else None,
                # Only the last destination's session may pass to a follower.
                handoff=handoff if index == len(groups) - 1 else None,
            )
            if isinstance(delivery, Held):
                held.append(delivery)  # its recipients keep their state, not attempted
                continue
            for address in addresses:
                outcomes[address] = delivery.outcomes[address]
                remote_hosts[address] = delivery.remote_host
                tls[address] = delivery.tls
        if held:
            return self._held_attempt(
                item, outcomes, remote_hosts, held, message=message, tls=tls, suppressed=frozenset(suppressed)
            )
        # The message is handed on: the DSNs return its header block, and recording
        # the last pending recipient drops it from the store.
        return self._attempt_from(
            item, outcomes, remote_hosts, message=message, tls=tls, suppressed=frozenset(suppressed)
        )

    def _held_attempt(
        self,
        item: QueueItem,
        outcomes: dict[str, Outcome],
        remote_hosts: dict[str, str | None],
        held: list[Held],
        *,
        message: bytes,
        tls: dict[str, bool],
        suppressed: frozenset[str],
    ) -> Attempt:
        """An attempt some of whose destinations shaping held back: the item is due again
        when the first of them has room (or sooner, for its retry); held alone, it goes
        back with no attempt counted and no signal."""
        until = min(h.until for h in held)
        with self._changed:
            self._held_due = until if self._held_due is None else min(self._held_due, until)
        for h in held:
            logger.debug(
                "held item=%s destination=%s reason=%s until=%s",
                item.id, h.key, h.reason, until.isoformat(),
                extra={"action": "held", "item_id": item.id},
            )  # fmt: skip
        if not outcomes:
            result = AttemptResult(outcomes={}, next_attempt_at=until, count_attempt=False)
            return Attempt(item=item, result=result, remote_hosts={}, headers=header_block(message), held=True)
        attempt = self._attempt_from(item, outcomes, remote_hosts, message=message, tls=tls, suppressed=suppressed)
        # Due when the held destination has room, or sooner when a recipient deferred
        # elsewhere is due again first.
        deferred = any(o.status == RecipientStatus.DEFERRED for o in attempt.result.outcomes.values())
        next_at = min(attempt.result.next_attempt_at, until) if deferred else until
        attempt.result = dataclasses.replace(attempt.result, next_attempt_at=next_at)
        return attempt

    def _deliver_to(
        self,
        destination: Destination,
        envelope: Envelope,
        *,
        path: _Path | None = None,
        handoff: _Handoff | None = None,
    ) -> Delivery | Held:
        """Deliver ``envelope`` to ``destination`` (``Held`` when shaping has no room for
        it). ``path``: a follower's, its predecessor's, looked up a moment ago. ``handoff``:
        where the item that takes over the session goes, if one may."""
        if path is None:
            found = self._path_to(destination, envelope)
            if isinstance(found, Delivery):
                return found
            path = found
        shape = None if self.shaper is None else self.shaper.shape(destination, path.hosts)
        if shape is None:
            follow = None if handoff is None else functools.partial(self._take_follower, destination, path, handoff)
            return self._send(envelope, path, follow=follow)
        # Shaped: no follower. It would go out without a permit of its own (RATE counts
        # every session, SUSPEND stops them), and a counted session ends with its slot.
        assert self.shaper is not None
        entry = self.shaper.enter(shape)
        if isinstance(entry, Held):
            return entry
        delivery = None
        try:
            # A counted session keeps no idle connection: it ends with its slot.
            delivery = self._send(envelope, path, reuse=not shape.limits.uses_slots)
            return delivery
        finally:
            self.shaper.leave(entry, delivery)

    def _following(self) -> FollowingTransport | None:
        """``transport``, if it can begin the next item's transaction with a message's
        final dot (asked of each transport once: a caller may replace it)."""
        transport = self.transport
        if self._follows is None or self._follows[0] is not transport:
            self._follows = (transport, _takes_follow(transport))
        return cast(FollowingTransport, transport) if self._follows[1] else None

    def _path_to(self, destination: Destination, envelope: Envelope) -> _Path | Delivery:
        """Return the route and hosts of ``destination`` under its MTA-STS policy, or the
        ``Delivery`` that decides ``envelope`` without a session (DNS, no allowed host)."""
        route = destination.route
        hosts: Sequence[Host]
        if route.type == "smarthost":
            assert route.host is not None and route.port is not None
            hosts = [Host(name=route.host, port=route.port)]
        else:
            assert destination.domain is not None
            found = self.resolver.destinations(destination.domain)
            if found.failure is not None:
                return Delivery(outcomes=dict.fromkeys(envelope.recipients, found.failure), remote_host=None)
            hosts = found.hosts
        policy = self.mta_sts.policy_for(destination.domain) if destination.domain and self.mta_sts else None
        if policy is not None:
            route, allowed = policy.route(route), policy.hosts(hosts)
            if not allowed:  # enforce, and no MX host matches: 4.7.5, no session
                self._count_tls(policy, (), excluded=hosts)
                return Delivery(outcomes=dict.fromkeys(envelope.recipients, policy.refusal(hosts)), remote_host=None)
            hosts = allowed
        return _Path(route=route, hosts=tuple(hosts), policy=policy)

    def _send(self, envelope: Envelope, path: _Path, *, reuse: bool = True, follow: Follow | None = None) -> Delivery:
        route, hosts = path.route, path.hosts
        if not reuse:
            delivery = self.transport.deliver(envelope, route=route, hosts=hosts, reuse=False)
        elif follow is not None and (following := self._following()) is not None:
            delivery = following.deliver(envelope, route=route, hosts=hosts, follow=follow)
        else:
            delivery = self.transport.deliver(envelope, route=route, hosts=hosts)
        if delivery.option_error is not None:
            # The route's options were refused (4.3.5): the configuration is to fix.
            report_error(delivery.option_error, envelope.item_id)
        if path.policy is not None:
            # A follower's session was opened, and counted, by its predecessor's delivery.
            self._count_tls(path.policy, delivery.tls_sessions)
        return delivery

    def _count_tls(
        self, policy: AppliedPolicy, sessions: Sequence[TLSSession], *, excluded: Sequence[Host] = ()
    ) -> None:
        """Count the sessions of a delivery under ``policy`` for the day's TLS report (RFC 8460)."""
        day = self.clock().astimezone(UTC).date()
        self.tls_reports.add(policy.counts(day, sessions, excluded=excluded))

    def _attempt_from(
        self,
        item: QueueItem,
        outcomes: dict[str, Outcome],
        remote_hosts: dict[str, str | None],
        *,
        message: bytes | None,
        tls: dict[str, bool] | None = None,
        suppressed: frozenset[str] = frozenset(),
    ) -> Attempt:
        return decide_attempt(
            item,
            outcomes,
            remote_hosts,
            message=message,
            settings=self.settings,
            now=self.clock(),
            rng=self.rng,
            tls=tls,
            suppressed=suppressed,
        )

    # -- recording ----------------------------------------------------------------------

    def complete(self, attempt: Attempt) -> QueueItem | None:
        """Complete an attempt in the store while the lease holds, then send its signals and DSNs."""
        return self.recorder.complete_many([attempt])[0]

    def complete_many(self, attempts: Sequence[Attempt]) -> list[QueueItem | None]:
        """Complete attempts in one step of the store (``QueueStore.complete_many``), then tell each one."""
        return self.recorder.complete_many(attempts)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Session:
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
class _Path:
    """How a destination's sessions go: its route and hosts as its MTA-STS policy leaves
    them (the policy's TLS, only the MX hosts it allows), and that policy, for the TLS
    reports (``None`` without one)."""

    route: Route
    hosts: tuple[Host, ...]
    policy: AppliedPolicy | None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class _Follower:
    """An item started on the session its predecessor was ending: the same
    destination, the same path, its message read with its claim."""

    item: QueueItem
    keys: set[str]
    path: _Path
    message: bytes


@dataclasses.dataclass(slots=True)
class _Handoff:
    """The follower that took over the session of the item being delivered, if one did."""

    follower: _Follower | None = None


def _takes_follow(transport: Transport) -> bool:
    """Return whether ``transport.deliver`` takes ``follow`` (a ``FollowingTransport``)."""
    try:
        return "follow" in inspect.signature(transport.deliver).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return False
