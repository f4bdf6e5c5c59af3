"""The Redis store's gauges for the metrics: the queue's counts, exact or from a draw.

The sorted sets give the counts they order at any size; what only an item's hash
holds (its state, its recipients, its age) comes from a random draw of items once
the queue outgrows ``gauge_sample_rows``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from bumail_queue.items import DEFAULT_CHANNEL
from bumail_queue.queries import ChannelGauges, GaugeTally, ItemState, QueueGauges, channel_gauges_from, scaled

from .connection import RedisConnection
from .layout import EPOCH, MICROSECOND, from_micros, micros

# The fields of an item ``gauges`` reads.
_GAUGED_FIELDS = ("created", "next", "attempts", "owner", "expires", "recipients")


class RedisGauges(RedisConnection):
    """Reads the queue's gauges in two round trips."""

    # -- reading for monitors: the metrics ----------------------------------------------

    gauge_sample_rows = 2000
    """A sample of items drawn one by one (``ZRANDMEMBER``) is as good as a far larger
    one of whole pages, and each sampled item is a hash to read."""

    def gauges(self, *, now: datetime) -> QueueGauges:
        """Two round trips. The first counts what the sorted sets order: every item, the
        leased ones, the expired leases (due again) and the first of them, exact at any
        size; it names the lanes and draws up to ``gauge_sample_rows`` items at random
        (all of them in a smaller queue). The second counts each lane's due items and
        reads its first due (its ready set), and reads the drawn items' fields, for
        their states, recipients and ages: beyond that many items, the split of the
        unleased items into queued and deferred, the recipients and the oldest times
        are estimates from the draw."""
        client = self._redis()
        at = micros(now)
        with self._translated_errors("read the queue's gauges"):
            pipe = client.pipeline(transaction=False)
            pipe.zcard(self.keys.items)
            pipe.zcount(self.keys.leases, f"({at}", "+inf")
            pipe.zcount(self.keys.leases, "-inf", at)  # expired: due again
            pipe.zrangebyscore(self.keys.leases, "-inf", at, start=0, num=1, withscores=True)
            pipe.smembers(self.keys.lanes)
            pipe.zrandmember(self.keys.items, self.gauge_sample_rows)
            total, leased, expired, first_expired, lanes, drawn = pipe.execute()
            pipe = client.pipeline(transaction=False)
            for lane in lanes:
                ready = self.keys.lane_ready(lane.decode())
                pipe.zcount(ready, "-inf", at)
                pipe.zrangebyscore(ready, "-inf", at, start=0, num=1, withscores=True)
            for member in drawn or ():
                pipe.hmget(self.keys.item(member[17:].decode()), _GAUGED_FIELDS)
            replies = pipe.execute() if lanes or drawn else []
        fronts, rows = replies[: 2 * len(lanes)], replies[2 * len(lanes) :]
        due_ready = sum(int(count) for count in fronts[::2])
        first_ready = [first for firsts in fronts[1::2] for first in firsts]
        tally = GaugeTally(now)
        for fields in rows:
            if fields[0] is not None:  # gone since it was drawn
                self._tally(tally, fields, now)
        if int(total) <= self.gauge_sample_rows:
            return tally.gauges()
        sample = tally.gauges()
        # The counts the sorted sets give stand; the draw splits the unleased items
        # into queued and deferred, and gives the recipients per item.
        unleased, unleased_drawn = (
            int(total) - int(leased),
            sample.items[ItemState.QUEUED] + sample.items[ItemState.DEFERRED] + sample.items[ItemState.HELD],
        )
        deferred = round(unleased * sample.items[ItemState.DEFERRED] / unleased_drawn) if unleased_drawn else 0
        held = round(unleased * sample.items[ItemState.HELD] / unleased_drawn) if unleased_drawn else 0
        drawn_items = unleased_drawn + sample.items[ItemState.DELIVERING]
        scale = int(total) / drawn_items if drawn_items else 0.0
        firsts = [int(score) for _, score in (*first_ready, *first_expired)]
        return QueueGauges(
            now=now,
            items={
                ItemState.QUEUED: unleased - deferred - held,
                ItemState.DEFERRED: deferred,
                ItemState.DELIVERING: int(leased),
                ItemState.HELD: held,
            },
            recipients={status: scaled(n, scale) for status, n in sample.recipients.items()},
            oldest=sample.oldest,
            due=int(due_ready) + int(expired),
            first_due_at=EPOCH + min(firsts) * MICROSECOND if firsts else None,
            exact=False,
        )

    @staticmethod
    def _tally(tally: GaugeTally, fields: Sequence[bytes | None], now: datetime) -> None:
        created, next_at, attempts, owner, expires, recipients = fields
        assert created is not None and next_at is not None and attempts is not None and recipients is not None
        leased = owner is not None and expires is not None and from_micros(expires) > now
        state = ItemState.DELIVERING if leased else ItemState.DEFERRED if int(attempts) > 0 else ItemState.QUEUED
        tally.count(
            state=state,
            created_at=from_micros(created),
            next_attempt_at=from_micros(next_at),
            statuses=(entry["status"] for entry in json.loads(recipients)),
        )

    def channel_gauges(self, *, now: datetime) -> dict[str, ChannelGauges]:
        """Two round trips: the count of items and a draw of up to ``gauge_sample_rows``
        of them (every one of a smaller queue, so exact), then the drawn items' channels,
        states and ages. Beyond that many items, each channel's counts are the draw's
        scaled to the count, and its oldest times the draw's."""
        client = self._redis()
        with self._translated_errors("read the queue's gauges by channel"):
            pipe = client.pipeline(transaction=False)
            pipe.zcard(self.keys.items)
            pipe.zrandmember(self.keys.items, self.gauge_sample_rows)
            total, drawn = pipe.execute()
            pipe = client.pipeline(transaction=False)
            for member in drawn or ():
                pipe.hmget(self.keys.item(member[17:].decode()), ("channel", *_GAUGED_FIELDS))
            rows = pipe.execute() if drawn else []
        tallies: dict[str, GaugeTally] = {}
        for channel, *fields in rows:
            if fields[0] is None:  # gone since it was drawn
                continue
            name = DEFAULT_CHANNEL if channel is None else channel.decode()
            tally = tallies.get(name)
            if tally is None:
                tally = tallies[name] = GaugeTally(now)
            self._tally(tally, fields, now)
        counted = sum(sum(tally.items.values()) for tally in tallies.values())
        scale = None if int(total) <= self.gauge_sample_rows else (int(total) / counted if counted else 0.0)
        return {channel: channel_gauges_from(tally, scale=scale) for channel, tally in tallies.items()}
