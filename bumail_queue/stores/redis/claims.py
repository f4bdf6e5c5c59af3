"""The Redis store's leases and the outcomes their holders record.

A claim, a renewal and a reschedule are one script each. An outcome is one script
that writes only over the state its owner read (the item's ``rev``); a batch of them
reads the items pipelined, then runs the scripts pipelined: two round trips.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime

from bumail_queue.errors import QueueError
from bumail_queue.items import AttemptResult, QueueItem
from bumail_queue.stores.base import COMPLETE_TRIES

from . import scripts
from .connection import RedisConnection
from .layout import hash_fields, item_from_fields, micros, own_id, pairs, recipients_json


class RedisClaims(RedisConnection):
    """Leases items to a worker, renews and gives them back, and records their outcomes."""

    # -- leases and outcomes ----------------------------------------------------------

    def claim(self, *, owner: str, now: datetime, lease_until: datetime, limit: int = 1) -> builtins.list[QueueItem]:
        self.validate_owner(owner)
        if limit < 1:
            return []
        keys = [self.keys.leases, self.keys.items, self.keys.turn]
        args: list[str | bytes | int] = [
            self.keys.prefix,
            owner,
            micros(now),
            micros(lease_until),
            limit,
        ]
        return [item_from_fields(pairs(fields)) for fields in self._run(scripts.CLAIM, "claim items", keys, args)]

    def claim_items(
        self, item_ids: Sequence[str], *, owner: str, now: datetime, lease_until: datetime
    ) -> builtins.list[QueueItem]:
        """One script for all of them."""
        self.validate_owner(owner)
        owns = list(dict.fromkeys(own for item_id in item_ids if (own := own_id(item_id)) is not None))
        if not owns:
            return []
        keys = [self.keys.leases, self.keys.items]
        args = [self.keys.prefix, owner, micros(now), micros(lease_until), *owns]
        claimed = self._run(scripts.CLAIM_ITEMS, "claim items", keys, args)
        return [item_from_fields(pairs(fields)) for fields in claimed]

    def renew(self, item_id: str, *, owner: str, lease_until: datetime) -> bool:
        self.validate_owner(owner)
        own = own_id(item_id)
        if own is None:
            return False
        keys = [self.keys.leases, self.keys.items]
        return bool(
            self._run(
                scripts.RENEW,
                "renew the lease",
                keys,
                [self.keys.prefix, own, owner, micros(lease_until)],
            )
            == 1
        )

    def complete(self, item_id: str, *, owner: str, result: AttemptResult) -> QueueItem | None:
        self.validate_owner(owner)
        self.validate_result(result)
        own = own_id(item_id)
        if own is None:
            return None
        client = self._redis()
        for _ in range(COMPLETE_TRIES):
            with self._translated_errors("read the item"):
                fields = hash_fields(client.hgetall(self.keys.item(own)))
            if not fields:
                return None
            item = item_from_fields(fields)
            if item.lease_owner != owner:
                break
            recorded = result.recorded_on(item)
            # Only the owner, and only over the state it read: an outcome recorded in
            # between (a renewal is none, it leaves rev alone) makes it read again.
            args = self._outcome_args(own, owner, fields[b"rev"], recorded)
            written = int(self._run(scripts.COMPLETE, "record the outcome", self._outcome_keys, args))
            if written == 1:
                return recorded
            if written == -2:
                return None
            if written == 0:
                break
        raise self.lease_lost(item_id, owner)

    def complete_many(
        self, results: Sequence[tuple[str, AttemptResult]], *, owner: str
    ) -> builtins.list[QueueItem | QueueError | None]:
        """Record a batch in two round trips: the reads pipelined, then the scripts.

        Each item is still its own script, as ``complete`` runs it; an item changed
        between the read and its script goes the single way, which reads again.
        """
        self.validate_owner(owner)
        for _, result in results:
            self.validate_result(result)
        if not results:
            return []
        client = self._redis()
        owns = [own_id(item_id) for item_id, _ in results]
        known = sorted({own for own in owns if own is not None})
        with self._translated_errors("read the items"):
            pipe = client.pipeline(transaction=False)
            for key in known:
                pipe.hgetall(self.keys.item(key))
            held = dict(zip(known, map(hash_fields, pipe.execute()), strict=True))
        done: list[QueueItem | QueueError | None] = []
        writes: list[tuple[int, list[str | bytes | int]]] = []
        for index, ((item_id, result), own) in enumerate(zip(results, owns, strict=True)):
            fields = held.get(own) if own is not None else None
            if not fields or own is None:
                done.append(None)
                continue
            item = item_from_fields(fields)
            if item.lease_owner != owner:
                done.append(self.lease_lost(item_id, owner))
                continue
            done.append(recorded := result.recorded_on(item))
            writes.append((index, self._outcome_args(own, owner, fields[b"rev"], recorded)))
        statuses = self._run_many(
            scripts.COMPLETE,
            "record the outcomes",
            self._outcome_keys,
            [args for _, args in writes],
        )
        contested: list[int] = []
        for (index, _), status in zip(writes, statuses, strict=True):
            if status == -2:
                done[index] = None
            elif status == 0:
                done[index] = self.lease_lost(results[index][0], owner)
            elif status == -1:
                contested.append(index)
        # Changed between the read and the script: each goes the single way, which reads again.
        again = super().complete_many([results[index] for index in contested], owner=owner)
        for index, outcome in zip(contested, again, strict=True):
            done[index] = outcome
        return done

    @property
    def _outcome_keys(self) -> builtins.list[str]:
        return [self.keys.items, self.keys.leases, self.keys.keys]

    def _outcome_args(self, item_id: str, owner: str, rev: bytes, item: QueueItem) -> builtins.list[str | bytes | int]:
        args: list[str | bytes | int] = [self.keys.prefix, item_id, owner, rev]
        if item.is_finished:
            return [*args, "drop"]
        return [
            *args,
            "record",
            recipients_json(item.recipients),
            micros(item.next_attempt_at),
            str(item.attempts),
            "1" if item.delay_notified else "0",
        ]

    def reschedule(self, item_id: str, *, at: datetime, owner: str | None = None) -> bool:
        if owner is not None:
            self.validate_owner(owner)
        own = own_id(item_id)
        if own is None:
            return False
        keys = [self.keys.items, self.keys.leases]
        args: list[str | bytes | int] = [
            self.keys.prefix,
            own,
            micros(at),
            owner or "",
            self.keys.wake,
        ]
        return bool(self._run(scripts.RESCHEDULE, "reschedule the item", keys, args) == 1)
