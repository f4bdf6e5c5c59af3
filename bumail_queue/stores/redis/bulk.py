"""The Redis store's bulk actions for operators: a filter's items a step of ``ZSCAN``
at a time, and a batch held or released in one script (``queue_hold``,
``queue_release``).

A held item's next attempt is ``HELD_AT`` and it is in no lane's ready set, so no
claim meets it; a release puts it back, due now. Each batch is one script over its
ids, about a millisecond for a thousand: the workers' claims run between batches.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime

from bumail_queue.queries import HELD_AT, BulkPage, HoldResult, ItemQuery

from . import scripts
from .connection import RedisConnection
from .layout import item_from_fields, micros, own_id, pairs


class RedisBulk(RedisConnection):
    """Pages through a filter's items, holds and releases batches of them."""

    def bulk_page(self, query: ItemQuery, *, cursor: str | None = None, limit: int = 1000) -> BulkPage:
        """One read-only script: a step of ``ZSCAN`` over ``items`` and each item's hash;
        the filter is matched here (``ItemQuery.matches``)."""
        step, page = self._run(
            scripts.BULK_PAGE, "read the items", [self.keys.items], [self.keys.prefix, cursor or "0", limit]
        )
        items = (item_from_fields(pairs(fields)) for fields in page)
        following = step.decode() if isinstance(step, bytes) else str(step)
        return BulkPage(
            items=tuple(item for item in items if query.matches(item)),
            cursor=None if following == "0" else following,
        )

    def hold(self, item_ids: Sequence[str], *, now: datetime) -> HoldResult:
        """One script for the batch: a status per id."""
        owns = self._owns(item_ids)
        args = [self.keys.prefix, micros(now), micros(HELD_AT), *dict.fromkeys(owns.values())]
        keys = [self.keys.items, self.keys.leases]
        replies = self._run(scripts.HOLD, "hold the items", keys, args) if owns else []
        return _result(item_ids, owns, replies)

    def release(self, item_ids: Sequence[str], *, now: datetime) -> HoldResult:
        """One script for the batch, which wakes idle workers when one was released."""
        owns = self._owns(item_ids)
        args = [self.keys.prefix, micros(now), micros(HELD_AT), self.keys.wake, *dict.fromkeys(owns.values())]
        replies = self._run(scripts.RELEASE, "release the items", [self.keys.items], args) if owns else []
        return _result(item_ids, owns, replies)

    @staticmethod
    def _owns(item_ids: Sequence[str]) -> dict[str, str]:
        return {item_id: own for item_id in dict.fromkeys(item_ids) if (own := own_id(item_id)) is not None}


def _result(item_ids: Sequence[str], owns: dict[str, str], replies: builtins.list[int]) -> HoldResult:
    """The ids as given, each where the script's status put it."""
    status = dict(zip(dict.fromkeys(owns.values()), map(int, replies), strict=True))
    given = builtins.list(dict.fromkeys(item_ids))
    of = {item_id: status.get(owns[item_id], -1) if item_id in owns else -1 for item_id in given}
    return HoldResult(
        changed=tuple(item_id for item_id in given if of[item_id] == 1),
        leased=tuple(item_id for item_id in given if of[item_id] == 0),
        unchanged=tuple(item_id for item_id in given if of[item_id] not in (0, 1)),
    )
