"""Delivery driven from a task framework: ``BUMAIL_QUEUE["TASKS"]`` (docs/tasks.md).

With ``TASKS`` on, the service sends a delivery task once an enqueue is visible (on
commit of the queue's database): ``send()`` of the framework's module, ``tasks.django``
(``django.tasks``, or the django-tasks backport on Django 5.2) or ``tasks.celery``. A
task's only argument is the ids of the items it is for, never a message or an
address; without ids it runs one pass over everything due, which a scheduler (Celery
beat, cron) runs for retries and for anything a lost task missed.

Every task runs ``run()``: ``queue.deliver_due()`` for its ids, claimed under a lease
(``QueueStore.claim_items``), so a duplicated task delivers nothing twice; bounded by
``CLAIM_SECONDS``, so a large queue never holds a task worker for long. Importing this
package imports no framework; each framework's module imports its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bumail_queue.conf import DEFAULT_TASK_CLAIM_SECONDS, get_settings
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.service import queue

__all__ = ["run"]


def run(ids: Sequence[str] | None = None) -> dict[str, int]:
    """Deliver the items ``ids`` names that are due and free (``None``: everything due),
    claiming for at most ``CLAIM_SECONDS``; return what was done, for the task's result."""
    item_ids = _checked_ids(ids)
    tasks = get_settings().tasks
    claim_seconds = tasks.claim_seconds if tasks is not None else DEFAULT_TASK_CLAIM_SECONDS
    stats = queue.deliver_due(ids=item_ids, claim_seconds=claim_seconds)
    return {
        "items": stats.items,
        "delivered": stats.delivered,
        "deferred": stats.deferred,
        "failed": stats.failed,
        "store_errors": stats.store_errors,
    }


def _checked_ids(ids: Any) -> list[str] | None:
    """The ids a task was given, or ``QueueError(INVALID)`` for anything but a list of strings."""
    if ids is None:
        return None
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence) or not all(isinstance(i, str) for i in ids):
        raise QueueError(
            ErrorCode.INVALID, f"A delivery task takes a list of item ids, or nothing; got {type(ids).__name__}."
        )
    return list(ids)
