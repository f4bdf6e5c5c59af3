"""``BUMAIL_QUEUE``: read in this one place, validated, typed, reloaded on change.

``validate()`` is the single validator: ``load()`` raises on what it finds, and the
checks framework reports the same problems with ids, so ``manage.py check`` and a
start-up say the same thing. No message ever repeats the value of ``PASSWORD``.

Each area of the settings has its module here: its rules beside its typed values
(``routes``, ``shaping``, ``dkim``, ``mta_sts``, ``tasks``, ``monitoring``), the defaults
in ``defaults``, and ``schema`` with the one ``validate()`` that asks every area in turn.
This module alone reads ``BUMAIL_QUEUE`` from Django's settings, and caches it.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .defaults import BUILTIN_STORES, DEFAULT_TIMEOUTS, DEFAULTS, MAX_METRICS_DOMAINS, MIN_METRICS_TOKEN, SETTING_NAME
from .dkim import DKIM_ALGORITHMS, DKIMSigner
from .names import effective_hostname, normalise_domain, not_fqdn_reason
from .routes import ROUTE_TYPES, TLS_MODES, Route
from .schema import load, validate
from .shaping import shaping_pattern
from .tasks import DEFAULT_TASK_CLAIM_SECONDS, TASK_FRAMEWORKS, TaskSettings, task_framework
from .unsubscribe import DEFAULT_UNSUBSCRIBE_DURATION, ChannelUnsubscribe
from .validator import Problem
from .values import QueueSettings, Timeouts

__all__ = [
    "BUILTIN_STORES",
    "DEFAULTS",
    "DEFAULT_TASK_CLAIM_SECONDS",
    "DEFAULT_TIMEOUTS",
    "DEFAULT_UNSUBSCRIBE_DURATION",
    "DKIM_ALGORITHMS",
    "MAX_METRICS_DOMAINS",
    "MIN_METRICS_TOKEN",
    "RELOADED_BY",
    "ROUTE_TYPES",
    "SETTING_NAME",
    "TASK_FRAMEWORKS",
    "TLS_MODES",
    "ChannelUnsubscribe",
    "DKIMSigner",
    "Problem",
    "QueueSettings",
    "Route",
    "TaskSettings",
    "Timeouts",
    "effective_hostname",
    "get_settings",
    "load",
    "normalise_domain",
    "not_fqdn_reason",
    "shaping_pattern",
    "task_framework",
    "validate",
]


@functools.cache
def get_settings() -> QueueSettings:
    """Return the project's validated ``BUMAIL_QUEUE``, read once and cached."""
    return load(getattr(django_settings, SETTING_NAME, {}))


RELOADED_BY: Final = frozenset({SETTING_NAME, "DATABASES", "CACHES"})
"""The Django settings whose change makes the queue read its settings, and build its
store, anew (the store's own receiver is connected in ``apps.py``)."""


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    # override_settings would otherwise leave the cached values in place (the
    # limitation DRF's APISettings documents).
    if setting in RELOADED_BY:
        get_settings.cache_clear()
