"""The recorder thread: attempts are written in batches, one commit each, while the
delivery threads go on."""

from __future__ import annotations

import logging
import queue as queue_module
from collections.abc import Sequence

from django.db import connections

from bumail_queue.items import QueueItem
from bumail_queue.outcomes import (
    Attempt,
    close_broken_connections,
    report_error,
)

from .base import WorkerBase

logger = logging.getLogger("bumail_queue.worker")


RECORD_BATCH_LIMIT = 200
"""The most attempts the recorder writes in one commit."""

RECORD_LINGER_SECONDS = 0.02
"""How long the recorder lets a batch fill while sessions are under way; it records
at once when none is."""


class Recording(WorkerBase):
    """Records what the delivery threads hand over, a batch at a time."""

    def _record_loop(self) -> None:
        # Every attempt that ended while the last batch was written goes in the next.
        try:
            while (first := self._to_record.get()) is not None:
                batch = [first]
                # Let the batch fill while sessions are under way: a commit per few
                # attempts costs the database and this process far more than the
                # milliseconds the outcomes wait (the leases hold meanwhile). Not once
                # the backlog is full: sessions wait for it to be recorded.
                self._record_now.wait(RECORD_LINGER_SECONDS)
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
                        behind = self._recording_behind()
                        for attempt in batch:
                            self._forget(attempt.item.id)
                        if behind:
                            self._changed.notify_all()  # the loop starts what waited for this
                        else:
                            self._wake_loop_if_needed()
        finally:
            connections.close_all()

    def complete(self, attempt: Attempt) -> QueueItem | None:
        """Complete an attempt in the store while the lease holds, then send its signals and DSNs."""
        return self.recorder.complete_many([attempt])[0]

    def complete_many(self, attempts: Sequence[Attempt]) -> list[QueueItem | None]:
        """Complete attempts in one step of the store (``QueueStore.complete_many``), then tell each one."""
        return self.recorder.complete_many(attempts)
