"""The delivery threads of a worker: as many as its sessions need, up to a limit."""

from __future__ import annotations

import queue as queue_module
import threading
from collections.abc import Callable

from django.db import connections

__all__ = ["POOL_IDLE_SECONDS", "ThreadPool"]

POOL_IDLE_SECONDS = 60.0
"""A delivery thread beyond ``CONCURRENCY`` ends once it has had no session this long."""


class ThreadPool:
    """Threads started as jobs need them, up to ``limit``: ``size`` of them stay, the
    others end after ``POOL_IDLE_SECONDS`` without a job. Each closes its own database
    connections when it ends."""

    def __init__(self, *, size: int, limit: int) -> None:
        self._size = size
        self._limit = limit
        self._jobs: queue_module.SimpleQueue[Callable[[], None] | None] = queue_module.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting for a job
        self._queued = 0  # jobs submitted and not yet taken
        self._named = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._queued += 1
            # Each queued job needs a thread waiting for it; at the limit, it waits for
            # a session to end (the worker never starts more sessions than the limit).
            if self._queued > self._idle and len(self._threads) < self._limit:
                self._start_thread()
        self._jobs.put(job)

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._serve, name=f"bumail-queue-delivery-{self._named}", daemon=True)
        self._named += 1
        self._threads.add(thread)
        thread.start()

    def _serve(self) -> None:
        try:
            while (job := self._next_job()) is not None:
                job()
        finally:
            connections.close_all()

    def _next_job(self) -> Callable[[], None] | None:
        """Wait for a job; ``None`` at shutdown, or when this thread is one too many."""
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=POOL_IDLE_SECONDS)
            except queue_module.Empty:
                with self._lock:
                    self._idle -= 1
                    # Stay while a job is queued that no other idle thread will take.
                    if len(self._threads) > self._size and self._queued <= self._idle:
                        self._threads.discard(threading.current_thread())
                        return None
                continue
            with self._lock:
                self._idle -= 1
                if job is None:
                    self._threads.discard(threading.current_thread())
                else:
                    self._queued -= 1
            return job

    def shutdown(self) -> None:
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join()
