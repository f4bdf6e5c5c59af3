"""Helpers shared by the tests."""

from __future__ import annotations

import django.core.mail
from django.test import override_settings

BACKEND = "bumail_queue.backends.QueueEmailBackend"


def use_queue_backend() -> override_settings:
    """Make Django's mail API use the queue again (the test runner swaps in locmem).

    Django 6.1 reads ``MAILERS``; older versions read ``EMAIL_BACKEND``.
    """
    if hasattr(django.core.mail, "mailers"):
        return override_settings(MAILERS={"default": {"BACKEND": BACKEND}})
    return override_settings(EMAIL_BACKEND=BACKEND)
