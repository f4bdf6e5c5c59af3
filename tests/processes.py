"""Work done in other processes by the concurrency tests (``multiprocessing``, spawn).

Each process sets Django up on the test run's database, then uses the ORM store or
the queue service exactly as a worker or a web process on another machine would.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any


def _setup(database: dict[str, Any]) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django
    from django.conf import settings

    settings.DATABASES["default"].update(database)
    django.setup()


def claim_until_empty(database: dict[str, Any], owner: str, limit: int, barrier: Any, pause: float = 0.0) -> list[str]:
    """Claim due items until none is left; return the ids this process got.

    ``pause`` seconds pass between claims, as a worker's deliveries take time between
    its claims.
    """
    _setup(database)
    from django.utils import timezone

    from bumail_queue.conf import get_settings
    from bumail_queue.stores.orm import ORMStore

    store = ORMStore(get_settings())
    store.count()  # connect before the start line, so every process starts together
    barrier.wait()
    got: list[str] = []
    while True:
        now = timezone.now()
        claimed = store.claim(owner=owner, now=now, lease_until=now + timedelta(minutes=10), limit=limit)
        if not claimed:
            return got
        got.extend(item.id for item in claimed)
        if pause:
            time.sleep(pause)


def claim_until_empty_delivering(database: dict[str, Any], owner: str, limit: int, barrier: Any) -> list[str]:
    """``claim_until_empty`` with a millisecond of "delivery" after each claim.

    SQLite's wait for its write lock is not fair: a process that claims back to back
    can take every item before the other's wait ends. Workers deliver between claims.
    """
    return claim_until_empty(database, owner, limit, barrier, pause=0.001)


def enqueue_many_times(database: dict[str, Any], count: int, max_items: int, barrier: Any) -> tuple[int, int]:
    """Enqueue ``count`` messages one by one under ``MAX_ITEMS``; return (queued, refused)."""
    _setup(database)
    from django.core.mail import EmailMessage
    from django.test import override_settings

    from bumail_queue.errors import QueueError
    from bumail_queue.service import QueueService

    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "MAX_ITEMS": max_items}):
        service = QueueService()
        service.count()
        barrier.wait()
        queued = refused = 0
        for n in range(count):
            try:
                service.enqueue(EmailMessage(f"n{n}", "body", "app@example.com", [f"user{n}@example.org"]))
                queued += 1
            except QueueError as error:
                assert error.code == "FULL", error
                refused += 1
        return queued, refused


def modules_an_empty_burst_loads(database: dict[str, Any], watched: list[str]) -> list[str]:
    """Run ``queue_worker --burst`` on an empty queue in a fresh process; return which
    of the ``watched`` modules it had imported by the end."""
    _setup(database)
    import sys

    from django.core.management import call_command

    call_command("queue_worker", "--burst", verbosity=0)
    return [name for name in watched if name in sys.modules]
