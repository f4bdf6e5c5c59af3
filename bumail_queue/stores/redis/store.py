"""The Redis store: the queue in Redis, through django-redis, for workers on many machines.

Every key starts with ``REDIS_KEY_PREFIX`` (see ``docs/redis.md`` for the layout):
an item is a hash, its message a string written and read byte for byte, and the
sorted sets ``items`` (all), ``ready`` (no lease holds them) and ``leases`` order
them. Every operation that writes is one Lua script (``scripts.py``), which Redis
runs whole: two workers never take the same item, and an add is all or nothing.
Reads are plain commands, one round trip each (a page of ``list`` is one read-only
script); a batch of outcomes is pipelined.

Times travel as whole microseconds since the epoch, the precision of ``datetime``,
so each comes back exactly as it was given; the scripts only compare them. A sorted
set's score is a double, exact for such numbers until the year 2255.

The class holds every operation of the interface, each a thin call of its script;
the key layout and value codec are ``layout``'s, the wake-up ``listener``'s.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, datetime
from typing import Any, cast

from django.conf import settings as django_settings
from django.core import checks
from django.core.cache.backends.base import InvalidCacheBackendError
from django.utils.module_loading import import_string
from django_redis import get_redis_connection
from django_redis.cache import RedisCache
from redis import ConnectionPool, Redis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterCrossSlotError,
    ClusterDownError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bumail_queue.addresses import normal_address
from bumail_queue.conf import QueueSettings
from bumail_queue.errors import (
    ErrorCode,
    QueueConfigurationError,
    QueueError,
    first_line,
)
from bumail_queue.items import AttemptResult, NewItem, QueueItem
from bumail_queue.queries import GaugeTally, ItemState, QueueGauges, RetryResult, lane_order, scaled
from bumail_queue.shaping import (
    SLOW_START_RESET_SECONDS,
    Bucket,
    DestinationState,
    Permit,
    PermitRequest,
    WindowChange,
    moment,
    seconds,
)
from bumail_queue.stores.base import COMPLETE_TRIES, MESSAGE_HEAD_BYTES, QueueStore, WorkListener
from bumail_queue.sts import STSPolicy, TLSSessionCount
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionUpdate, search_form
from bumail_queue.text import is_keepable

from . import scripts, sts
from .layout import (
    EPOCH,
    MICROSECOND,
    RedisKeys,
    copy_item,
    from_micros,
    hash_fields,
    item_from_fields,
    micros,
    own_id,
    pairs,
    recipients_json,
    suppression_from_json,
    suppression_json,
)
from .listener import RedisListener

#: The ``maxmemory-policy`` values under which a full Redis may delete the queue's keys.
#: The ``volatile-*`` policies are not among them: they evict only keys with a time to
#: live, and the store never gives its keys one.
EVICTING_POLICIES = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random"})

# How many items a script of a retry reads: Redis runs nothing else meanwhile, so a
# long queue is retried a page at a time, each about a millisecond.
RETRY_PAGE = 1000

# The fields of an item ``gauges`` reads.
_GAUGED_FIELDS = ("created", "next", "attempts", "owner", "expires", "recipients")

# How long a shaping bucket outlives the last thing it holds (a slot's lease, a
# suspension, held items): an hour, by then its tokens are full and its window reset.
BUCKET_KEPT_SECONDS = 3600

# The system check connects while manage.py waits: it must not hang on a Redis that
# drops packets, whatever timeouts CACHES gives the store's own connections.
_CHECK_TIMEOUT_SECONDS = 3.0


class RedisStore(QueueStore):
    """Keeps the queue in the Redis of the django-redis alias ``REDIS_CONNECTION``.

    Nothing connects when the store is built: the first call does, and checks that
    the prefix holds this store's layout (``<prefix>schema``) and that Redis will not
    evict the queue's keys (``maxmemory-policy``).
    """

    supports_transactional_enqueue = False
    claims_by_id = True
    supports_shaping = True

    def __init__(self, settings: QueueSettings) -> None:
        super().__init__(settings)
        self.alias: str = settings.redis_connection
        self.keys = RedisKeys(settings.redis_key_prefix)
        self._client: Redis | None = None
        self._schema_checked = False
        self._schema_lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------

    def _redis(self) -> Redis:
        """Return the client, checking the eviction policy and the prefix's layout at the first call."""
        client = self._client
        if client is None:
            try:
                client = get_redis_connection(self.alias, write=True)
            except (InvalidCacheBackendError, NotImplementedError) as error:
                raise QueueConfigurationError(
                    f"BUMAIL_QUEUE['REDIS_CONNECTION'] is {self.alias!r}, which is not a django-redis cache of CACHES "
                    "with one Redis (or a primary and its replicas)."
                ) from error
            self._client = client
        if not self._schema_checked:
            with self._schema_lock, self._translated_errors("check the queue's layout"):
                if not self._schema_checked:
                    # The policy first: on a Redis that may evict, not even the layout is written.
                    self._refuse_eviction(read_eviction_policy(client))
                    found = scripts.SCHEMA(client, [self.keys.schema], [str(scripts.LAYOUT_VERSION), self.keys.prefix])
                    self._check_schema(found)
                    self._schema_checked = True
        return client

    def _refuse_eviction(self, policy: str | None) -> None:
        # Under an allkeys-* policy a full Redis deletes items and messages to make
        # room, and mail vanishes with no DSN, log entry or signal: refuse to work.
        # A policy that cannot be read (no CONFIG, no INFO) is left to the check.
        if policy is not None and policy in EVICTING_POLICIES:
            raise QueueConfigurationError(self._eviction_problem(policy))

    def _eviction_problem(self, policy: str) -> str:
        return (
            f"Redis of CACHES[{self.alias!r}] has maxmemory-policy {policy!r}: when full, it "
            "deletes queued mail to make room. Set maxmemory-policy noeviction on that Redis "
            "(or give the queue a Redis of its own)."
        )

    def _check_schema(self, found: bytes) -> None:
        text = found.decode("utf-8", "replace")
        if text == str(scripts.LAYOUT_VERSION):
            return
        if text.isdigit() and int(text) > scripts.LAYOUT_VERSION:
            problem = f"holds layout {text}, written by a newer version of bumail_queue than this one"
        else:
            problem = "holds something other than a layout version: the prefix is another application's"
        raise QueueConfigurationError(
            f"The Redis queue cannot be set up: {self.keys.schema!r} {problem}. "
            "Give BUMAIL_QUEUE['REDIS_KEY_PREFIX'] a prefix of the queue's own."
        )

    @contextmanager
    def _translated_errors(self, doing: str) -> Iterator[None]:
        """Raise Redis's errors as ``QueueError(STORE_UNAVAILABLE)``, saying what to do.

        Out of memory is ``STORE_FULL``: a refusal the caller can tell from an outage.
        """
        try:
            yield
        except AuthenticationError as error:
            raise self._unavailable(doing, "Redis refused the credentials of CACHES", error) from error
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise self._unavailable(doing, "Redis could not be reached through CACHES", error) from error
        except ResponseError as error:
            if _out_of_memory(error):
                raise QueueError(
                    ErrorCode.STORE_FULL,
                    f"Could not {doing}: Redis of CACHES[{self.alias!r}] is at its maxmemory and refused "
                    "the write; nothing was written. Deliver or cancel queued mail, or raise maxmemory.",
                ) from error
            raise self._unavailable(doing, _refusal(error), error) from error
        except RedisError as error:
            raise self._unavailable(doing, "Redis failed through CACHES", error) from error

    def _unavailable(self, doing: str, what: str, error: Exception) -> QueueError:
        where = f"{what}[{self.alias!r}]" if what.endswith("CACHES") else what
        return QueueError(
            ErrorCode.STORE_UNAVAILABLE,
            f"Could not {doing}: {where}: {first_line(error)}",
        )

    def _run(
        self,
        script: scripts.Script,
        doing: str,
        keys: Sequence[str],
        args: Sequence[str | bytes | int],
    ) -> Any:
        client = self._redis()
        with self._translated_errors(doing):
            return script(client, keys, args)

    def _run_many(
        self,
        script: scripts.Script,
        doing: str,
        keys: Sequence[str],
        arg_lists: Sequence[Sequence[str | bytes | int]],
    ) -> builtins.list[Any]:
        """Run a script once per argument list, pipelined: one round trip for all."""
        if not arg_lists:
            return []
        client = self._redis()
        with self._translated_errors(doing):
            pipe = client.pipeline(transaction=False)
            for args in arg_lists:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            replies = pipe.execute(raise_on_error=False)
            for index, reply in enumerate(replies):
                if isinstance(reply, NoScriptError):  # Redis lost it: by its text, once
                    replies[index] = script(client, keys, arg_lists[index])
                elif isinstance(reply, Exception):
                    raise reply
        return list(replies)

    # -- adding -----------------------------------------------------------------------

    def add_many(self, items: Sequence[NewItem], *, max_items: int | None = None) -> builtins.list[QueueItem]:
        if not items:
            return []
        args: list[str | bytes | int] = [
            self.keys.prefix,
            "" if max_items is None else str(max_items),
            self.keys.wake,
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
            args = [self.keys.prefix, micros(now), self.keys.wake, "waiting", after, skip, RETRY_PAGE, *spellings]
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
            sample.items[ItemState.QUEUED] + sample.items[ItemState.DEFERRED],
        )
        deferred = round(unleased * sample.items[ItemState.DEFERRED] / unleased_drawn) if unleased_drawn else 0
        drawn_items = unleased_drawn + sample.items[ItemState.DELIVERING]
        scale = int(total) / drawn_items if drawn_items else 0.0
        firsts = [int(score) for _, score in (*first_ready, *first_expired)]
        return QueueGauges(
            now=now,
            items={
                ItemState.QUEUED: unleased - deferred,
                ItemState.DEFERRED: deferred,
                ItemState.DELIVERING: int(leased),
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

    def cancel(self, item_id: str) -> QueueItem | None:
        own = own_id(item_id)
        if own is None:
            return None
        keys = [self.keys.items, self.keys.leases, self.keys.keys]
        fields = self._run(scripts.CANCEL, "cancel the item", keys, [self.keys.prefix, own])
        return None if fields is None else item_from_fields(pairs(fields))

    # -- MTA-STS policies and TLS report counts: sts.py --------------------------------

    def get_sts_policy(self, domain: str) -> STSPolicy | None:
        client = self._redis()
        with self._translated_errors("read the MTA-STS policy"):
            raw = client.hget(self.keys.sts_policies, domain)
        return None if raw is None else sts.policy_from_json(domain, cast("bytes", raw))

    def put_sts_policy(self, policy: STSPolicy) -> None:
        self.validate_sts_policy(policy)
        client = self._redis()
        with self._translated_errors("keep the MTA-STS policy"):
            client.hset(self.keys.sts_policies, policy.domain, sts.policy_json(policy))

    def count_tls_sessions(self, counts: Sequence[TLSSessionCount]) -> None:
        self.validate_tls_counts(counts)
        if not counts:
            return
        client = self._redis()
        with self._translated_errors("count the TLS sessions"):
            sts.add_counts(client, self.keys, counts)

    def tls_session_counts(self, day: date) -> builtins.list[TLSSessionCount]:
        client = self._redis()
        with self._translated_errors("read the TLS report counts"):
            return sts.read_counts(client, self.keys, day)

    def purge_tls_session_counts(self, *, before: date) -> int:
        client = self._redis()
        with self._translated_errors("purge the TLS report counts"):
            return sts.purge_counts(client, self.keys, before)

    # -- the suppression list ---------------------------------------------------------

    def suppressions_of(self, addresses: Iterable[str], *, now: datetime) -> dict[str, Suppression]:
        """One ``HMGET`` for the whole batch; entries past their time are left out here."""
        given: dict[str, list[str]] = {}
        for address in addresses:
            if is_keepable(address):
                given.setdefault(normal_address(address), []).append(address)
        if not given:
            return {}
        client = self._redis()
        with self._translated_errors("read the suppression list"):
            raws = cast("list[bytes | None]", client.hmget(self.keys.suppressed, list(given)))
        found: dict[str, Suppression] = {}
        for key, raw in zip(given, raws, strict=True):
            if raw is not None and (entry := suppression_from_json(key, raw)).is_in_force(now):
                found.update((address, entry) for address in given[key])
        return found

    def update_suppressions(self, change: SuppressionChange, *, now: datetime) -> SuppressionUpdate:
        self.validate_suppressions(change)
        if not change:
            return SuppressionUpdate()
        args: list[str | bytes | int] = [
            micros(now),
            "" if change.note_until is None else micros(change.note_until),
        ]
        for entries in (change.add, change.expired):
            args.append(len(entries))
            for entry in entries:
                args += [entry.address, suppression_json(entry), micros(entry.created_at), micros(entry.expires_at)]
        args += change.clear
        promoted, removed = self._run(scripts.SUPPRESS, "update the suppression list", self.keys.suppression_keys, args)
        by_address = {entry.address: entry for entry in change.expired}
        return SuppressionUpdate(
            suppressed=(*change.add, *(by_address[address.decode()] for address in promoted)),
            removed=tuple(address.decode() for address in removed),
        )

    def search_suppressions(
        self, *, now: datetime, text: str | None = None, offset: int = 0, limit: int = 100
    ) -> builtins.list[Suppression]:
        """One read-only script that walks the list from its newest entry (see ``suppression_page.lua``)."""
        if limit <= 0:
            return []
        args: list[str | bytes | int] = [micros(now), "" if text is None else search_form(text), offset, limit]
        keys = [self.keys.suppressed, self.keys.suppressed_created]
        flat = self._run(scripts.SUPPRESSION_PAGE, "search the suppression list", keys, args)
        return [suppression_from_json(address.decode(), raw) for address, raw in pairs(flat).items()]

    def count_suppressions(self, *, now: datetime) -> int:
        client = self._redis()
        with self._translated_errors("count the suppression list"):
            return int(client.zcount(self.keys.suppressed_expires, f"({micros(now)}", "+inf"))

    def purge_suppressions(self, *, now: datetime) -> int:
        """A thousand at a time, one script each, so that Redis serves the workers between them."""
        dropped = 0
        while True:
            entries, notes = self._run(
                scripts.SUPPRESSION_PURGE,
                "purge the suppression list",
                self.keys.suppression_keys,
                [micros(now), RETRY_PAGE],
            )
            dropped += int(entries)
            if entries < RETRY_PAGE and notes < RETRY_PAGE:
                return dropped

    # -- shaping: a hash and a sorted set of slots per destination, one script a step ---

    def take_permit(self, request: PermitRequest) -> Permit:
        limits, rate = request.limits, request.limits.rate
        slot = request.slot if request.slot is not None and request.slot_until is not None else None
        args: list[str | bytes | int] = [
            self.keys.prefix,
            request.key,
            _number(seconds(request.now)),
            "" if rate is None else _number(rate.per_second),
            "" if rate is None else _number(rate.capacity),
            "" if limits.concurrency is None else str(limits.concurrency),
            "" if limits.slow_start is None else str(limits.slow_start),
            _number(SLOW_START_RESET_SECONDS),
            slot or "",
            "" if slot is None or request.slot_until is None else _number(seconds(request.slot_until)),
            str(request.held),
            _number(seconds(request.held_until or request.now)),
            str(BUCKET_KEPT_SECONDS),
        ]
        granted, reason, retry, sessions, limit = self._run(
            scripts.SHAPING_TAKE, "ask for room at a destination", [self.keys.shaping], args
        )
        return Permit(
            granted=granted == 1,
            reason=reason.decode() or None,
            retry_at=moment(float(retry)) if retry else None,
            sessions=int(sessions),
            limit=int(limit) if limit != b"" else None,
        )

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
        args: list[str | bytes | int] = [
            self.keys.prefix,
            key,
            slot or "",
            _number(seconds(now)),
            change.value,
            "" if concurrency is None else str(concurrency),
            "" if suspend_until is None else _number(seconds(suspend_until)),
            str(BUCKET_KEPT_SECONDS),
        ]
        self._run(scripts.SHAPING_RELEASE, "end a session at a destination", [self.keys.shaping], args)

    def renew_permit(self, key: str, *, slot: str, now: datetime, until: datetime) -> bool:
        args: list[str | bytes | int] = [
            self.keys.prefix,
            key,
            slot,
            _number(seconds(now)),
            _number(seconds(until)),
            str(BUCKET_KEPT_SECONDS),
        ]
        return bool(self._run(scripts.SHAPING_RENEW, "renew a session's slot", [self.keys.shaping], args) == 1)

    def destination_states(self, *, now: datetime) -> builtins.list[DestinationState]:
        """The index's destinations, then each bucket and its live slots, pipelined."""
        client = self._redis()
        at = seconds(now)
        with self._translated_errors("read the shaping buckets"):
            found = cast("list[bytes]", client.zrangebyscore(self.keys.shaping, at, "+inf"))
            keys = sorted(key.decode() for key in found)
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(self.keys.bucket(key))
                pipe.zrangebyscore(f"{self.keys.bucket(key)}:slots", f"({at}", "+inf", withscores=True)
            replies = pipe.execute()
        states = []
        for key, fields, slots in zip(keys, replies[::2], replies[1::2], strict=True):
            if fields:
                states.append(_bucket_from(hash_fields(fields), slots).state(key, now))
        return states

    def forget_idle_destinations(self, *, before: datetime, now: datetime) -> int:
        args: list[str | bytes | int] = [self.keys.prefix, _number(seconds(before)), _number(seconds(now))]
        return int(self._run(scripts.SHAPING_FORGET, "forget idle destinations", [self.keys.shaping], args))

    def listener(self) -> WorkListener | None:
        """A Pub/Sub subscription on its own connection: idle workers wake on enqueue."""
        client = self._redis()
        with self._translated_errors("listen for new work"):
            return RedisListener(client, self.keys.wake, self._translated_errors)

    # -- checks -----------------------------------------------------------------------

    def check(self, **kwargs: Any) -> builtins.list[checks.CheckMessage]:
        """E018 from the settings alone; then, connecting, E022 or W003 on the eviction policy."""
        problem = _connection_problem(self.alias)
        if problem is None:
            return self._check_eviction_policy()
        return [
            checks.Error(
                f"BUMAIL_QUEUE['REDIS_CONNECTION'] is {self.alias!r}: {problem}",
                hint="Name a CACHES entry whose BACKEND is 'django_redis.cache.RedisCache', on one Redis "
                "(or a primary and its replicas), with bytes left undecoded.",
                obj="BUMAIL_QUEUE",
                id="bumail_queue.E018",
            )
        ]

    def _check_eviction_policy(self) -> builtins.list[checks.CheckMessage]:
        try:
            with _client_for_checks(self.alias) as client, self._translated_errors("read maxmemory-policy"):
                policy = read_eviction_policy(client)
        except QueueError as error:
            # Unreachable is no error of the set-up: a deploy may run checks where Redis
            # is out of reach. The worker reads the policy again when it starts.
            return [self._unchecked_policy(error.message)]
        if policy is None:
            return [
                self._unchecked_policy(
                    f"Could not read maxmemory-policy: Redis of CACHES[{self.alias!r}] refused both "
                    "CONFIG GET and INFO to this user."
                )
            ]
        if policy not in EVICTING_POLICIES:
            return []
        return [
            checks.Error(
                self._eviction_problem(policy),
                hint="redis-cli CONFIG SET maxmemory-policy noeviction, and the same line in redis.conf. "
                "A full Redis then refuses new mail (STORE_FULL) instead of losing queued mail.",
                obj="BUMAIL_QUEUE",
                id="bumail_queue.E022",
            )
        ]

    def _unchecked_policy(self, why: str) -> checks.CheckMessage:
        return checks.Warning(
            why,
            hint="The Redis store refuses a Redis that may evict its keys (E022); "
            "allow INFO to the queue's ACL user, and run the check where Redis can be reached.",
            obj="BUMAIL_QUEUE",
            id="bumail_queue.W003",
        )


def _number(value: float) -> str:
    """A number as the shaping scripts read it: seconds to the microsecond, rates exactly."""
    return repr(float(value))


def _bucket_from(fields: Mapping[bytes, bytes], slots: Sequence[tuple[bytes, float]]) -> Bucket:
    def number(name: bytes) -> float | None:
        raw = fields.get(name)
        return None if raw is None else float(raw)

    return Bucket(
        tokens=number(b"tokens"),
        tokens_at=number(b"tokens_at") or 0.0,
        window=number(b"window"),
        slots={slot.decode(): float(until) for slot, until in slots},
        suspended_until=number(b"suspended_until") or 0.0,
        active_at=number(b"active_at") or 0.0,
        held=int(number(b"held") or 0),
        held_until=number(b"held_until") or 0.0,
    )


# -- errors and checks ----------------------------------------------------------------


def _reply_text(error: ResponseError) -> str:
    return f"{getattr(error, 'status_code', None) or ''} {error}".strip()


def _out_of_memory(error: ResponseError) -> bool:
    """Whether Redis refused a command for want of memory (``-OOM``, under ``noeviction``)."""
    return isinstance(error, OutOfMemoryError) or _reply_text(error).startswith("OOM")


def _refusal(error: ResponseError) -> str:
    """Say what a Redis error reply means for the queue."""
    reply = _reply_text(error)
    if isinstance(error, ReadOnlyError) or reply.startswith("READONLY"):
        return "Redis is a replica, which refuses writes; point REDIS_CONNECTION at the primary"
    if isinstance(error, NoPermissionError) or reply.startswith("NOPERM"):
        return "Redis refused the command to this user; see the ACL the Redis store needs"
    if isinstance(error, AskError | TryAgainError | ClusterCrossSlotError | ClusterDownError):
        return "Redis Cluster is not supported: the queue's keys must live on one Redis"
    if "near '#'" in reply:
        return "the Redis store needs Redis 7.0 or newer (script flags)"
    return "Redis refused the command"


def read_eviction_policy(client: Redis) -> str | None:
    """Return Redis's ``maxmemory-policy``, or ``None`` when this user may read it nowhere.

    ``CONFIG GET`` first; managed services that rename or forbid ``CONFIG`` still
    answer ``INFO memory``. Errors other than a refusal (a lost connection) are raised.
    """
    try:
        found: Mapping[Any, Any] = client.config_get("maxmemory-policy")
        policy = found.get("maxmemory-policy", found.get(b"maxmemory-policy"))
    except ResponseError:  # NOPERM, or an unknown (renamed) command
        try:
            policy = client.info("memory").get("maxmemory_policy")
        except ResponseError:
            return None
    if isinstance(policy, bytes):
        policy = policy.decode("ascii", "replace")
    return None if policy is None else str(policy)


@contextmanager
def _client_for_checks(alias: str) -> Iterator[Redis]:
    """Yield a client of ``alias`` whose connections give up after a few seconds."""
    client = get_redis_connection(alias, write=True)
    pool = client.connection_pool
    if type(pool) is not ConnectionPool:  # Sentinel and the like: as configured
        yield client
        return
    kwargs = {**pool.connection_kwargs}
    kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = _CHECK_TIMEOUT_SECONDS
    quick = ConnectionPool(connection_class=pool.connection_class, **kwargs)
    try:
        yield Redis(connection_pool=quick)
    finally:
        quick.disconnect()


def _connection_problem(alias: str) -> str | None:
    """Say why the ``CACHES`` entry ``alias`` cannot serve the store, or ``None``."""
    caches = getattr(django_settings, "CACHES", {})
    if alias not in caches:
        return f"CACHES has no such alias (it has {', '.join(map(repr, caches)) or 'none'})."
    config = caches[alias]
    try:
        backend = import_string(config.get("BACKEND", ""))
    except ImportError:
        backend = None
    if not (isinstance(backend, type) and issubclass(backend, RedisCache)):
        return f"its BACKEND is {config.get('BACKEND')!r}, not django-redis's RedisCache."
    options = config.get("OPTIONS", {})
    client_class = options.get("CLIENT_CLASS", "")
    if client_class.rpartition(".")[2] == "ShardClient":
        return "it shards keys over several servers; the queue's keys must live on one Redis."
    if options.get("CONNECTION_POOL_KWARGS", {}).get("decode_responses"):
        return "its connections decode replies (decode_responses), so messages would not come back byte for byte."
    return None
