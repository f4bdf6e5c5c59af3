"""The claim loop: claims in batches, starts what fits (``CONCURRENCY``,
``DOMAIN_CONCURRENCY``, slow sessions) and sleeps until there is something to do."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Container
from datetime import datetime

from bumail_queue.delivery.routes import group_by_destination
from bumail_queue.errors import QueueConfigurationError, QueueError
from bumail_queue.items import QueueItem
from bumail_queue.outcomes import (
    Stats,
    close_broken_connections,
    report_error,
)
from bumail_queue.suppression import Suppression, entry_in, scopes_of
from bumail_queue.threads import ThreadPool

from .attempts import Attempts
from .recording import Recording
from .sessions import (
    PREFETCH_BATCH_LIMIT,
    PREFETCH_MESSAGE_LIMIT,
    SLOW_SESSION_MESSAGE_LIMIT,
    Follower,
    Handoff,
    Session,
)
from .upkeep import Upkeep

logger = logging.getLogger("bumail_queue.worker")


class Worker(Attempts, Recording, Upkeep):
    """Claims due items and delivers them; see ``bumail_queue.worker``."""

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
            self._close_transport()
            self.tls_reports.flush()
        return self.stats

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
            self._close_transport(idle_only=True)
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
        scopes = {scope for item in claimed for scope in scopes_of(item.channel)}
        try:
            found = self.store.suppression_entries(addresses, now=now, scopes=sorted(scopes))
        except QueueError as error:
            # The lesser harm is to deliver: a remote that refuses a dead mailbox says so again.
            report_error(error, None)
            return {}
        by_item = {}
        for item in claimed:
            # The global entry first: it says more than a channel's.
            wanted = scopes_of(item.channel)
            held = {
                r.address: entry
                for r in item.pending_recipients
                if (entry := entry_in(found.get(r.address, ()), wanted)) is not None
            }
            if held:
                by_item[item.id] = held
        return by_item

    def _limit_keys(self, item: QueueItem, suppressed: Container[str] = ()) -> set[str]:
        # A suppressed recipient needs no session, so no slot at its destination.
        pending = [r.address for r in item.pending_recipients if r.address not in suppressed]
        return {d.limit_key for d in group_by_destination(pending, self.settings, item.channel)}

    def _start_what_fits(self, pool: ThreadPool) -> None:
        with self._changed:
            if self.stopping:
                return  # what waits is given back, not started
            if self._recording_behind():
                return  # the recorder wakes the loop once it has caught up
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
                self._sessions[item.id] = Session(started=now, may_turn_slow=item.size <= SLOW_SESSION_MESSAGE_LIMIT)
                sessions += 1
                self._record_now.clear()
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
            if not self._sessions_under_way() or self._recording_behind():
                self._record_now.set()
            self._wake_loop_if_needed()

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

    def _deliver(self, item: QueueItem, keys: set[str], pool: ThreadPool) -> None:
        # Then, on the same session, each follower that took it over as its
        # predecessor's final dot went (see _take_follower).
        follower: Follower | None = None
        while True:
            handoff = Handoff()
            attempt = None
            try:
                attempt = self._attempt(item, follower=follower, handoff=handoff)
            except QueueConfigurationError as error:  # a route set up wrongly: no mail can go by it
                self._stop_for(error, item.id)
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
