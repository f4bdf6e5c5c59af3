"""When to try a deferred recipient again, and when to stop (RFC 5321 §4.5.4.1)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from bumail_queue.conf import QueueSettings


def retry_delay(attempts: int, settings: QueueSettings, rng: random.Random | None = None) -> timedelta:
    """Return how long to wait after the ``attempts``-th attempt (1 for the first).

    The delay grows by ``RETRY_FACTOR`` from ``RETRY_MIN_DELAY`` up to
    ``RETRY_MAX_DELAY``. Jitter only lengthens it, by up to ``RETRY_JITTER`` of it, so
    a retry never comes sooner than §4.5.4.1's 30 minutes when that is the minimum,
    and mail deferred together is not retried together.
    """
    draw = (rng or random).random()
    base = settings.retry_min_delay.total_seconds() * settings.retry_factor ** max(attempts - 1, 0)
    capped = min(base, settings.retry_max_delay.total_seconds())
    return timedelta(seconds=capped * (1 + settings.retry_jitter * draw))


def has_expired(created_at: datetime, now: datetime, settings: QueueSettings) -> bool:
    """Return whether an item queued at ``created_at`` is past ``MAX_AGE`` at ``now``."""
    return now - created_at >= settings.max_age


def is_delay_due(created_at: datetime, now: datetime, settings: QueueSettings) -> bool:
    """Return whether an item still deferred at ``now`` owes its sender a delay DSN."""
    return now - created_at >= settings.delay_warning
