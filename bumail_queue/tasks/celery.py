"""The delivery task for Celery: ``bumail_queue.deliver_due`` (``pip install "bumail_queue[celery]"``).

Registered with ``shared_task``, so it joins the project's Celery app; the app
imports this module when ``TASKS`` names Celery (``apps.py``), in the web processes
and in the Celery worker alike. Celery beat runs it without arguments for the
periodic pass (docs/tasks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from celery import shared_task

from bumail_queue.conf import TaskSettings

from . import run

__all__ = ["deliver_due", "send"]

TASK_NAME = "bumail_queue.deliver_due"


@shared_task(name=TASK_NAME)  # type: ignore[untyped-decorator]
def deliver_due(ids: list[str] | None = None) -> dict[str, int]:
    """Deliver the items ``ids`` names, each if due and free; without ids, everything due."""
    return run(ids)


def send(ids: Sequence[str] | None, *, settings: TaskSettings, at: datetime | None = None) -> None:
    """Send ``deliver_due`` for ``ids`` (``None``: a pass) to the broker.

    Mail due later (``at``) is left to beat's pass: a Celery ETA is held by a worker
    until it is due, and the Redis and SQS brokers deliver it again to another worker
    each visibility timeout (an hour) until then.
    """
    if at is not None:
        return
    options = {"queue": settings.queue} if settings.queue else {}
    deliver_due.apply_async(args=[] if ids is None else [list(ids)], **options)
