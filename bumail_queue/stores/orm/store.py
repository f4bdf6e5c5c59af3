"""The ORM store: the queue in the project's own database (SQLite or PostgreSQL).

Reads go through the ORM. Writes that must be one step (a claim, an outcome, a
cancel) are single SQL statements with ``RETURNING``, so each is one round trip:

- a claim on PostgreSQL picks the earliest due items with ``FOR UPDATE SKIP LOCKED``
  and leases them in the same ``UPDATE``: no worker waits on another's rows;
- on SQLite the same ``UPDATE`` is a compare-and-set under SQLite's write lock, and
  re-checks that the lease is free, so two processes on one file never share an item;
- writes run at READ COMMITTED whatever the connection's default, since ``SKIP
  LOCKED`` and the ``MAX_ITEMS`` lock need that level;
- an enqueue joins the caller's transaction: a view that rolls back queues nothing.

The class is made of one class per capability over ``connection`` (the plumbing they
share: quoting, the drivers' values, the statement cache, the error translation):
``items`` (adding, reading, cancelling), ``claims`` (leases and outcomes, the claim's
statements in ``claim_sql``), ``retries``, ``bulk`` (a filter's items in pages, held
and released in batches, over ``retries``), ``sts``; it hands the operators' reads to
``queries``, the suppression list to ``suppressions`` and shaping to ``shaping``; the
database's particulars are ``database``'s.

"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core import checks

from bumail_queue.conf import QueueSettings
from bumail_queue.estimates import planner_estimate
from bumail_queue.items import QueueItem
from bumail_queue.queries import AGE_BUCKETS, ChannelGauges, ItemCount, ItemQuery, QueueGauges, QueueSummary
from bumail_queue.shaping import DestinationState, Permit, PermitRequest, WindowChange
from bumail_queue.stores.base import MESSAGE_HEAD_BYTES
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason, SuppressionUpdate

from . import channels, queries, suppressions
from .bulk import ORMBulk
from .claims import ORMClaims
from .database import (
    check_database,
)
from .items import ORMItems
from .shaping import ORMShaping
from .sts import ORMSTS


class ORMStore(ORMItems, ORMClaims, ORMBulk, ORMSTS):
    """Keeps the queue in ``bumail_queue_items`` / ``bumail_queue_messages`` of ``DATABASE``."""

    supports_transactional_enqueue = True
    counts_are_estimates = True
    claims_by_id = True
    supports_shaping = True

    def __init__(self, settings: QueueSettings) -> None:
        super().__init__(settings)
        self._shaping = ORMShaping(self)

    # -- shaping: one row per destination, each step one statement (shaping.py) -----

    def take_permit(self, request: PermitRequest) -> Permit:
        return self._shaping.take(request)

    def release_permit(
        self,
        key: str,
        *,
        slot: str | None,
        now: datetime,
        change: WindowChange = WindowChange.KEEP,
        concurrency: int | None = None,
        suspend_until: datetime | None = None,
    ) -> None:
        self._shaping.release(
            key, slot=slot, now=now, change=change, concurrency=concurrency, suspend_until=suspend_until
        )

    def renew_permit(self, key: str, *, slot: str, now: datetime, until: datetime) -> bool:
        return self._shaping.renew(key, slot=slot, now=now, until=until)

    def destination_states(self, *, now: datetime) -> builtins.list[DestinationState]:
        return self._shaping.states(now=now)

    def forget_idle_destinations(self, *, before: datetime, now: datetime) -> int:
        return self._shaping.forget_idle(before=before, now=now)

    # -- checks, and reading for operators (the admin, queue_status): queries.py ----

    def check(self, **kwargs: Any) -> builtins.list[checks.CheckMessage]:
        return check_database(self.connection, self.alias)

    def search(self, query: ItemQuery, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        """Match as ``ItemQuery`` says, and ``text`` in the message's header block too."""
        return queries.search(self, query, offset=offset, limit=limit)

    def read_message_heads(self, item_ids: Sequence[str], *, size: int = MESSAGE_HEAD_BYTES) -> dict[str, bytes]:
        return queries.read_message_heads(self, item_ids, size=size)

    def lanes(self) -> builtins.list[tuple[str, int]]:
        """One statement that skips through the lanes' index: a probe per lane."""
        return queries.lanes(self)

    def summary(self, *, now: datetime, age_buckets: Sequence[timedelta] = AGE_BUCKETS) -> QueueSummary:
        return queries.summary(self, now=now, age_buckets=age_buckets)

    def gauges(self, *, now: datetime) -> QueueGauges:
        """One statement; on PostgreSQL beyond ``gauge_sample_rows`` items, over a sample."""
        return queries.gauges(self, now=now)

    def channel_gauges(self, *, now: datetime) -> dict[str, ChannelGauges]:
        """One statement grouped by channel; on PostgreSQL beyond ``gauge_sample_rows``
        items, over a sample."""
        return channels.channel_gauges(self, now=now)

    def estimated_count(self) -> ItemCount:
        """On PostgreSQL, the planner's estimate once the table is large: no ``COUNT(*)``."""
        with self.translated_errors():
            estimate = planner_estimate(self.connection, self.items_table)
        return ItemCount(self.count(), exact=True) if estimate is None else ItemCount(estimate, exact=False)

    # -- the suppression list: suppressions.py -------------------------------------

    def suppression_entries(
        self, addresses: Iterable[str], *, now: datetime, scopes: Sequence[str] | None = None
    ) -> dict[str, builtins.list[Suppression]]:
        return suppressions.suppression_entries(self, addresses, now=now, scopes=scopes)

    def update_suppressions(self, change: SuppressionChange, *, now: datetime) -> SuppressionUpdate:
        self.validate_suppressions(change)
        if not change:
            return SuppressionUpdate()
        return suppressions.update_suppressions(self, change, now=now)

    def search_suppressions(
        self,
        *,
        now: datetime,
        text: str | None = None,
        scope: str | None = None,
        reason: SuppressionReason | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> builtins.list[Suppression]:
        wanted = suppressions.Wanted(text=text, scope=scope, reason=reason)
        return suppressions.search_suppressions(self, now=now, wanted=wanted, offset=offset, limit=limit)

    def count_suppressions(self, *, now: datetime) -> int:
        return suppressions.count_suppressions(self, now=now)

    def purge_suppressions(self, *, now: datetime) -> int:
        return suppressions.purge_suppressions(self, now=now)
