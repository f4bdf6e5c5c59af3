"""One person's data: ``queue.export_address`` and ``queue.forget_address`` (erasure),
behind ``manage.py queue_export`` and ``manage.py queue_forget``.

An address is matched as the suppression list keys it (``addresses.normal_address``):
its local part as written, its domain without case and in A-labels. What is held
about it:

- the queue's items whose sender or one of whose recipients it is, and the DSNs whose
  message names it, with their messages (an erasure deletes each whole: the message
  names every recipient in its headers, so removing one recipient would leave the
  address behind);
- the delivery log's entries whose recipient or sender it is (deleted), and those of
  other recipients whose subject, reply or Message-ID mention it (that text redacted);
- the archive's messages (``ArchivedMessage``) it sent or was a recipient of;
- returned mail that names it anywhere (its envelope, its subject, its octets);
- the bulk actions whose filter named it (the value redacted);
- the suppression list's entries, which an erasure does not drop but keys anew by
  ``suppression.forgotten_key`` (an HMAC of the address), their reply text redacted:
  mail to the address stays suppressed, and the list no longer says the address.

The mailboxes' records (``MailboxMessage``) hold digests alone.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django.db.models import Q

from bumail_queue.addresses import mailbox_problem, normal_address, u_labels
from bumail_queue.conf import QueueSettings
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import QueueItem, Reply
from bumail_queue.models import ArchivedMessage, BulkAction, DeliveryLog, ReturnedMail
from bumail_queue.preview import summarize_head
from bumail_queue.queries import ItemQuery, header_block, state_of
from bumail_queue.stores import QueueStore
from bumail_queue.suppression import (
    FORGOTTEN_LABEL,
    GLOBAL_SCOPE,
    Suppression,
    SuppressionChange,
    forgotten_key,
    scope_label,
)

logger = logging.getLogger(__name__)

#: Items a page of the store's search reads; rows read a chunk at a time.
PAGE = 1000
#: The version of ``export_address``'s document: a key's meaning never changes within one.
EXPORT_FORMAT = 1


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ForgetResult:
    """What ``forget_address`` did, or with ``dry_run`` would do, place by place."""

    dry_run: bool
    items: tuple[str, ...]
    """The ids of the items deleted with their messages."""
    delivery_log: int
    """Delivery log entries of the address (its recipient or sender) deleted."""
    delivery_log_redacted: int
    """Other entries whose subject, reply or Message-ID mentioned it, redacted."""
    archive: int
    returned_mail: int
    bulk_actions: int
    """Bulk actions whose filter named it, the value redacted."""
    suppressions: int
    """Suppression entries now kept under the address's ``forgotten_key``."""

    def summary(self) -> str:
        """Return the counts as one line, without the address: what the audit log says."""
        return (
            f"{len(self.items)} items, {self.delivery_log} delivery log entries "
            f"({self.delivery_log_redacted} more redacted), {self.archive} archived messages, "
            f"{self.returned_mail} returned mail, {self.bulk_actions} bulk actions redacted, "
            f"{self.suppressions} suppression entries hashed"
        )


def checked_address(address: object) -> str:
    """Return ``address`` in ``normal_address``'s form; raise ``QueueError(INVALID)`` in
    one line for what is no address."""
    problem = mailbox_problem(address.strip()) if isinstance(address, str) else "it is not a string"
    if problem:
        raise QueueError(ErrorCode.INVALID, f"{address!r} is not an address: {problem}.")
    assert isinstance(address, str)
    return normal_address(address.strip())


class Matcher:
    """Tells where an address is: an envelope address equal to it (``normal_address``),
    or text that mentions it in any spelling (its domain in A-labels or U-labels), case aside."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.local = address.rpartition("@")[0]
        domain = address.rpartition("@")[2]
        spellings = {address, f"{self.local}@{_unicode(domain)}"}
        self._pattern = re.compile("|".join(re.escape(s) for s in sorted(spellings)), re.IGNORECASE)
        self._octets = [s.lower().encode("utf-8") for s in spellings]

    def is_it(self, address: str) -> bool:
        return normal_address(address) == self.address

    def is_in(self, item: QueueItem) -> bool:
        return self.is_it(item.sender) or any(self.is_it(r.address) for r in item.recipients)

    def mentioned(self, text: str) -> bool:
        return bool(self._pattern.search(text))

    def mentioned_in_octets(self, data: bytes) -> bool:
        lower = data.lower()
        return any(octets in lower for octets in self._octets)

    def redacted(self, text: str) -> str:
        return self._pattern.sub(FORGOTTEN_LABEL, text)

    def lines_hold(self, lines: str) -> bool:
        """Whether one line of ``lines`` (an archived message's recipients) is the address."""
        return any(self.is_it(line.strip()) for line in lines.splitlines() if line.strip())

    @property
    def prefix_filter(self) -> str:
        """What every spelling of the address starts with: its local part and the ``@``."""
        return f"{self.local}@"


def _unicode(domain: str) -> str:
    try:
        return u_labels(domain)
    except UnicodeError:
        return domain


class PersonalDataService:
    """``export_address`` and ``forget_address`` of ``QueueService`` (a base class of it)."""

    clock: Callable[[], datetime]

    @property
    def store(self) -> QueueStore:
        raise NotImplementedError

    @property
    def settings(self) -> QueueSettings:
        raise NotImplementedError

    def suppressions_for(self, address: str) -> list[Suppression]:
        raise NotImplementedError

    # -- export -------------------------------------------------------------------------

    def export_address(self, address: str) -> dict[str, Any]:
        """Return everything held about ``address``, as JSON takes it (docs/operations.md
        lists the keys); datetimes are ISO 8601 text. Raises ``QueueError(INVALID)`` for
        what is no address."""
        matcher = Matcher(checked_address(address))
        now = self.clock()
        items = items_of(self.store, matcher, now)
        messages = self.store.read_messages([item.id for item in items])
        database = self.settings.database
        return {
            "format": EXPORT_FORMAT,
            "address": matcher.address,
            "exported_at": now.isoformat(),
            "items": [_item_json(item, messages.get(item.id), now) for item in items],
            "delivery_log": [_log_json(row) for row in _log_rows(database, matcher)[0]],
            "archive": [_archived_json(row) for row in _archive_rows(database, matcher)],
            "suppressions": [_suppression_json(entry) for entry in self.suppressions_for(matcher.address)],
            "returned_mail": [_returned_json(row) for row in _returned_rows(database, matcher)],
            "bulk_actions": [_bulk_json(row) for row in _bulk_rows(matcher)],
        }

    # -- erasure ------------------------------------------------------------------------

    def forget_address(self, address: str, *, dry_run: bool = False) -> ForgetResult:
        """Erase ``address`` from the queue, the delivery log, the archive, returned mail
        and the bulk actions' audit; key its suppression entries by its HMAC
        (``suppression.forgotten_key``), so that mail to it stays suppressed.

        Every item it is the sender or a recipient of is deleted with its message, its
        other recipients' copies too, with no DSN and no log entry. With ``dry_run``,
        nothing changes and the result says what would. Raises ``QueueError(INVALID)``
        for what is no address.
        """
        matcher = Matcher(checked_address(address))
        store, database = self.store, self.settings.database
        suppressions = self._hash_suppressions(matcher, dry_run=dry_run)
        items = [item.id for item in items_of(store, matcher, self.clock())]
        log, mentions = _log_rows(database, matcher)
        archive = [row.item_id for row in _archive_rows(database, matcher)]
        returned = [row.pk for row in _returned_rows(database, matcher)]
        bulk = _bulk_rows(matcher)
        if not dry_run:
            for item_id in items:
                store.cancel(item_id)  # no signal: the delivery log would name the address again
            DeliveryLog.objects.using(database).filter(pk__in=[row.pk for row in log]).delete()
            for row in mentions:
                _redact_log(row, matcher)
            ArchivedMessage.objects.using(database).filter(item_id__in=archive).delete()
            ReturnedMail.objects.using(database).filter(pk__in=returned).delete()
            for action in bulk:
                _redact_bulk(action, matcher)
        result = ForgetResult(
            dry_run=dry_run,
            items=tuple(items),
            delivery_log=len(log),
            delivery_log_redacted=len(mentions),
            archive=len(archive),
            returned_mail=len(returned),
            bulk_actions=len(bulk),
            suppressions=suppressions,
        )
        if not dry_run:
            logger.info("forgot an address: %s", result.summary(), extra={"action": "forget_address"})
        return result

    def _hash_suppressions(self, matcher: Matcher, *, dry_run: bool) -> int:
        """Key the address's entries by its HMAC, in one step; return how many."""
        entries = [entry for entry in self.suppressions_for(matcher.address) if not entry.forgotten]
        if dry_run:
            return len(entries)
        now = self.clock()
        # An entry past its time is no longer looked up, but still holds the address.
        self.store.purge_suppressions(now=now)
        key = forgotten_key(matcher.address)
        hashed = tuple(
            dataclasses.replace(
                entry, address=key, reply=Reply(code=entry.reply.code, status=entry.reply.status, text="")
            )
            for entry in entries
        )
        scopes = sorted({GLOBAL_SCOPE, *(entry.scope for entry in entries)})
        change = SuppressionChange(add=hashed, clear_scoped=tuple((matcher.address, scope) for scope in scopes))
        self.store.update_suppressions(change, now=now)
        return len(hashed)


# -- finding what names the address ----------------------------------------------------


def items_of(store: QueueStore, matcher: Matcher, now: datetime) -> list[QueueItem]:
    """The items the address is the sender or a recipient of, and the DSNs that report on
    it (a null sender, and the address in their octets), oldest first.

    One pass over every item, a page of ``bulk_page`` at a time, matched here: a pattern
    the store could match would miss an address whose domain is written in U-labels,
    and a DSN names the failed recipient in its body alone.
    """
    found: dict[str, QueueItem] = {}
    bounces: list[QueueItem] = []
    for item in _pages(store, ItemQuery(now=now)):
        if matcher.is_in(item):
            found[item.id] = item
        elif not item.sender:
            bounces.append(item)
    for start in range(0, len(bounces), PAGE):
        chunk = {item.id: item for item in bounces[start : start + PAGE]}
        for item_id, data in store.read_messages(list(chunk)).items():
            if matcher.mentioned_in_octets(data):
                found[item_id] = chunk[item_id]
    return sorted(found.values(), key=lambda item: (item.created_at, item.id))


def _pages(store: QueueStore, query: ItemQuery) -> Iterator[QueueItem]:
    cursor: str | None = None
    while True:
        page = store.bulk_page(query, cursor=cursor, limit=PAGE)
        yield from page.items
        if page.cursor is None:
            return
        cursor = page.cursor


def _log_rows(database: str, matcher: Matcher) -> tuple[list[DeliveryLog], list[DeliveryLog]]:
    """The entries of the address (recipient or sender), and the others that mention it."""
    rows = DeliveryLog.objects.using(database).order_by("logged_at", "id")
    prefix = matcher.prefix_filter
    own = [
        row
        for row in rows.filter(Q(recipient__istartswith=prefix) | Q(sender__istartswith=prefix)).iterator(PAGE)
        if matcher.is_it(row.recipient) or matcher.is_it(row.sender)
    ]
    owned = {row.pk for row in own}
    text = Q(subject__icontains=prefix) | Q(reply_text__icontains=prefix) | Q(message_id__icontains=prefix)
    mentions = [
        row
        for row in rows.filter(text).iterator(PAGE)
        if row.pk not in owned
        and any(matcher.mentioned(value) for value in (row.subject, row.reply_text, row.message_id))
    ]
    return own, mentions


def _redact_log(row: DeliveryLog, matcher: Matcher) -> None:
    row.subject, row.reply_text, row.message_id = (
        matcher.redacted(row.subject),
        matcher.redacted(row.reply_text),
        matcher.redacted(row.message_id),
    )
    row.save(update_fields=["subject", "reply_text", "message_id"])


def _archive_rows(database: str, matcher: Matcher) -> list[ArchivedMessage]:
    prefix = matcher.prefix_filter
    rows = (
        ArchivedMessage.objects.using(database)
        .filter(Q(sender__istartswith=prefix) | Q(recipients__icontains=prefix))
        .defer("data")
        .order_by("archived_at", "item_id")
    )
    return [row for row in rows.iterator(PAGE) if matcher.is_it(row.sender) or matcher.lines_hold(row.recipients)]


def _returned_rows(database: str, matcher: Matcher) -> list[ReturnedMail]:
    """Returned mail that names the address anywhere: read whole, as its octets are not
    text a query can search (and such mail is rare: the unread alone is kept)."""
    rows = ReturnedMail.objects.using(database).order_by("received_at", "id")
    return [
        row
        for row in rows.iterator(100)
        if any(matcher.mentioned(text) for text in (row.recipients, row.sender, row.subject, row.note))
        or matcher.mentioned_in_octets(bytes(row.message))
    ]


def _bulk_rows(matcher: Matcher) -> list[BulkAction]:
    rows = BulkAction.objects.order_by("acted_at", "id")
    return [row for row in rows.iterator(PAGE) if _names(row, matcher)]


def _names(action: BulkAction, matcher: Matcher) -> bool:
    values = action.filter.values() if isinstance(action.filter, dict) else []
    return matcher.mentioned(action.by) or any(isinstance(v, str) and matcher.mentioned(v) for v in values)


def _redact_bulk(action: BulkAction, matcher: Matcher) -> None:
    if isinstance(action.filter, dict):
        action.filter = {
            key: FORGOTTEN_LABEL if isinstance(value, str) and matcher.mentioned(value) else value
            for key, value in action.filter.items()
        }
    if matcher.mentioned(action.by):
        action.by = FORGOTTEN_LABEL
    action.save(update_fields=["filter", "by"])


# -- the export's JSON -----------------------------------------------------------------


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _item_json(item: QueueItem, message: bytes | None, now: datetime) -> dict[str, Any]:
    head = header_block(message) if message is not None else None
    return {
        "id": item.id,
        "state": state_of(item, now).value,
        "sender": item.sender,
        "recipients": [
            {"address": r.address, "status": r.status.value, "reply": None if r.reply is None else r.reply.to_dict()}
            for r in item.recipients
        ],
        "channel": item.channel,
        "priority": item.priority,
        "created_at": _time(item.created_at),
        "next_attempt_at": _time(item.next_attempt_at),
        "attempts": item.attempts,
        "subject": summarize_head(head).subject if head is not None else None,
        "message_headers": None if head is None else _text(head),
    }


def _log_json(row: DeliveryLog) -> dict[str, Any]:
    return {
        "logged_at": _time(row.logged_at),
        "item_id": str(row.item_id),
        "recipient": row.recipient,
        "sender": row.sender,
        "status": row.status,
        "reply": {"code": row.reply_code, "status": row.reply_status, "text": row.reply_text},
        "remote_host": row.remote_host,
        "subject": row.subject,
        "message_id": row.message_id,
    }


def _archived_json(row: ArchivedMessage) -> dict[str, Any]:
    return {
        "item_id": str(row.item_id),
        "archived_at": _time(row.archived_at),
        "channel": row.channel,
        "sender": row.sender,
        "recipients": [line.strip() for line in row.recipients.splitlines() if line.strip()],
        "subject": row.subject,
        "message_id": row.message_id,
        "message_headers": _text(header_block(bytes(row.headers))),
    }


def _suppression_json(entry: Suppression) -> dict[str, Any]:
    return {
        "address": FORGOTTEN_LABEL if entry.forgotten else entry.address,
        "key": entry.address,
        "scope": entry.scope,
        "scope_label": scope_label(entry.scope),
        "reason": entry.reason.value,
        "reply": entry.reply.to_dict(),
        "created_at": _time(entry.created_at),
        "expires_at": _time(entry.expires_at),
    }


def _returned_json(row: ReturnedMail) -> dict[str, Any]:
    return {
        "id": row.pk,
        "received_at": _time(row.received_at),
        "recipients": row.recipients,
        "sender": row.sender,
        "subject": row.subject,
        "note": row.note,
        "message_base64": base64.b64encode(bytes(row.message)).decode("ascii"),
    }


def _bulk_json(row: BulkAction) -> dict[str, Any]:
    return {
        "id": row.pk,
        "acted_at": _time(row.acted_at),
        "by": row.by,
        "action": row.action,
        "filter": row.filter,
    }


__all__ = ["EXPORT_FORMAT", "ForgetResult", "PersonalDataService", "checked_address"]
