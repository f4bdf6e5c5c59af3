"""The Celery app of the delivery task tests: the Redis at ``REDIS_URL``, under a key
prefix and a queue of the test's own, so that runs side by side never share a message.

``celery -A tests.celery_app worker`` runs it as a project's worker would: Celery's
Django fix-up sets Django up (``DJANGO_SETTINGS_MODULE``), and bumail_queue's app
registers ``bumail_queue.deliver_due`` when ``TASKS`` names Celery. The worker reads
its prefix and queue from ``BUMAIL_TEST_CELERY_PREFIX`` and ``BUMAIL_TEST_CELERY_QUEUE``
and, with ``BUMAIL_TEST_CELERY_BEAT`` (seconds), beat runs the documented periodic pass.
"""

from __future__ import annotations

import os

from celery import Celery


def make_app(*, prefix: str, queue: str, beat_seconds: float | None = None) -> Celery:
    app = Celery("bumail_queue_tests")
    app.conf.update(
        broker_url=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0",
        broker_transport_options={"global_keyprefix": prefix},
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    if beat_seconds is not None:
        # docs/tasks.md's schedule: every minute there, here as often as the test says.
        app.conf.beat_schedule = {
            "bumail-queue-deliver-due": {"task": "bumail_queue.deliver_due", "schedule": beat_seconds}
        }
    return app


_beat = os.environ.get("BUMAIL_TEST_CELERY_BEAT")
app = make_app(
    prefix=os.environ.get("BUMAIL_TEST_CELERY_PREFIX", "bumail:test:celery:"),
    queue=os.environ.get("BUMAIL_TEST_CELERY_QUEUE", "bumail-test"),
    beat_seconds=float(_beat) if _beat else None,
)
