"""The delivery log: each recipient's outcome, kept in the database after the item left.

The worker's outcome signals (``delivered``, ``deferred``, ``failed``) and the
service's ``cancelled`` are the only writers, so the log is the same whatever store
keeps the queue: with the Redis store too, it is the ``DeliveryLog`` model in the
database ``BUMAIL_QUEUE['DATABASE']`` names. ``DELIVERY_LOG = False`` turns it off;
``purge()`` (``manage.py queue_purge``) deletes old entries in batches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from . import signals
from .addresses import domain_of
from .conf import get_settings
from .estimates import planner_estimate
from .items import QueueItem, Reply
from .models import DeliveryLog

logger = logging.getLogger(__name__)

#: The status of a recipient that failed because it was deferred beyond ``MAX_AGE``.
EXPIRED_STATUS = "4.4.7"
#: Rows a purge deletes per statement: short transactions, no long lock on the table.
PURGE_BATCH_SIZE = 1000

Status = DeliveryLog.Status


def _entry(
    *,
    item_id: str,
    recipient: str,
    status: str,
    reply: Reply | None,
    envelope_sender: str | None,
    remote_host: str | None,
    next_attempt_at: datetime | None,
    at: datetime,
    tls: bool = False,
    provider_message_id: str | None = None,
    subject: str | None = None,
    message_id: str | None = None,
) -> DeliveryLog:
    return DeliveryLog(
        logged_at=at,
        item_id=item_id,
        recipient=recipient,
        domain=domain_of(recipient)[:255],
        sender=envelope_sender or "",
        status=status,
        reply_code=None if reply is None else reply.code,
        reply_status="" if reply is None else reply.status[:16],
        reply_text="" if reply is None else reply.text,
        remote_host=(remote_host or "")[:255],
        tls=tls,
        next_attempt_at=next_attempt_at,
        provider_message_id=(provider_message_id or "")[:255],
        subject=subject or "",
        message_id=message_id or "",
    )


def record(
    *,
    item_id: str,
    recipient: str,
    status: str,
    reply: Reply | None = None,
    envelope_sender: str | None = None,
    remote_host: str | None = None,
    next_attempt_at: datetime | None = None,
    at: datetime | None = None,
    tls: bool = False,
    provider_message_id: str | None = None,
    subject: str | None = None,
    message_id: str | None = None,
) -> DeliveryLog | None:
    """Add one entry (nothing when ``DELIVERY_LOG`` is off); return it."""
    settings = get_settings()
    if not settings.delivery_log:
        return None
    entry = _entry(
        item_id=item_id, recipient=recipient, status=status, reply=reply, envelope_sender=envelope_sender,
        remote_host=remote_host, next_attempt_at=next_attempt_at, at=at or timezone.now(), tls=tls,
        provider_message_id=provider_message_id, subject=subject, message_id=message_id,
    )  # fmt: skip
    gathered = getattr(_gathering, "entries", None)
    if gathered is not None:
        gathered.append(entry)
    else:
        entry.save(using=settings.database, force_insert=True)
    return entry


_gathering = threading.local()


@contextmanager
def gathered() -> Iterator[None]:
    """Write the entries this thread adds inside the block in one INSERT, at its end.

    The worker's recorder wraps each batch of attempts in it: one statement and one
    commit for the batch's entries, not one per recipient. When that statement fails,
    each entry is written alone, so one entry the database refuses costs only itself
    (logged); the outcomes are recorded in the queue all the same.
    """
    if getattr(_gathering, "entries", None) is not None:
        yield  # already gathering: the outer block writes
        return
    entries: list[DeliveryLog] = []
    _gathering.entries = entries
    try:
        yield
    finally:
        del _gathering.entries
        if entries:
            _write_each_alone_on_failure(entries)


def _write_each_alone_on_failure(entries: list[DeliveryLog]) -> None:
    try:
        write(entries)
        return
    except Exception:  # as a signal receiver's would be: logged, never in the way
        if len(entries) == 1:
            logger.exception("a delivery log entry could not be written item=%s", entries[0].item_id)
            return
        logger.warning(
            "the delivery log's batch could not be written; writing its %d entries one by one",
            len(entries),
            exc_info=True,
        )
    for entry in entries:
        try:
            write([entry])
        except Exception:
            logger.exception("a delivery log entry could not be written item=%s", entry.item_id)


#: The columns ``write`` fills (the id is the database's).
_COLUMNS = (
    "logged_at", "item_id", "recipient", "domain", "sender", "status",
    "reply_code", "reply_status", "reply_text", "remote_host", "tls", "next_attempt_at", "provider_message_id",
    "subject", "message_id",
)  # fmt: skip


def write(entries: list[DeliveryLog]) -> None:
    """Add ``entries`` in one statement (one commit outside a transaction).

    On PostgreSQL outside a transaction, by ``COPY``: psycopg adapts the rows in C,
    where an ``INSERT`` of many rows has each of its values bound in Python, and that
    binding, not the database, was most of what a busy worker spent on its log.
    """
    database = get_settings().database
    connection = connections[database]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        DeliveryLog.objects.using(database).bulk_create(entries)
        return
    quote = connection.ops.quote_name
    sql = f"COPY {quote(DeliveryLog._meta.db_table)} ({', '.join(map(quote, _COLUMNS))}) FROM STDIN"
    connection.ensure_connection()
    with connection.wrap_database_errors, connection.connection.cursor() as cursor, cursor.copy(sql) as copy:
        for entry in entries:
            copy.write_row([getattr(entry, column) for column in _COLUMNS])


def record_cancelled(
    item: QueueItem,
    recipients: Iterable[str],
    *,
    at: datetime | None = None,
    subject: str | None = None,
    message_id: str | None = None,
) -> int:
    """Add a ``cancelled`` entry per recipient, in one statement; return how many."""
    settings = get_settings()
    if not settings.delivery_log:
        return 0
    when = at or timezone.now()
    entries = [
        _entry(
            item_id=item.id,
            recipient=address,
            status=Status.CANCELLED,
            reply=None,
            envelope_sender=item.sender,
            remote_host=None,
            next_attempt_at=None,
            at=when,
            subject=subject,
            message_id=message_id,
        )
        for address in recipients
    ]
    DeliveryLog.objects.using(settings.database).bulk_create(entries)
    return len(entries)


def history(item_id: str) -> QuerySet[DeliveryLog]:
    """Return an item's entries, oldest first."""
    return DeliveryLog.objects.using(get_settings().database).filter(item_id=item_id).order_by("logged_at", "id")


def estimated_count(entries: QuerySet[DeliveryLog]) -> int | None:
    """Return PostgreSQL's estimate of the whole log once it is large, or ``None``.

    ``None`` means: count ``entries`` (a filtered list, a small log, SQLite). The log
    is in the database whatever store keeps the queue, so this asks the database.
    """
    if entries.query.where:
        return None
    return planner_estimate(connections[entries.db], DeliveryLog._meta.db_table)


def outcomes_since(since: datetime) -> dict[str, int]:
    """Return how many entries of each status were logged since ``since`` (every status
    present, 0 where none was), in one statement over the ``logged_at`` index."""
    rows = (
        DeliveryLog.objects.using(get_settings().database)
        .filter(logged_at__gte=since)
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
    )
    counts = dict.fromkeys(Status.values, 0)
    counts.update(rows)
    return counts


def purge(*, older_than: timedelta, now: datetime | None = None, batch_size: int = PURGE_BATCH_SIZE) -> int:
    """Delete the entries logged more than ``older_than`` ago, in batches; return how many.

    Each batch is its own short transaction, so a purge of millions of rows never
    holds a lock for long, and one stopped half-way has deleted whole batches.
    """
    database = get_settings().database
    cutoff = (now or timezone.now()) - older_than
    rows = DeliveryLog.objects.using(database)
    deleted = 0
    while True:
        with transaction.atomic(using=database):
            ids = list(
                rows.filter(logged_at__lt=cutoff).order_by("logged_at").values_list("id", flat=True)[:batch_size]
            )
            if not ids:
                return deleted
            deleted += rows.filter(id__in=ids).delete()[0]


# -- the receivers ----------------------------------------------------------------------


def _on_delivered(*, item_id: str, recipient: str, reply: Reply, **kwargs: Any) -> None:
    record(
        item_id=item_id, recipient=recipient, status=Status.DELIVERED, reply=reply,
        envelope_sender=kwargs.get("envelope_sender"), remote_host=kwargs.get("remote_host"), tls=kwargs.get("tls", False),
        provider_message_id=kwargs.get("provider_message_id"), subject=kwargs.get("subject"),
        message_id=kwargs.get("message_id"),
    )  # fmt: skip


def _on_deferred(*, item_id: str, recipient: str, reply: Reply, **kwargs: Any) -> None:
    record(
        item_id=item_id, recipient=recipient, status=Status.DEFERRED, reply=reply,
        envelope_sender=kwargs.get("envelope_sender"), remote_host=kwargs.get("remote_host"),
        next_attempt_at=kwargs.get("next_attempt_at"), tls=kwargs.get("tls", False),
        provider_message_id=kwargs.get("provider_message_id"), subject=kwargs.get("subject"),
        message_id=kwargs.get("message_id"),
    )  # fmt: skip


def _on_failed(*, item_id: str, recipient: str, reply: Reply, **kwargs: Any) -> None:
    # A deferral past MAX_AGE fails with 4.4.7 (RFC 3463: delivery time expired).
    status = Status.EXPIRED if reply.status == EXPIRED_STATUS else Status.FAILED
    record(
        item_id=item_id, recipient=recipient, status=status, reply=reply,
        envelope_sender=kwargs.get("envelope_sender"), remote_host=kwargs.get("remote_host"), tls=kwargs.get("tls", False),
        provider_message_id=kwargs.get("provider_message_id"), subject=kwargs.get("subject"),
        message_id=kwargs.get("message_id"),
    )  # fmt: skip


def _on_cancelled(*, item: QueueItem, recipients: Iterable[str], **kwargs: Any) -> None:
    record_cancelled(item, recipients, subject=kwargs.get("subject"), message_id=kwargs.get("message_id"))


def _on_bounced(*, item_id: str | None, recipient: str, reply: Reply, **kwargs: Any) -> None:
    if item_id is not None:  # an entry belongs to an item: a bounce no return path names has none
        record(item_id=item_id, recipient=recipient, status=Status.BOUNCED, reply=reply)


def connect() -> None:
    """Connect the log's receivers (``AppConfig.ready``); connecting twice is harmless."""
    signals.delivered.connect(_on_delivered, dispatch_uid="bumail_queue.delivery_log.delivered")
    signals.deferred.connect(_on_deferred, dispatch_uid="bumail_queue.delivery_log.deferred")
    signals.failed.connect(_on_failed, dispatch_uid="bumail_queue.delivery_log.failed")
    signals.cancelled.connect(_on_cancelled, dispatch_uid="bumail_queue.delivery_log.cancelled")
    signals.bounced.connect(_on_bounced, dispatch_uid="bumail_queue.delivery_log.bounced")
