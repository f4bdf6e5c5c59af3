"""The queue's gauges for Prometheus: read through the store at every scrape.

A custom collector (prometheus-client's ``Collector``): nothing is counted between
scrapes, and every process that serves it (a worker's endpoint, the web process's
view) reports the same numbers, the store's. ``QueueStore.gauges`` keeps a scrape
cheap on a large queue; the delivery log's last hour is one indexed range.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

from django.db import DatabaseError, connections
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bumail_queue import delivery_log
from bumail_queue.conf import QueueSettings, get_settings
from bumail_queue.errors import QueueError
from bumail_queue.queries import GAUGED_RECIPIENTS, ItemState, QueueGauges
from bumail_queue.shaping import Patterns
from bumail_queue.stores import QueueStore, get_store

logger = logging.getLogger(__name__)

#: How far back ``bumail_queue_delivery_log_entries_last_hour`` counts.
LOG_WINDOW = timedelta(hours=1)


class QueueCollector(Collector):
    """Yields the queue's gauges, read from the configured store when scraped.

    ``close_connections``: close this thread's database connections after each
    scrape, for a server that scrapes on a thread of its own each time (the
    worker's); never inside a Django request, whose connections Django manages.
    """

    def __init__(
        self,
        *,
        store: Callable[[], QueueStore] = get_store,
        settings: Callable[[], QueueSettings] = get_settings,
        clock: Callable[[], datetime] = timezone.now,
        close_connections: bool = False,
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._close_connections = close_connections

    def describe(self) -> list[Metric]:
        """Name the families without reading the store (registration reads nothing)."""
        return [_up_family(), *_queue_families(), _log_family(), *_quota_families()]

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        try:
            yield from self._queue(now)
            if self._settings().delivery_log:
                yield from self._log(now)
            if any(limits.quota is not None for limits in self._settings().shaping.values()):
                yield from self._quotas(now)
        finally:
            if self._close_connections:
                connections.close_all()

    def _queue(self, now: datetime) -> Iterator[Metric]:
        up = _up_family()
        try:
            gauges = self._store().gauges(now=now)
        except QueueError as error:
            # The worker's own metrics are still worth serving: say the store is down.
            logger.warning("the queue's gauges could not be read: %s", error)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _queue_families(gauges)

    def _log(self, now: datetime) -> Iterator[Metric]:
        try:
            counts = delivery_log.outcomes_since(now - LOG_WINDOW)
        except DatabaseError as error:
            logger.warning("the delivery log could not be read: %s", error)
            return
        family = _log_family()
        for status, count in counts.items():
            family.add_metric([status], count)
        yield family

    def _quotas(self, now: datetime) -> Iterator[Metric]:
        """Each shaped destination's quota in force and what it counted in its window."""
        patterns = Patterns(self._settings().shaping)
        try:
            states = self._store().destination_states(now=now)
        except QueueError as error:
            logger.warning("the shaping buckets could not be read: %s", error)
            return
        used, allowed = _quota_families()
        for state in states:
            shown = state.with_quota(patterns.limits_of(state.key), now)
            if shown.quota is not None:
                used.add_metric([state.key], shown.quota_used)
                allowed.add_metric([state.key], shown.quota)
        yield from (used, allowed)


def _quota_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    used = GaugeMetricFamily(
        "bumail_queue_quota_used",
        "What a destination's SHAPING QUOTA counted in its rolling window (recipients, or messages with COUNT).",
        labels=["destination"],
    )
    allowed = GaugeMetricFamily(
        "bumail_queue_quota_limit",
        "The QUOTA in force at a destination now: its WARMUP step of the day, then QUOTA.",
        labels=["destination"],
    )
    return used, allowed


def _up_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "bumail_queue_store_up", "1 when the queue's store answered this scrape, 0 when it could not be read."
    )


def _queue_families(gauges: QueueGauges | None = None) -> list[Metric]:
    items = GaugeMetricFamily(
        "bumail_queue_items",
        "Items in the queue by state: queued (not tried yet), deferred (tried, waiting for a retry), "
        "delivering (a worker holds its lease).",
        labels=["state"],
    )
    recipients = GaugeMetricFamily(
        "bumail_queue_recipients",
        "Recipients in the queue not final yet: pending (never tried) or deferred.",
        labels=["state"],
    )
    oldest = GaugeMetricFamily(
        "bumail_queue_oldest_item_age_seconds",
        "Age of the oldest item in each state, since it was queued (0 when none is in that state).",
        labels=["state"],
    )
    due = GaugeMetricFamily("bumail_queue_items_due", "Items due now that no worker holds yet.")
    due_wait = GaugeMetricFamily(
        "bumail_queue_due_wait_seconds",
        "How long the item due the longest has waited for a worker (0 when none is due).",
    )
    exact = GaugeMetricFamily(
        "bumail_queue_counts_exact",
        "1 when the queue's counts are exact, 0 when estimated from a sample of a large queue.",
    )
    if gauges is not None:
        now = gauges.now
        for state in ItemState:
            items.add_metric([state.value], gauges.items.get(state, 0))
            since = gauges.oldest.get(state)
            oldest.add_metric([state.value], 0 if since is None else _seconds(now - since))
        for status in GAUGED_RECIPIENTS:
            recipients.add_metric([status.value], gauges.recipients.get(status, 0))
        due.add_metric([], gauges.due)
        due_wait.add_metric([], 0 if gauges.first_due_at is None else _seconds(now - gauges.first_due_at))
        exact.add_metric([], 1 if gauges.exact else 0)
    return [items, recipients, oldest, due, due_wait, exact]


def _log_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "bumail_queue_delivery_log_entries_last_hour",
        "Delivery log entries of the last hour by status: each recipient's outcome, from every worker.",
        labels=["status"],
    )


def _seconds(span: timedelta) -> float:
    return max(0.0, span.total_seconds())
