from __future__ import annotations

from django.apps import AppConfig


class MailingConfig(AppConfig):
    name = "mailing"
    verbose_name = "Mailing (example)"
