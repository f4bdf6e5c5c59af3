"""The queue's gauges for Prometheus: read through the store at every scrape.

A custom collector (prometheus-client's ``Collector``): nothing is counted between
scrapes, and every process that serves it (a worker's endpoint, the web process's
view) reports the same numbers, the store's. ``QueueStore.gauges`` keeps a scrape
cheap on a large queue; the delivery log's last hour is one indexed range.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import datetime, timedelta

from django.db import DatabaseError, connections
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bumail_queue import delivery_log
from bumail_queue.conf import QueueSettings, get_settings
from bumail_queue.errors import QueueError
from bumail_queue.queries import GAUGED_RECIPIENTS, ChannelGauges, ItemState, QueueGauges
from bumail_queue.shaping import Patterns
from bumail_queue.stores import QueueStore, get_store

logger = logging.getLogger(__name__)

#: How far back ``bumail_queue_delivery_log_entries_last_hour`` counts.
LOG_WINDOW = timedelta(hours=1)

#: How many channels the ``channel`` label names at most: ``default`` and those the
#: settings name (``CHANNEL_ROUTES``, ``UNSUBSCRIBE``) always, then the others that hold
#: the most items; the rest are summed under ``OTHER_CHANNELS``.
CHANNEL_LABELS = 20
#: The ``channel`` label of the channels beyond ``CHANNEL_LABELS``.
OTHER_CHANNELS = "other"


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
        return [
            _up_family(),
            *_queue_families(),
            *_channel_families(),
            _log_family(),
            _throttled_family(),
            *_quota_families(),
        ]

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        try:
            yield from self._queue(now)
            if self._settings().delivery_log:
                yield from self._log(now)
            if self._settings().shaping:
                yield from self._shaping(now)
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
        try:
            by_channel = self._store().channel_gauges(now=now)
        except QueueError as error:
            logger.warning("the queue's gauges by channel could not be read: %s", error)
            return
        settings = self._settings()
        named = {"default", *settings.channel_routes, *settings.unsubscribe}
        yield from _channel_families(fold_channels(by_channel, named), now)

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

    def _shaping(self, now: datetime) -> Iterator[Metric]:
        """Whether each shaped destination holds mail back; with a ``QUOTA`` set, each
        one's quota in force and what it counted in its window."""
        shaping = self._settings().shaping
        patterns = Patterns(shaping)
        try:
            states = self._store().destination_states(now=now)
        except QueueError as error:
            logger.warning("the shaping buckets could not be read: %s", error)
            return
        throttled = _throttled_family()
        for state in states:
            throttled.add_metric([state.key], 1 if state.is_throttled(now) else 0)
        yield throttled
        if not any(limits.quota is not None for limits in shaping.values()):
            return
        used, allowed = _quota_families()
        for state in states:
            shown = state.with_quota(patterns.limits_of(state.key), now)
            if shown.quota is not None:
                used.add_metric([state.key], shown.quota_used)
                allowed.add_metric([state.key], shown.quota)
        yield from (used, allowed)


def _throttled_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "bumail_queue_destination_throttled",
        "1 while a shaped destination holds mail back (suspended, or items waiting for a slot or its quota), else 0.",
        labels=["destination"],
    )


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


def fold_channels(
    by_channel: Mapping[str, ChannelGauges], named: Collection[str], *, limit: int = CHANNEL_LABELS
) -> dict[str, ChannelGauges]:
    """Return the gauges under the channel labels the metrics show: each of ``named``
    (with no item, zero), then the channels holding the most items (ties by name) up to
    ``limit`` labels in all, then every other channel summed under ``OTHER_CHANNELS``
    (present only when one is). Summed over the labels, the counts are the queue's."""
    empty = ChannelGauges(items=dict.fromkeys(ItemState, 0), oldest=dict.fromkeys(ItemState))
    shown = {channel: by_channel.get(channel, empty) for channel in sorted(named)}
    rest = sorted((c for c in by_channel if c not in shown), key=lambda c: (-by_channel[c].total, c))
    room = max(0, limit - len(shown))
    shown |= {channel: by_channel[channel] for channel in rest[:room]}
    folded = [by_channel[channel] for channel in rest[room:]]
    if folded:
        shown[OTHER_CHANNELS] = _summed([*folded, *([shown[OTHER_CHANNELS]] if OTHER_CHANNELS in shown else [])])
    return shown


def _summed(gauges: list[ChannelGauges]) -> ChannelGauges:
    """The gauges of several channels as one: counts added, the oldest of the oldest."""
    oldest: dict[ItemState, datetime | None] = {}
    for state in ItemState:
        times = [t for g in gauges if (t := g.oldest.get(state)) is not None]
        oldest[state] = min(times, default=None)
    return ChannelGauges(
        items={state: sum(g.items.get(state, 0) for g in gauges) for state in ItemState},
        oldest=oldest,
        exact=all(g.exact for g in gauges),
    )


def _channel_families(by_label: Mapping[str, ChannelGauges] | None = None, now: datetime | None = None) -> list[Metric]:
    items = GaugeMetricFamily(
        "bumail_queue_channel_items",
        "Items in the queue by channel and state (as bumail_queue_items); channels beyond "
        f'the {CHANNEL_LABELS} shown are summed under channel="{OTHER_CHANNELS}".',
        labels=["channel", "state"],
    )
    oldest = GaugeMetricFamily(
        "bumail_queue_channel_oldest_item_age_seconds",
        "Age of the oldest item of each channel in each state, since it was queued (0 when none).",
        labels=["channel", "state"],
    )
    if by_label is not None and now is not None:
        for channel, gauges in by_label.items():
            for state in ItemState:
                items.add_metric([channel, state.value], gauges.items.get(state, 0))
                since = gauges.oldest.get(state)
                oldest.add_metric([channel, state.value], 0 if since is None else _seconds(now - since))
    return [items, oldest]


def _log_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "bumail_queue_delivery_log_entries_last_hour",
        "Delivery log entries of the last hour by status: each recipient's outcome, from every worker.",
        labels=["status"],
    )


def _seconds(span: timedelta) -> float:
    return max(0.0, span.total_seconds())
