"""The archive of delivered messages (``ARCHIVE``), and its retention.

The worker's recorder writes an ``ArchivedMessage`` for each item of an archived
channel that leaves the queue with at least one recipient delivered, from the
message it read for the attempt: one statement per batch, no read of the store.
The archive is the ``ArchivedMessage`` model in the database
``BUMAIL_QUEUE['DATABASE']`` names, whatever store keeps the queue, as the delivery
log is. ``purge()`` (``manage.py queue_purge``) drops the messages past
``body_until`` (the header section stays) and deletes the rows past ``keep_until``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from email.header import decode_header, make_header

from django.db import transaction
from django.db.models import QuerySet

from .conf import QueueSettings, get_settings
from .items import QueueItem, RecipientStatus
from .models import ArchivedMessage, ResentMessage
from .queries import header_block

logger = logging.getLogger(__name__)

#: Rows a purge changes per statement: short transactions, no long lock on the table.
PURGE_BATCH_SIZE = 1000

# A Subject or Message-ID field at a line's start, with its folded lines (RFC 5322 §2.2.3).
_FIELD = re.compile(rb"^(subject|message-id)[ \t]*:([^\r\n]*(?:\r?\n[ \t][^\r\n]*)*)", re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HeadFields:
    """What names a message to a person: its subject (RFC 2047 decoded) and Message-ID."""

    subject: str = ""
    message_id: str = ""


def head_fields(headers: bytes | None) -> HeadFields:
    """Return the first Subject and Message-ID of a header section; empty when absent.

    Two fields are looked for, not the whole section parsed: the worker does this
    for every attempt, and a parse of the section costs several times more.
    """
    if not headers:
        return HeadFields()
    found: dict[bytes, str] = {}
    for match in _FIELD.finditer(headers):
        name = match.group(1).lower()
        if name not in found:
            found[name] = " ".join(match.group(2).decode("utf-8", "replace").split())
        if len(found) == 2:
            break
    return HeadFields(subject=_decoded(found.get(b"subject", "")), message_id=found.get(b"message-id", ""))


def _decoded(value: str) -> str:
    """``value`` with its RFC 2047 encoded words decoded; as written when they are broken."""
    if "=?" not in value:
        return value
    try:
        return " ".join(str(make_header(decode_header(value))).split())
    except (LookupError, ValueError, UnicodeError):  # an unknown charset, a bad encoding
        return value


def is_archived(item: QueueItem, settings: QueueSettings) -> bool:
    """Return whether ``item``'s channel keeps its delivered mail (``ARCHIVE``)."""
    return settings.archive_for(item.channel) is not None


def archived_message(
    item: QueueItem, message: bytes, *, settings: QueueSettings, now: datetime, fields: HeadFields
) -> ArchivedMessage | None:
    """Return the row that archives ``item`` as recorded, or ``None`` when it is not to
    be: its channel is not archived, a recipient is still pending, none was delivered,
    or its id is no UUID (a store's own ids; the archive is keyed by the item's)."""
    kept = settings.archive_for(item.channel)
    if kept is None or not item.is_finished:
        return None
    if not any(r.status == RecipientStatus.DELIVERED for r in item.recipients):
        return None
    try:
        item_id = uuid.UUID(item.id)
    except ValueError:
        return None
    return ArchivedMessage(
        item_id=item_id,
        archived_at=now,
        channel=item.channel,
        priority=item.priority,
        sender=item.sender,
        recipients="\n".join(r.address for r in item.recipients),
        subject=fields.subject,
        message_id=fields.message_id,
        headers=header_block(message),
        data=message,
        body_until=now + kept,
        keep_until=now + max(kept, settings.redact_after),
    )


def write(rows: Sequence[ArchivedMessage]) -> None:
    """Add ``rows`` in one statement, their ``resent_from`` filled first (one query, only
    when a row may be a resend). A batch the database refuses is written row by row, so
    one bad row costs only itself (logged): the mail was delivered all the same."""
    if not rows:
        return
    database = get_settings().database
    try:
        _fill_resent_from(rows, database)
        ArchivedMessage.objects.using(database).bulk_create(rows, ignore_conflicts=True)
        return
    except Exception:  # as the delivery log's: logged, never in the way of the outcomes
        if len(rows) == 1:
            logger.exception("a message could not be archived item=%s", rows[0].item_id)
            return
        logger.warning(
            "the archive's batch could not be written; writing its %d rows one by one", len(rows), exc_info=True
        )
    for row in rows:
        try:
            ArchivedMessage.objects.using(database).bulk_create([row], ignore_conflicts=True)
        except Exception:
            logger.exception("a message could not be archived item=%s", row.item_id)


def _fill_resent_from(rows: Sequence[ArchivedMessage], database: str) -> None:
    links = dict(
        ResentMessage.objects.using(database)
        .filter(item_id__in=[row.item_id for row in rows])
        .values_list("item_id", "resent_from")
    )
    for row in rows:
        row.resent_from = links.get(row.item_id)


def purge(*, now: datetime, batch_size: int = PURGE_BATCH_SIZE) -> tuple[int, int]:
    """Drop the messages kept past ``body_until`` (their header section stays), then
    delete the rows kept past ``keep_until``, in batches; return how many of each.

    Each batch is its own short transaction, as ``delivery_log.purge``'s: a purge
    stopped half-way has done whole batches.
    """
    database = get_settings().database
    rows = ArchivedMessage.objects.using(database)
    redacted = deleted = 0
    while True:
        with transaction.atomic(using=database):
            ids = _first(rows.filter(body_until__lt=now, data__isnull=False).order_by("body_until"), batch_size)
            if not ids:
                break
            redacted += rows.filter(item_id__in=ids).update(data=None)
    while True:
        with transaction.atomic(using=database):
            ids = _first(rows.filter(keep_until__lt=now).order_by("keep_until"), batch_size)
            if not ids:
                break
            deleted += rows.filter(item_id__in=ids).delete()[0]
    return redacted, deleted


def _first(rows: QuerySet[ArchivedMessage], size: int) -> list[uuid.UUID]:
    return list(rows.values_list("item_id", flat=True)[:size])


def due_counts(*, now: datetime) -> tuple[int, int]:
    """Return how many messages a purge at ``now`` would drop, and how many rows it would delete."""
    rows = ArchivedMessage.objects.using(get_settings().database)
    return (
        rows.filter(body_until__lt=now, data__isnull=False).count(),
        rows.filter(keep_until__lt=now).count(),
    )
