from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class BumailQueueConfig(AppConfig):
    name = "bumail_queue"
    label = "bumail_queue"
    verbose_name = _("Mail queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, conf, delivery_log  # noqa: F401 - registers the checks and the reload receiver

        delivery_log.connect()
