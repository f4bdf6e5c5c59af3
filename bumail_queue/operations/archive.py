"""Resending an archived message: ``queue.resend`` (``manage.py queue_resend``, the
admin's *Resend*).

A resend queues a new item with the archived octets but a new ``Message-ID``, the
same envelope sender, channel and priority, to the recipients of the original (all
of them, or those asked for). The link from the new item to the original is written
(``ResentMessage``) before the item is queued, so the archive names its resends at
once, and the new item's archive row gets it in ``resent_from``. Its idempotency key,
``resend:<original id>:<n>`` (the original's n-th resend, as counted when the person
asked), makes a confirmation posted twice one item while the first is queued.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from django.core.mail import EmailMessage

from bumail_queue import mime
from bumail_queue.addresses import ascii_lower
from bumail_queue.conf import QueueSettings
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import DEFAULT_CHANNEL, DEFAULT_PRIORITY, NewItem, QueueItem
from bumail_queue.models import ArchivedMessage, ResentMessage
from bumail_queue.screening import screen
from bumail_queue.stores import QueueStore

#: The idempotency key of a resend: the original's id and how many resends it had.
RESEND_KEY = "resend:{item_id}:{n}"


class ArchiveService:
    """The archive's side of ``QueueService`` (a base class of it): reading an archived
    message and resending it, over the service's store, settings, clock and tasks."""

    clock: Callable[[], datetime]

    @property
    def store(self) -> QueueStore:
        raise NotImplementedError

    @property
    def settings(self) -> QueueSettings:
        raise NotImplementedError

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
        raise NotImplementedError

    def _send_tasks_for(self, items: Sequence[QueueItem], store: QueueStore) -> None:
        raise NotImplementedError

    def archived(self, id: str) -> ArchivedMessage | None:
        """Return the archived message of item ``id``, or ``None`` (not archived, deleted)."""
        try:
            item_id = uuid.UUID(str(id))
        except ValueError:
            return None
        return ArchivedMessage.objects.using(self.settings.database).filter(item_id=item_id).first()

    def resends_of(self, id: str) -> list[ResentMessage]:
        """Return the resends of item ``id``, the latest first."""
        try:
            item_id = uuid.UUID(str(id))
        except ValueError:
            return []
        return list(ResentMessage.objects.using(self.settings.database).filter(resent_from=item_id))

    def next_resend(self, archived: ArchivedMessage) -> int:
        """Return which resend of ``archived`` the next one is: 1 for the first."""
        return ResentMessage.objects.using(self.settings.database).filter(resent_from=archived.item_id).count() + 1

    def resend(
        self, id: str, *, recipients: Sequence[str] | None = None, by: str = "", nth: int | None = None
    ) -> QueueItem:
        """Queue the archived message of item ``id`` again, with a new ``Message-ID``;
        return the new item.

        ``recipients``: some of the original's envelope recipients (all when ``None``).
        ``by``: who resends, for the record. ``nth``: which resend of the original this
        is, as counted when the person asked (the admin's confirmation page): the same
        ``nth`` twice is one item while the first is queued, so a form posted twice
        resends once. By default, the next one.
        Raises ``QueueError(NOT_KEPT)`` when the archive no longer keeps the whole
        message (never archived, its body dropped, or deleted), and
        ``QueueError(INVALID)`` for a recipient the original did not have.
        """
        _check_nth(nth)
        archived = self.archived(id)
        if archived is None:
            raise QueueError(
                ErrorCode.NOT_KEPT,
                f"The archive keeps no message of item {id}: it was never archived (ARCHIVE), or was deleted "
                "after REDACT_AFTER.",
                item_id=str(id),
            )
        if archived.data is None:
            raise QueueError(
                ErrorCode.NOT_KEPT,
                f"The archive keeps only the header section of item {id} since "
                f"{archived.body_until:%Y-%m-%d %H:%M %Z} (ARCHIVE): its message can no longer be resent.",
                item_id=str(id),
            )
        database = self.settings.database
        new = self.prepare(
            mime.with_new_message_id(bytes(archived.data), hostname=self.settings.hostname),
            sender=archived.sender,
            recipients=_chosen(archived, recipients),
            key=RESEND_KEY.format(item_id=archived.item_id, n=nth or self.next_resend(archived)),
            priority=archived.priority,
            channel=archived.channel,
        )
        link = ResentMessage(item_id=uuid.UUID(new.id), resent_from=archived.item_id, resent_at=self.clock(), by=by)
        link.save(using=database, force_insert=True)
        # As any enqueue: through the staging firewall, whose split keeps this id for
        # the allowed recipients (or for all, held or redirected, when none is).
        store, screened = self.store, screen([new], self.settings.firewall)
        added = store.add_many(screened.items, max_items=self.settings.max_items)
        own = screened.given(added)[0]
        if own.id != new.id:  # the same resend asked twice: its first item stands
            ResentMessage.objects.using(database).filter(item_id=link.item_id).delete()
        else:
            self._send_tasks_for(added, store)
        return own


def _check_nth(nth: int | None) -> None:
    if nth is not None and (isinstance(nth, bool) or not isinstance(nth, int) or nth < 1):
        raise QueueError(ErrorCode.INVALID, f"'nth' must be a whole number, 1 or more; got {nth!r}.")


def _chosen(archived: ArchivedMessage, asked: Sequence[str] | None) -> list[str]:
    """The recipients of a resend: ``asked`` (each one of the original's), else all."""
    original = [address for address in archived.recipients.splitlines() if address]
    if asked is None:
        return original
    if isinstance(asked, str):
        asked = [asked]
    known = {ascii_lower(address): address for address in original}
    unknown = [address for address in asked if ascii_lower(address.strip()) not in known]
    if unknown or not asked:
        raise QueueError(
            ErrorCode.INVALID,
            f"A resend goes to recipients of the original only; it had {', '.join(original)}, "
            f"not {', '.join(unknown) or 'no one'}.",
            item_id=str(archived.item_id),
        )
    return list(dict.fromkeys(known[ascii_lower(address.strip())] for address in asked))
