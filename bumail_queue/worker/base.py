"""The worker's state, its delivery stack (made when first needed) and the controls every
part of it shares: what a worker holds, and how it is stopped and woken."""

from __future__ import annotations

import logging
import os
import queue as queue_module
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from django.utils import timezone

from bumail_queue.conf import QueueSettings, get_settings
from bumail_queue.delivery.envelope import (
    Resolver,
    Transport,
)
from bumail_queue.delivery.tlsrpt import TLSReportCounter
from bumail_queue.errors import QueueConfigurationError
from bumail_queue.items import QueueItem
from bumail_queue.outcomes import (
    Attempt,
    Enqueue,
    Meter,
    Recorder,
    Stats,
    store_enqueue,
)
from bumail_queue.shaper import Shaper
from bumail_queue.stores import QueueStore, get_store
from bumail_queue.suppression import Suppression

from .sessions import SLOW_SESSIONS_PER_SLOT, Session

if TYPE_CHECKING:
    from bumail_queue.delivery.backend import BackendTransport
    from bumail_queue.delivery.mta_sts import STSPolicies

logger = logging.getLogger("bumail_queue.worker")


Clock = Callable[[], datetime]


def default_owner() -> str:
    """Return a lease owner name unique to this process: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{random.randrange(16**6):06x}"  # noqa: S311 - a name, not a secret


class WorkerBase:
    """What a worker holds: its settings, store and delivery stack, and the state its
    threads share under ``_changed``."""

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
        # The SMTP transport is made when the first delivery needs it: a run that finds
        # nothing due (a --burst from cron, most of the time) never imports the SMTP
        # client or reads a DKIM key.
        self._transport = transport
        self._transport_lock = threading.Lock()
        self._backends: BackendTransport | None = None  # made when a backend route is first used
        # What stopped the worker, if a route's configuration did: the command exits 1 with it.
        self.configuration_error: QueueConfigurationError | None = None
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
        self._sessions: dict[str, Session] = {}
        self._to_record: queue_module.SimpleQueue[Attempt | None] = queue_module.SimpleQueue()
        self._prefetched: dict[str, bytes] = {}
        # Per claimed item, its pending recipients the suppression list held at the claim.
        self._suppressed: dict[str, dict[str, Suppression]] = {}
        self._busy: Counter[str] = Counter()
        # The last claim took fewer items than it asked for: the queue had no more due,
        # so finished sessions need not wake the loop to claim until mail is announced.
        self._drained = False
        # Set while no session is under way, or while outcomes wait past the backlog's
        # limit: the recorder stops waiting for more to record in one commit.
        self._record_now = threading.Event()
        self._record_now.set()
        # SHAPING's side: None without it, so an unshaped worker never asks the store.
        self.shaper = Shaper.of(settings=self.settings, store=self.store, owner=self.owner, clock=clock)
        # The earliest time an item this worker held back for shaping falls due again:
        # the loop wakes for it rather than waiting for its poll.
        self._held_due: datetime | None = None
        # The ids still to claim, when this worker was given ids rather than the queue.
        self._ids_to_claim = None if item_ids is None else list(dict.fromkeys(item_ids))
        self._claim_until = None if claim_seconds is None else time.monotonic() + claim_seconds

    @property
    def transport(self) -> Transport:
        """The transport deliveries go through, made when first needed (one for all threads)."""
        if self._transport is None:
            with self._transport_lock:
                if self._transport is None:
                    self._transport = self._default_transport()
        return self._transport

    @transport.setter
    def transport(self, transport: Transport) -> None:
        self._transport = transport

    @property
    def backends(self) -> BackendTransport:
        """The transport of ``backend`` routes, made when first needed (one for all
        threads; each thread keeps its own connection to each backend)."""
        if self._backends is None:
            with self._transport_lock:
                if self._backends is None:
                    # Imported here: a worker with no backend route never imports it.
                    from bumail_queue.delivery.backend import BackendTransport

                    self._backends = BackendTransport()
        return self._backends

    def _close_transport(self, *, idle_only: bool = False) -> None:
        """Close the transport's connections (those idle past their reuse, with
        ``idle_only``); a transport never made has none."""
        if self._transport is not None:
            if idle_only:
                self._transport.close_idle()
            else:
                self._transport.close()
        if self._backends is not None and not idle_only:
            self._backends.close()

    def _default_transport(self) -> Transport:
        from bumail_queue.delivery.dkim import Signatures
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

    def stop(self) -> None:
        """Claim nothing more; deliveries under way end, unstarted claims are given back."""
        self._stop_requested = True
        self._stopping.set()
        self.wake()

    def _stop_for(self, error: QueueConfigurationError, item_id: str) -> None:
        """Stop at once on a configuration no delivery can get past (a backend route
        that cannot be imported or refuses its options), saying why in one line; the
        item's lease brings it back for a worker whose settings are fixed."""
        with self._changed:
            first = self.configuration_error is None
            if first:
                self.configuration_error = error
        if first:
            logger.error("stopping: %s", error.message, extra={"action": "stop", "item_id": item_id})
        self.stop()

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

    @property
    def _refill_below(self) -> int:
        """Claim again once fewer items than this wait to start.

        Half a batch ahead, so the next claim runs while the delivery threads work
        through what is left; claiming only once nothing waits would leave them idle
        for a claim's round trips every batch.
        """
        return max(self.concurrency, self.settings.claim_batch_size // 2)

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

    @property
    def _record_backlog_limit(self) -> int:
        """How many outcomes may wait to be recorded while sessions go on.

        Delivery may not run ahead of recording: an outcome not yet recorded is mail
        that goes again if the worker dies, and one whose lease the worker must keep
        renewing. Postfix's queue manager likewise gives a delivery agent work only
        after it has reported. As many as ``CONCURRENCY``, or a claim's worth
        (``CLAIM_BATCH_SIZE``) when that is more: the recorder writes all that waits in
        one commit, so a healthy store never holds delivery back, and a worker of few
        sessions still records many outcomes a commit.
        """
        return max(self.concurrency, self.settings.claim_batch_size)

    def _recording_behind(self) -> bool:
        """Whether no session may start (nor a follower) until the recorder catches up
        (call with ``_changed`` held).

        The outcomes waiting and the sessions under way that count against
        ``CONCURRENCY`` together stay within the backlog's limit and ``CONCURRENCY``:
        that many is the most a worker killed at any moment has delivered and not
        recorded, and so the most sent again (the slow sessions aside, which wait on
        their peers).
        """
        unrecorded = len(self._ended) + self._sessions_making_progress(time.monotonic())
        return unrecorded >= self._record_backlog_limit + self.concurrency

    def _sessions_under_way(self) -> int:
        """How many items are being delivered (call with ``_changed`` held): started,
        their session not yet ended."""
        return len(self._in_flight) - len(self._ended)

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
