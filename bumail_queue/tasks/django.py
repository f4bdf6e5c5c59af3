"""The delivery task for ``django.tasks``: Django 6.0's own, or on Django 5.2 the
django-tasks backport's (``pip install "bumail_queue[tasks]"``), whose API is the same.

Django 6's module is preferred where it exists: with the backport also installed, a
task of the other framework would be read from another ``TASKS`` handler.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from bumail_queue.conf import TaskSettings, get_settings
from bumail_queue.errors import QueueConfigurationError

from . import run

if TYPE_CHECKING or importlib.util.find_spec("django.tasks") is not None:
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, task, task_backends
else:  # Django 5.2
    from django_tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, task, task_backends

__all__ = ["deliver_due", "send"]


def _configured() -> TaskSettings | None:
    try:
        tasks = get_settings().tasks
    except QueueConfigurationError:
        return None  # the checks say why; the task still imports
    return tasks if tasks is not None and tasks.framework == "django" else None


_AT_IMPORT = _configured()


# The backend and queue a task is bound to are checked when it is made (its queue must
# be one of the backend's QUEUES): those of TASKS, read once here; send() moves the
# task to others where the setting changed since.
@task(
    backend=_AT_IMPORT.backend if _AT_IMPORT else DEFAULT_TASK_BACKEND_ALIAS,
    queue_name=(_AT_IMPORT.queue if _AT_IMPORT else None) or DEFAULT_TASK_QUEUE_NAME,
)
def deliver_due(ids: list[str] | None = None) -> dict[str, int]:
    """Deliver the items ``ids`` names, each if due and free; without ids, everything due.

    Enqueue it with no argument from a scheduler for the periodic pass.
    """
    return run(ids)


def send(ids: Sequence[str] | None, *, settings: TaskSettings, at: datetime | None = None) -> None:
    """Enqueue ``deliver_due`` for ``ids`` (``None``: a pass), after ``at`` if given; a
    backend that cannot defer a task leaves mail due later to the periodic pass."""
    if at is not None and not task_backends[settings.backend].supports_defer:
        return
    deliver_due.using(
        backend=settings.backend, queue_name=settings.queue or DEFAULT_TASK_QUEUE_NAME, run_after=at
    ).enqueue(None if ids is None else list(ids))
