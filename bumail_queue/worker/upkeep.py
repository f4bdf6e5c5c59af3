"""The worker's side threads and its stop: leases renewed, the store's announcements
listened for, and what was claimed but not started given back."""

from __future__ import annotations

import logging

from django.db import connections

from bumail_queue.errors import QueueError
from bumail_queue.outcomes import (
    report_error,
)
from bumail_queue.stores.base import WorkListener

from .base import WorkerBase

logger = logging.getLogger("bumail_queue.worker")


class Upkeep(WorkerBase):
    """Keeps the leases and the wake-ups going while the loop runs, and tidies up after it."""

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
