"""The queue service: ``from bumail_queue import queue``."""

from __future__ import annotations

import builtins
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.core.mail import EmailMessage
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from . import mime, signals
from .archive import HeadFields, head_fields
from .conf import QueueSettings, get_settings
from .errors import ErrorCode, QueueError, first_line
from .items import DEFAULT_CHANNEL, DEFAULT_PRIORITY, NewItem, QueueItem, check_channel, check_priority
from .operations.archive import ArchiveService
from .operations.bulk import BulkService
from .operations.personal_data import PersonalDataService
from .queries import AGE_BUCKETS, HELD_AT, ItemQuery, ItemState, QueueSummary, RetryResult, header_block
from .screening import screen
from .shaping import DestinationState, Patterns
from .stores import QueueStore, get_store
from .suppression_service import MAX_NOTE, SuppressionService, recipient_domain
from .text import require_keepable

__all__ = ["MAX_NOTE", "QueueService", "queue"]

if TYPE_CHECKING:
    from .delivery.envelope import Resolver, Transport
    from .worker import Stats

Clock = Callable[[], datetime]

logger = logging.getLogger(__name__)


class QueueService(SuppressionService, BulkService, PersonalDataService, ArchiveService):
    """Enqueue mail and manage the queue, whatever store keeps it.

    The store and settings are looked up at each call (both follow
    ``override_settings``); pass them in to pin a service to one store.
    """

    def __init__(
        self,
        *,
        store: QueueStore | None = None,
        settings: QueueSettings | None = None,
        clock: Clock = timezone.now,
    ) -> None:
        self._store = store
        self._settings = settings
        self.clock = clock

    @property
    def store(self) -> QueueStore:
        return self._store if self._store is not None else get_store()

    @property
    def settings(self) -> QueueSettings:
        return self._settings if self._settings is not None else get_settings()

    # -- enqueue ----------------------------------------------------------------------

    def prepare(
        self,
        message: EmailMessage | bytes,
        *,
        sender: str | None = None,
        recipients: Sequence[str] | None = None,
        at: datetime | None = None,
        key: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        channel: str = DEFAULT_CHANNEL,
        now: datetime | None = None,
        settings: QueueSettings | None = None,
    ) -> NewItem:
        """Check a message and build the item to add; nothing is written."""
        settings = settings or self.settings
        now = now or self.clock()
        _check_at(at)
        _check_key(key)
        check_priority(priority)
        check_channel(channel)
        limits = {"max_size": settings.max_message_size, "max_recipients": settings.max_recipients}
        if isinstance(message, EmailMessage):
            prepared = mime.from_email_message(
                message, sender=sender, recipients=recipients, hostname=settings.hostname, now=now, **limits
            )
        else:
            prepared = mime.from_bytes(
                message, sender=sender, recipients=recipients, hostname=settings.hostname, now=now, **limits
            )
        return prepared.new_item(
            now=now,
            next_attempt_at=max(at, now) if at is not None else now,
            key=key,
            priority=priority,
            channel=channel,
        )

    def enqueue(
        self,
        message: EmailMessage | bytes,
        *,
        sender: str | None = None,
        recipients: Sequence[str] | None = None,
        at: datetime | None = None,
        key: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        channel: str = DEFAULT_CHANNEL,
    ) -> QueueItem:
        """Queue one message; return its item (the existing one for a known ``key``).

        ``priority`` (-100 to 100, higher first) orders the due items of a channel;
        the channels with due mail take turns (``channel``, a name of your choice).
        """
        settings = self.settings
        item = self.prepare(
            message,
            sender=sender,
            recipients=recipients,
            at=at,
            key=key,
            priority=priority,
            channel=channel,
            settings=settings,
        )
        store, max_items, screened = self.store, settings.max_items, screen([item], settings.firewall)
        if _on_commit(store):
            transaction.on_commit(lambda: self._send_tasks_for(screened.add_to(store, max_items), store))
            return screened.before_adding()[0]
        added = screened.add_to(store, max_items)
        self._send_tasks_for(added, store)
        return screened.given(added)[0]

    def enqueue_many(
        self,
        messages: Sequence[EmailMessage | bytes],
        *,
        sender: str | None = None,
        recipients: Sequence[str] | None = None,
        at: datetime | None = None,
        keys: Sequence[str | None] | None = None,
        priority: int = DEFAULT_PRIORITY,
        channel: str = DEFAULT_CHANNEL,
    ) -> builtins.list[QueueItem]:
        """Queue several messages in one step, all of them or none; return their items.

        The arguments are ``enqueue``'s, each given to every message, but for the
        idempotency keys: ``keys``, one per message (``None`` for a message without).
        Every message is checked before any is written; the store writes the batch in
        one statement (PostgreSQL) or one script (Redis).
        """
        if isinstance(messages, EmailMessage | bytes):
            raise QueueError(ErrorCode.INVALID, "'messages' must be a list of messages, not one message.")
        messages = builtins.list(messages)
        if keys is not None and (isinstance(keys, str) or len(keys) != len(messages)):
            raise QueueError(ErrorCode.INVALID, "'keys' must be a list with one key (or None) per message.")
        settings, now = self.settings, self.clock()
        items = [
            self.prepare(
                message,
                sender=sender,
                recipients=recipients,
                at=at,
                key=None if keys is None else keys[index],
                priority=priority,
                channel=channel,
                now=now,
                settings=settings,
            )
            for index, message in enumerate(messages)
        ]
        store, max_items, screened = self.store, settings.max_items, screen(items, settings.firewall)
        if _on_commit(store) and items:
            transaction.on_commit(lambda: self._send_tasks_for(screened.add_to(store, max_items), store))
            return screened.before_adding()
        added = screened.add_to(store, max_items)
        self._send_tasks_for(added, store)
        return screened.given(added)

    # -- the delivery tasks (TASKS) ----------------------------------------------------

    def _send_tasks_for(self, items: Sequence[QueueItem], store: QueueStore) -> None:
        """Send the delivery tasks of items just added: those due now at once, the
        others for their first attempt (a framework that cannot defer a task leaves
        them to its periodic pass)."""
        if self.settings.tasks is None or not items:
            return
        now = self.clock()
        due = [item.id for item in items if item.next_attempt_at <= now]
        if due:
            self._send_tasks(store, due)
        later: dict[datetime, builtins.list[str]] = {}
        for item in items:
            if now < item.next_attempt_at < HELD_AT:  # a held item waits for its release
                later.setdefault(item.next_attempt_at, []).append(item.id)
        for at, ids in later.items():
            self._send_tasks(store, ids, at=at)

    def _send_tasks(self, store: QueueStore, ids: Sequence[str] | None, *, at: datetime | None = None) -> None:
        """With ``TASKS`` on, send delivery tasks for ``ids`` (``None``: one for a pass over
        everything due) once the store's writes are visible: on commit of the queue's
        database for a store inside it, else now. Ids only reach the broker, at most
        ``CLAIM_BATCH_SIZE`` a task. A broker that refuses is logged: the mail stays
        queued for the next pass."""
        tasks = self.settings.tasks
        if tasks is None:
            return
        batch = self.settings.claim_batch_size
        chunks = (
            [None]
            if ids is None
            else [builtins.list(ids[start : start + batch]) for start in range(0, len(ids), batch)]
        )

        def send_all() -> None:
            for chunk in chunks:
                try:
                    # Imported here: the module makes its task as it is first imported, and a
                    # backend that refuses the task's queue then is a refusal like any other.
                    send = import_string(f"{tasks.module}.send")
                    send(chunk, settings=tasks, at=at)
                except Exception as error:
                    what = "a delivery pass" if chunk is None else f"{len(chunk)} items"
                    logger.error(
                        "could not send the delivery task of %s to %s: %s; the mail stays queued for the next pass",
                        what,
                        tasks.framework,
                        first_line(error),
                        extra={"action": "task_error"},
                    )

        if store.supports_transactional_enqueue:
            transaction.on_commit(send_all, using=self.settings.database)  # at once outside a transaction
        else:
            send_all()

    # -- the queue --------------------------------------------------------------------

    def get(self, id: str) -> QueueItem | None:
        """Return the item, or ``None``."""
        return self.store.get(str(id))

    def list(self, *, offset: int = 0, limit: int = 100) -> builtins.list[QueueItem]:
        """Return a page of items, earliest due first."""
        if offset < 0 or limit < 0:
            raise QueueError(ErrorCode.INVALID, "'offset' and 'limit' must be 0 or more.")
        return self.store.list(offset=offset, limit=limit)

    def count(self) -> int:
        """Return how many items are queued."""
        return self.store.count()

    def retry_now(self, id: str) -> bool:
        """Make the item due now; ``True`` if it was in the queue."""
        store = self.store
        moved = store.reschedule(str(id), at=self.clock())
        if moved:
            self._send_tasks(store, [_usual_id(str(id))])
        return moved

    def retry_deferred(self, *, domain: str | None = None, ids: Sequence[str] | None = None) -> RetryResult:
        """Make deferred mail due now, by the admin's *Retry now* rules: an item being
        delivered is left to its worker, and no attempt is counted.

        Without arguments, every item with a deferred recipient; with ``domain``, every
        item with a deferred recipient at that domain (compared as routes compare
        domains: IDNA2008 A-labels, case and a trailing dot aside); with ``ids``, those
        items, whatever their recipients' state. Idle workers are woken.

        Returns how many items were made due and, of ``ids``, those being delivered
        (``leased``) and those no item has (``missing``), as given. Raises
        ``QueueError(INVALID)`` for a domain that is none, or for a domain and ids.
        """
        if domain is not None and ids is not None:
            raise QueueError(ErrorCode.INVALID, "Retry by domain or by item ids, not both.")
        now = self.clock()
        if ids is not None:
            return self._retry_items([ids] if isinstance(ids, str) else [str(given) for given in ids], now)
        retry_domain = None if domain is None else recipient_domain(domain)
        store = self.store
        result = RetryResult(due=store.retry_deferred(now=now, domain=retry_domain))
        if result.due:
            self._send_tasks(store, None)  # which items moved is the store's to know: a pass
        return result

    def _retry_items(self, ids: builtins.list[str], now: datetime) -> RetryResult:
        # The store gets each id once, in its usual form; the answer names them as given.
        usual = {given: _usual_id(given) for given in ids}
        store = self.store
        done = store.retry_items(builtins.list(dict.fromkeys(usual.values())), now=now)
        leased, missing = set(done.leased), set(done.missing)
        if done.due:
            self._send_tasks(
                store, [item_id for item_id in dict.fromkeys(usual.values()) if item_id not in leased | missing]
            )
        return RetryResult(
            due=done.due,
            leased=tuple(given for given, item_id in usual.items() if item_id in leased),
            missing=tuple(given for given, item_id in usual.items() if item_id in missing),
        )

    def cancel(self, id: str) -> QueueItem | None:
        """Drop the item and its message, with no DSN; return it as it stood.

        Sends ``signals.cancelled`` (the delivery log records each recipient not final
        yet as ``cancelled``, with the message's Subject and Message-ID, read from its
        head before the message goes).
        """
        store = self.store
        fields = HeadFields()
        if signals.cancelled.has_listeners():
            fields = head_fields(header_block(store.read_message_heads([str(id)]).get(str(id), b"")))
        item = store.cancel(str(id))
        if item is not None:
            pending = [r.address for r in item.pending_recipients]
            signals.send(
                signals.cancelled,
                item_id=item.id,
                item=item,
                recipients=pending,
                subject=fields.subject,
                message_id=fields.message_id,
            )
        return item

    # -- from async code ------------------------------------------------------------------
    #
    # Each runs its sync counterpart through asgiref's sync_to_async, thread-sensitive:
    # in the thread Django gives the request's sync code, on its database connection.
    # Async code holds no transaction (transaction.atomic is sync, and ATOMIC_REQUESTS
    # does not wrap async views), so with the ORM store each call commits on its own;
    # to enqueue as part of a transaction, do the work in a sync function and await it
    # through sync_to_async (docs/sending.md).

    async def aenqueue(
        self,
        message: EmailMessage | bytes,
        *,
        sender: str | None = None,
        recipients: Sequence[str] | None = None,
        at: datetime | None = None,
        key: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        channel: str = DEFAULT_CHANNEL,
    ) -> QueueItem:
        """``enqueue()``, awaited."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(
            message, sender=sender, recipients=recipients, at=at, key=key, priority=priority, channel=channel
        )

    async def aenqueue_many(
        self,
        messages: Sequence[EmailMessage | bytes],
        *,
        sender: str | None = None,
        recipients: Sequence[str] | None = None,
        at: datetime | None = None,
        keys: Sequence[str | None] | None = None,
        priority: int = DEFAULT_PRIORITY,
        channel: str = DEFAULT_CHANNEL,
    ) -> builtins.list[QueueItem]:
        """``enqueue_many()``, awaited."""
        return await sync_to_async(self.enqueue_many, thread_sensitive=True)(
            messages, sender=sender, recipients=recipients, at=at, keys=keys, priority=priority, channel=channel
        )

    async def aget(self, id: str) -> QueueItem | None:
        """``get()``, awaited."""
        return await sync_to_async(self.get, thread_sensitive=True)(id)

    async def acount(self) -> int:
        """``count()``, awaited."""
        return await sync_to_async(self.count, thread_sensitive=True)()

    async def aretry_now(self, id: str) -> bool:
        """``retry_now()``, awaited."""
        return await sync_to_async(self.retry_now, thread_sensitive=True)(id)

    async def acancel(self, id: str) -> QueueItem | None:
        """``cancel()``, awaited."""
        return await sync_to_async(self.cancel, thread_sensitive=True)(id)

    # -- for operators: the admin and queue_status ---------------------------------------

    def search(
        self,
        *,
        state: ItemState | str | None = None,
        domain: str | None = None,
        text: str | None = None,
        channel: str | None = None,
        priority: int | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> builtins.list[QueueItem]:
        """Return a page of the items that match, earliest due first (see ``ItemQuery``)."""
        if offset < 0 or limit < 0:
            raise QueueError(ErrorCode.INVALID, "'offset' and 'limit' must be 0 or more.")
        query = ItemQuery(
            now=self.clock(),
            state=None if state is None else ItemState(state),
            domain=domain,
            text=text,
            channel=None if channel is None else check_channel(channel),
            priority=None if priority is None else check_priority(priority),
        )
        return self.store.search(query, offset=offset, limit=limit)

    def summary(self, *, age_buckets: Sequence[timedelta] = AGE_BUCKETS) -> QueueSummary:
        """Return the counts by state, the oldest item and the queue's shape, now."""
        return self.store.summary(now=self.clock(), age_buckets=age_buckets)

    def destination_states(self) -> builtins.list[DestinationState]:
        """Return the shaped destinations the store keeps a bucket for (``SHAPING``), now;
        empty without ``SHAPING``, which then costs no store call."""
        if not self.settings.shaping:
            return []
        now = self.clock()
        patterns = Patterns(self.settings.shaping)
        return [
            state.with_quota(patterns.limits_of(state.key), now) for state in self.store.destination_states(now=now)
        ]

    def read_message(self, id: str) -> bytes | None:
        """Return an item's message as queued, or ``None``."""
        return self.store.read_message(str(id))

    def deliver_due(
        self,
        now: datetime | None = None,
        *,
        ids: Sequence[str] | None = None,
        claim_seconds: float | None = None,
        transport: Transport | None = None,
        resolver: Resolver | None = None,
    ) -> Stats:
        """Deliver everything due in this process, then return what was done.

        For tests and cron: ``now`` fixes the clock for the whole pass, and the SMTP
        transport and the DNS resolver can be given in place of the real ones.

        ``ids``: deliver those items only, each if it is due and no lease holds it (a
        duplicate call delivers nothing twice); a store that does not claim by id
        (``claims_by_id``) runs the whole pass instead. ``claim_seconds``: stop
        claiming once that long has passed since the pass began (one claim at least),
        give back what was claimed but not started (due at once), and return when the
        sessions under way end. With ``TASKS`` on, the DSNs the pass sends are queued through ``enqueue``,
        so that each has its delivery task too.
        """
        from .worker import Worker

        if ids is not None and not self.store.claims_by_id:
            ids = None
        clock = self.clock if now is None else (lambda: now)
        worker = Worker(
            settings=self.settings,
            store=self.store,
            transport=transport,
            resolver=resolver,
            clock=clock,
            enqueue=self.enqueue if self.settings.tasks is not None else None,
            item_ids=None if ids is None else [_usual_id(str(item_id)) for item_id in ids],
            claim_seconds=claim_seconds,
        )
        stats = worker.run_until_idle()
        if worker.configuration_error is not None:
            raise worker.configuration_error
        return stats


def _check_at(at: datetime | None) -> None:
    if at is not None and (not isinstance(at, datetime) or timezone.is_naive(at)):
        raise QueueError(ErrorCode.INVALID, "'at' must be an aware datetime (USE_TZ); got a naive one or another type.")


def _check_key(key: str | None) -> None:
    if key is not None:
        if not isinstance(key, str) or not 0 < len(key) <= 255:
            raise QueueError(ErrorCode.INVALID, "'key' must be a string of 1 to 255 characters.")
        require_keepable(key, "idempotency key")


def _usual_id(item_id: str) -> str:
    """Return an id in the form items are given (a UUID's usual text), or as it is."""
    try:
        return str(uuid.UUID(item_id))
    except ValueError:
        return item_id


def _on_commit(store: QueueStore) -> bool:
    """Return whether an add must wait for the caller's transaction to commit.

    A durable store outside the database (Redis) cannot join the transaction, so the
    add waits for its commit: a view that rolls back queues nothing. The memory store
    adds at once, as its tests expect; so does every store outside a transaction.
    """
    return not store.supports_transactional_enqueue and store.durable and transaction.get_connection().in_atomic_block


queue = QueueService()
