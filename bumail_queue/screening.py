"""The staging firewall at work: what an enqueue adds for mail to recipients that
``ALLOW_RECIPIENTS`` does not allow, and how the admin tells those items apart.

An item whose recipients are all allowed is added as it is. Otherwise it is split: the
allowed recipients keep the item (its id, its idempotency key, its message unchanged),
and the others get an item of their own with the same message, either held (its next
attempt at ``HELD_AT``, so that no worker claims it until an operator releases it) or,
with ``REDIRECT_TO``, addressed to ``REDIRECT_TO`` alone, its message telling whom it
was meant for in an ``X-Bumail-Original-Recipients`` field. The allowed recipients
never see that field: it could name a ``Bcc`` recipient.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _

from .firewall import Firewall, original_recipients, with_original_recipients
from .items import NewItem, QueueItem
from .queries import HELD_AT, is_held

if TYPE_CHECKING:
    from .stores import QueueStore

logger = logging.getLogger(__name__)

HELD_LABEL = _("held by the staging firewall")
REDIRECTED_LABEL = _("redirected by the staging firewall")


@dataclasses.dataclass(frozen=True, slots=True)
class Screened:
    """The items to add for the items an enqueue was given, and which is each one's own:
    the item of its allowed recipients, or its only item when it had none."""

    items: tuple[NewItem, ...]
    owns: tuple[int, ...]  # for each item given, the index in ``items`` of its own

    def add_to(self, store: QueueStore, max_items: int | None) -> list[QueueItem]:
        """Add ``items`` to ``store`` in one ``add_many`` (all or none); return them as added."""
        return store.add_many(self.items, max_items=max_items)

    def given(self, added: Sequence[QueueItem]) -> list[QueueItem]:
        """Return, of the store's answer to adding ``items``, each given item's own."""
        return [added[index] for index in self.owns]

    def before_adding(self) -> list[QueueItem]:
        """Return each given item's own as the store will hold it once added."""
        return [self.items[index].to_queue_item() for index in self.owns]


def screen(items: Sequence[NewItem], firewall: Firewall | None) -> Screened:
    """Return what to add for ``items`` under ``firewall`` (``None``: every item as it is)."""
    if firewall is None:
        return Screened(items=tuple(items), owns=tuple(range(len(items))))
    added: list[NewItem] = []
    owns: list[int] = []
    for item in items:
        owns.append(len(added))
        added += screen_item(item, firewall)
    return Screened(items=tuple(added), owns=tuple(owns))


def screen_item(item: NewItem, firewall: Firewall) -> list[NewItem]:
    """Return the items that queue ``item`` under ``firewall``, its own first."""
    allowed, stopped = firewall.split(item.recipients)
    if not stopped:
        return [item]
    own = [dataclasses.replace(item, recipients=allowed)] if allowed else []
    stopped_item = dataclasses.replace(
        item,
        # The item of the allowed recipients keeps the id and the key; a key of its own
        # makes a repeated enqueue find this item too.
        id=str(uuid.uuid4()) if own else item.id,
        key=_stopped_key(item.key) if own else item.key,
    )
    if firewall.redirect_to is None:
        stopped_item = dataclasses.replace(stopped_item, recipients=stopped, next_attempt_at=HELD_AT)
        action = "held"
    else:
        stopped_item = dataclasses.replace(
            stopped_item,
            recipients=[firewall.redirect_to],
            message=with_original_recipients(bytes(item.message), stopped),
        )
        action = "redirected"
    logger.info(
        "the staging firewall %s %d of the recipients of a message, queued as item %s",
        action,
        len(stopped),
        stopped_item.id,
        extra={"action": f"firewall_{action}", "item_id": stopped_item.id},
    )
    return [*own, stopped_item]


def _stopped_key(key: str | None) -> str | None:
    """The idempotency key of the item of an item's stopped recipients: derived from
    the item's own, whatever its length (keys have at most 255 characters)."""
    if key is None:
        return None
    return "firewall:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class FirewallMark:
    """What the admin shows of an item the staging firewall held or redirected: the
    label, and the recipients it stopped (for a redirected item, as its field names them)."""

    label: str
    addresses: tuple[str, ...]

    @property
    def addresses_text(self) -> str:
        return ", ".join(self.addresses)


def firewall_mark(item: QueueItem, head: bytes | None, firewall: Firewall | None) -> FirewallMark | None:
    """Return how the staging firewall stopped ``item``, or ``None`` if it did not.

    ``head`` is the item's message, or its first bytes (the field is at the top of a
    redirected message). A held item with a recipient ``firewall`` does not allow is
    held by it: releasing it sends mail outside the firewall.
    """
    originals = None if head is None else original_recipients(head)
    if originals is not None:
        return FirewallMark(label=str(REDIRECTED_LABEL), addresses=tuple(originals))
    if firewall is None or not is_held(item.next_attempt_at):
        return None
    stopped = tuple(r.address for r in item.pending_recipients if not firewall.allows(r.address))
    return FirewallMark(label=str(HELD_LABEL), addresses=stopped) if stopped else None
