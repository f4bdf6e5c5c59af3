from __future__ import annotations

import contextlib
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.signals import setting_changed
from django.utils.translation import gettext_lazy as _


class BumailQueueConfig(AppConfig):
    name = "bumail_queue"
    label = "bumail_queue"
    verbose_name = _("Mail queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, conf, delivery_log  # noqa: F401 - registers the checks and the settings' reload receiver

        delivery_log.connect()
        # Here rather than in conf, which the stores import: conf imports no store.
        setting_changed.connect(_rebuild_store, dispatch_uid="bumail_queue.rebuild_store")
        _register_celery_task()
        if apps.is_installed("anymail"):
            # anymail's webhooks feed the suppression list (docs/feedback.md); only
            # where the site serves them, so nothing is imported otherwise.
            from .feedback import esp_events

            esp_events.connect()


def _register_celery_task() -> None:
    """With ``TASKS`` naming Celery, register its delivery task in this process (a web
    process sends it, the Celery worker runs it), whether or not the project's Celery
    app autodiscovers tasks. No framework is imported otherwise, and nothing else of
    the settings is read here: the checks report what is wrong with them."""
    from .conf import task_framework

    if task_framework(getattr(settings, "BUMAIL_QUEUE", {})) == "celery":
        with contextlib.suppress(ImportError):  # Celery missing: bumail_queue.E025 says so
            from .tasks import celery  # noqa: F401 - registers bumail_queue.deliver_due


def _rebuild_store(*, setting: str, **kwargs: Any) -> None:
    """Drop the cached store when a setting it is built from changes (``override_settings``)."""
    from .conf import RELOADED_BY
    from .stores import get_store

    if setting in RELOADED_BY:
        get_store.cache_clear()
