"""The ORM store's gauges by channel, for the metrics: one statement, grouped.

Each channel's items by state and the oldest of each state, read with ``GROUP BY``
over the channel and what decides an item's state (a lease in force, an attempt made,
a hold); on PostgreSQL beyond ``gauge_sample_rows`` items, over a ``TABLESAMPLE`` of
about as many rows, scaled to the planner's estimate of the table, as ``gauges`` is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from bumail_queue.estimates import current_rows_estimate
from bumail_queue.queries import HELD_AT, ChannelGauges, ItemState, scaled

from .database import aware
from .queries import ORMTables


def channel_gauges(store: ORMTables, *, now: datetime) -> dict[str, ChannelGauges]:
    """Return each channel's gauges at ``now`` (a channel with no item is left out)."""
    q, items = store.quote, store.quote(store.items_table)
    with store.translated_errors():
        estimate = current_rows_estimate(store.connection, store.items_table)
        sampled = estimate is not None and estimate > store.gauge_sample_rows
        sample = (
            f"TABLESAMPLE SYSTEM ({100.0 * store.gauge_sample_rows / estimate:.6f})" if sampled and estimate else ""
        )
        sql = (
            f"SELECT {q('channel')}, ({q('lease_owner')} IS NOT NULL AND {q('lease_expires_at')} > %s), "
            f"{q('attempts')} > 0, {q('next_attempt_at')} >= %s, count(*), min({q('created_at')}) "
            f"FROM {items} {sample} GROUP BY 1, 2, 3, 4"
        )
        with store.connection.cursor() as cursor:
            cursor.execute(sql, [store.prep_time(now), store.prep_time(HELD_AT)])
            rows = cursor.fetchall()
    return channel_gauges_from_rows(rows, estimate=estimate if sampled else None)


def state_from(*, leased: bool, tried: bool, held: bool) -> ItemState:
    """The state of an item from what decides it, as ``queries.state_of`` judges it."""
    if leased:
        return ItemState.DELIVERING
    if held:
        return ItemState.HELD
    return ItemState.DEFERRED if tried else ItemState.QUEUED


def channel_gauges_from_rows(rows: Iterable[Sequence[Any]], *, estimate: int | None = None) -> dict[str, ChannelGauges]:
    """Read ``(channel, leased, tried, held, count, oldest created_at)`` rows; with the
    table's ``estimate``, the rows counted a sample of it."""
    counts: dict[str, dict[ItemState, int]] = {}
    oldest: dict[str, dict[ItemState, datetime | None]] = {}
    for channel, leased, tried, held, n, first in rows:
        state = state_from(leased=bool(leased), tried=bool(tried), held=bool(held))
        counts.setdefault(channel, dict.fromkeys(ItemState, 0))[state] += int(n)
        times = oldest.setdefault(channel, dict.fromkeys(ItemState))
        created = aware(first)
        if created is not None and (times[state] is None or created < times[state]):  # type: ignore[operator]
            times[state] = created
    scale: float | None = None
    if estimate is not None:
        counted = sum(sum(by_state.values()) for by_state in counts.values())
        scale = estimate / counted if counted else 0.0
    return {
        channel: ChannelGauges(
            items={state: scaled(n, scale) for state, n in by_state.items()},
            oldest=oldest[channel],
            exact=scale is None,
        )
        for channel, by_state in counts.items()
    }
