"""The Redis store's items and their messages: adding, reading, retrying, cancelling.

An add is one script for the whole batch; a read is one command or one pipeline, a
page of ``list`` and the lanes one read-only script each; a retry moves a page of the
waiting items a script, or the items it is given in one.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import cast

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import NewItem, QueueItem
from bumail_queue.queries import HELD_AT, RetryResult, lane_order
from bumail_queue.stores.base import MESSAGE_HEAD_BYTES

from . import scripts
from .connection import RedisConnection
from .layout import copy_item, hash_fields, item_from_fields, micros, own_id, pairs, recipients_json

# How many items a script of a retry reads: Redis runs nothing else meanwhile, so a
# long queue is retried a page at a time, each about a millisecond.
RETRY_PAGE = 1000


class RedisItems(RedisConnection):
    """Adds items, reads them and their messages, retries and cancels them."""

    # -- adding -----------------------------------------------------------------------

    def add_many(self, items: Sequence[NewItem], *, max_items: int | None = None) -> builtins.list[QueueItem]:
        if not items:
            return []
        args: list[str | bytes | int] = [
            self.keys.prefix,
            "" if max_items is None else str(max_items),
            self.keys.wake,
            micros(HELD_AT),
        ]
        for new in items:
            self.validate_new(new)
            if own_id(new.id) != new.id:
                raise QueueError(
                    ErrorCode.INVALID,
                    f"An item id must be a UUID in its usual form; got {new.id!r}.",
                )
            args += [
                new.id,
                "" if new.key is None else f"={new.key}",
                new.sender,
                recipients_json(new.pending_recipients),
                str(new.size),
                micros(new.created_at),
                micros(new.next_attempt_at),
                str(new.priority),
                new.channel,
                bytes(new.message),
            ]
        keys = [self.keys.items, self.keys.seq, self.keys.keys]
        status, payload = self._run(scripts.ADD, "queue the message", keys, args)
        if status == b"full":
            raise QueueError(
                ErrorCode.FULL,
                f"The queue is full: it holds {payload} items and MAX_ITEMS is {max_items}.",
            )
        added: list[QueueItem] = []
        for new, entry in zip(items, payload, strict=True):
            if entry == b"ok":
                added.append(new.to_queue_item())
            elif isinstance(entry, int):  # an earlier item of this call took the key
                added.append(copy_item(added[entry - 1]))
            else:  # the item holding the key
                added.append(item_from_fields(pairs(entry)))
        return added

    # -- reading ----------------------------------------------------------------------

    def get(self, item_id: str) -> QueueItem | None:
        own = own_id(item_id)
        if own is None:
            return None
        client = self._redis()
        with self._translated_errors("read the item"):
            fields = hash_fields(client.hgetall(self.keys.item(own)))
        return item_from_fields(fields) if fields else None

    def list(self, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        if limit <= 0:
            return []
        page = self._run(
            scripts.LIST,
            "list the queue",
            [self.keys.items],
            [self.keys.prefix, offset, offset + limit - 1],
        )
        return [item_from_fields(pairs(fields)) for fields in page]

    def count(self) -> int:
        client = self._redis()
        with self._translated_errors("count the queue"):
            return int(client.zcard(self.keys.items))

    def read_message(self, item_id: str) -> bytes | None:
        own = own_id(item_id)
        if own is None:
            return None
        client = self._redis()
        with self._translated_errors("read the message"):
            data = cast("bytes | None", client.get(self.keys.message(own)))
        return data

    def read_messages(self, item_ids: Iterable[str]) -> dict[str, bytes]:
        """Read a batch's messages in one round trip (``MGET``)."""
        known = [(item_id, own) for item_id in item_ids if (own := own_id(item_id))]
        if not known:
            return {}
        client = self._redis()
        with self._translated_errors("read the messages"):
            found = cast("list[bytes | None]", client.mget([self.keys.message(own) for _, own in known]))
        return {item_id: bytes(data) for (item_id, _), data in zip(known, found, strict=True) if data is not None}

    def read_message_heads(self, item_ids: Sequence[str], *, size: int = MESSAGE_HEAD_BYTES) -> dict[str, bytes]:
        """Read the first ``size`` bytes of each message, pipelined (``GETRANGE``)."""
        if size <= 0:
            return super().read_message_heads(item_ids, size=size)
        known = [(item_id, own) for item_id in item_ids if (own := own_id(item_id))]
        if not known:
            return {}
        client = self._redis()
        with self._translated_errors("read the messages"):
            pipe = client.pipeline(transaction=False)
            for _, own in known:
                pipe.getrange(self.keys.message(own), 0, size - 1)
            heads = pipe.execute()
        # A missing key reads as no bytes; a message is never empty (it has headers).
        return {item_id: bytes(head) for (item_id, _), head in zip(known, heads, strict=True) if head}

    def lanes(self) -> builtins.list[tuple[str, int]]:
        """One read-only script: the lanes with a ready item, and those of the leased items."""
        held = self._run(scripts.LANES_HELD, "read the lanes", [self.keys.leases], [self.keys.prefix])
        lanes = set()
        for lane in held:
            priority, _, channel = lane.decode().partition(":")
            lanes.add((channel, int(priority)))
        return sorted(lanes, key=lambda lane: lane_order(*lane))

    # -- retrying for operators: queue_retry ------------------------------------------

    def retry_deferred(self, *, now: datetime, domain: str | None = None) -> int:
        """The items not due yet a page at a time, each page one script that moves those
        that match, so that Redis serves the workers between pages. The items at a
        non-ASCII domain the script cannot compare are read once the pages are done,
        in one round trip, compared here and moved by id."""
        spellings = () if domain is None else self.domain_spellings(domain)
        moved, unsure = 0, set[str]()
        # The first page starts after now ("(" excludes it); each next one where the last ended.
        after: str | bytes = f"({micros(now)}"
        skip = 0
        while True:
            args = [
                self.keys.prefix,
                micros(now),
                self.keys.wake,
                "waiting",
                after,
                skip,
                RETRY_PAGE,
                micros(HELD_AT),
                *spellings,
            ]
            done, after, skip, page_moved, page_unsure = self._run(
                scripts.RETRY, "retry the deferred items", self._retry_keys, args
            )
            moved += int(page_moved)
            unsure.update(item_id.decode() for item_id in page_unsure)
            if done:
                break
        if domain is not None and unsure:
            others = [item.id for item in self._read_items(sorted(unsure)) if self.has_deferred_recipient(item, domain)]
            moved += self.retry_items(others, now=now).due
        return moved

    def retry_items(self, item_ids: Sequence[str], *, now: datetime) -> RetryResult:
        """One script for all of them: a status per id."""
        owns = {item_id: own for item_id in dict.fromkeys(item_ids) if (own := own_id(item_id)) is not None}
        unique = list(dict.fromkeys(owns.values()))  # one per item, however its id is spelled
        args = [self.keys.prefix, micros(now), self.keys.wake, "ids", *unique]
        replies = self._run(scripts.RETRY, "retry the items", self._retry_keys, args) if unique else []
        status = dict(zip(unique, map(int, replies), strict=True))
        return RetryResult(
            due=sum(1 for value in status.values() if value == 1),
            leased=tuple(item_id for item_id, own in owns.items() if status[own] == 0),
            missing=tuple(
                item_id for item_id in dict.fromkeys(item_ids) if item_id not in owns or status[owns[item_id]] == -1
            ),
        )

    @property
    def _retry_keys(self) -> builtins.list[str]:
        return [self.keys.items]

    def _read_items(self, item_ids: Sequence[str]) -> builtins.list[QueueItem]:
        """The items of ``item_ids`` still in the queue, read in one round trip."""
        client = self._redis()
        with self._translated_errors("read the items"):
            pipe = client.pipeline(transaction=False)
            for item_id in item_ids:
                pipe.hgetall(self.keys.item(item_id))
            found = [hash_fields(fields) for fields in pipe.execute()]
        return [item_from_fields(fields) for fields in found if fields]

    # -- cancelling for operators -----------------------------------------------------

    def cancel(self, item_id: str) -> QueueItem | None:
        own = own_id(item_id)
        if own is None:
            return None
        keys = [self.keys.items, self.keys.leases, self.keys.keys]
        fields = self._run(scripts.CANCEL, "cancel the item", keys, [self.keys.prefix, own])
        return None if fields is None else item_from_fields(pairs(fields))
