"""One-click unsubscribe (RFC 8058): what a token posted to the view changes.

The token (``list_unsubscribe``) names a channel and an address; unsubscribing puts
the address on the suppression list for that channel's scope alone
(``channel_scope()``), reason ``unsubscribed``, for the channel's ``DURATION`` (ten
years unless set), and sends the ``unsubscribed`` signal, for the site's own list.

It is idempotent: an address already unsubscribed from the channel (an entry of that
scope and reason, in force) is left as it is, and no signal is sent again, so a
provider that posts twice, or a person who clicks twice, changes nothing more.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Final

from bumail_queue import signals
from bumail_queue.conf import DEFAULT_UNSUBSCRIBE_DURATION
from bumail_queue.items import Reply
from bumail_queue.list_unsubscribe import Unsubscribing, read_token
from bumail_queue.service import QueueService, queue
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason, channel_scope

SOURCE: Final = "one-click"
"""The ``source`` of the ``unsubscribed`` signals sent here."""

UNSUBSCRIBED_REPLY: Final = Reply(code=None, status="", text="Unsubscribed with one click (RFC 8058)")
"""The reply kept with an entry written here (the admin and ``queue_suppression`` show it)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Unsubscribed:
    """What unsubscribing did: the channel and address its token named, and whether it
    wrote an entry (``False``: the address was unsubscribed from the channel already)."""

    channel: str
    address: str
    written: bool


def unsubscribe(token: str, *, service: QueueService | None = None) -> Unsubscribed | None:
    """Unsubscribe the address ``token`` names from its channel; ``None`` (and nothing
    written) when the token is not one of ours.

    Raises ``QueueError`` when the store cannot be used (nothing was written then).
    """
    named = read_token(token)
    if named is None:
        return None
    return apply(named, service=service or queue)


def apply(named: Unsubscribing, *, service: QueueService) -> Unsubscribed:
    """Put ``named.address`` on the list for ``named.channel``'s scope, unless it is
    there for an unsubscribe already; then send ``unsubscribed``."""
    now = service.clock()
    scope = channel_scope(named.channel)
    store = service.store
    entries = store.suppression_entries([named.address], now=now, scopes=[scope]).get(named.address, [])
    if any(e.scope == scope and e.reason == SuppressionReason.UNSUBSCRIBED for e in entries):
        return Unsubscribed(channel=named.channel, address=named.address, written=False)
    entry = Suppression(
        address=named.address,
        reason=SuppressionReason.UNSUBSCRIBED,
        reply=UNSUBSCRIBED_REPLY,
        created_at=now,
        expires_at=now + _duration(named.channel, service),
        scope=scope,
    )
    store.update_suppressions(SuppressionChange(add=(entry,)), now=now)
    signals.send(signals.unsubscribed, item_id=None, recipient=named.address, source=SOURCE, channel=named.channel)
    return Unsubscribed(channel=named.channel, address=named.address, written=True)


def _duration(channel: str, service: QueueService) -> timedelta:
    # A channel taken out of UNSUBSCRIBE since its mail went: its links still work.
    found = service.settings.unsubscribe.get(channel)
    return DEFAULT_UNSUBSCRIBE_DURATION if found is None else found.duration
