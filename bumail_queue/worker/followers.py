"""Pipelining across messages (RFC 2920): the next waiting item for a destination starts
on the session of the one whose final dot is about to go."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import cast

from bumail_queue import list_unsubscribe, verp
from bumail_queue.conf import ChannelUnsubscribe
from bumail_queue.delivery.envelope import (
    Envelope,
    FollowingTransport,
)
from bumail_queue.delivery.routes import Destination, group_by_destination
from bumail_queue.items import QueueItem

from .base import WorkerBase
from .sessions import SLOW_SESSION_MESSAGE_LIMIT, Follower, Handoff, Path, Session, takes_follow

logger = logging.getLogger("bumail_queue.worker")


class Followers(WorkerBase):
    """Hands a delivery thread the follower of its message, on the same session."""

    def _take_follower(self, destination: Destination, path: Path, handoff: Handoff) -> Envelope | None:
        """Start the next waiting item for ``destination`` on the session of the one
        whose final dot is about to go, and return its envelope; ``None`` if none waits.

        Called by the transport from a delivery thread. The follower takes over its
        predecessor's session and its ``DOMAIN_CONCURRENCY`` slot: the destination gets
        no more sessions than before, and its next message costs one round trip. Only
        an item whose every recipient goes to ``destination`` (but those the claim found
        suppressed, which fail without a session), and whose message was read with its
        claim, follows: the thread then goes straight to the session, on ``path``.
        """
        key = destination.limit_key
        with self._changed:
            if self.stopping or handoff.follower is not None or self._recording_behind():
                return None
            for index, (item, keys) in enumerate(self._waiting):
                if keys != {key} or (message := self._prefetched.get(item.id)) is None:
                    continue
                suppressed = self._suppressed.get(item.id, {})
                addresses = [r.address for r in item.pending_recipients if r.address not in suppressed]
                if list(group_by_destination(addresses, self.settings, item.channel)) != [destination]:
                    continue  # the same smarthost host and port, another route (user, TLS)
                senders = self._verp_senders(item, destination, addresses)
                one_click = self._one_click(item)
                if (senders is not None or one_click is not None) and len(addresses) != 1:
                    continue  # VERP, UNSUBSCRIBE: a transaction a recipient, of which only the first could follow
                del self._waiting[index]
                del self._prefetched[item.id]
                self._in_flight[item.id] = item
                self._sessions[item.id] = Session(
                    started=time.monotonic(), may_turn_slow=item.size <= SLOW_SESSION_MESSAGE_LIMIT
                )
                handoff.follower = Follower(item=item, keys=keys, path=path, message=message)
                self._wake_loop_if_needed()  # a follower leaves fewer waiting: claim again in time
                sender = item.sender if senders is None else senders[addresses[0]]
                sent = self._message_to(item, addresses[0], message, one_click)  # as _sends() makes it
                return Envelope(item_id=item.id, sender=sender, recipients=tuple(addresses), message=sent)
        return None

    def _verp_senders(
        self, item: QueueItem, destination: Destination, addresses: Sequence[str]
    ) -> dict[str, str] | None:
        """Each recipient's VERP envelope sender (``RETURN_PATH``), or ``None`` when the
        item keeps its own: no ``RETURN_PATH``, a DSN (the null sender), or a backend
        route (an ESP reports bounces by its events, and most take no envelope sender)."""
        template = self.settings.return_path
        if template is None or item.sender in ("", "<>") or destination.route.type == "backend":
            return None
        senders = {address: verp.return_path(template, item.id, address) for address in addresses}
        if any(sender is None for sender in senders.values()):
            return None  # an item id that is no UUID: the token would not fit
        return cast(dict[str, str], senders)

    def _one_click(self, item: QueueItem) -> ChannelUnsubscribe | None:
        """The ``UNSUBSCRIBE`` entry of ``item``'s channel, when each recipient's message
        gets its own ``List-Unsubscribe``; ``None`` for another channel, and for a DSN
        (the null sender's, which goes in the channel of the mail it reports on)."""
        if item.sender in ("", "<>"):
            return None
        return self.settings.unsubscribe.get(item.channel)

    @staticmethod
    def _message_to(item: QueueItem, address: str, message: bytes, one_click: ChannelUnsubscribe | None) -> bytes:
        """``message`` as it goes to ``address``: with its one-click ``List-Unsubscribe``
        and ``List-Unsubscribe-Post`` first (signed by DKIM with the rest, on the wire)."""
        if one_click is None:
            return message
        return list_unsubscribe.with_fields(message, list_unsubscribe.url_of(one_click.url, item.channel, address))

    def _following(self) -> FollowingTransport | None:
        """``transport``, if it can begin the next item's transaction with a message's
        final dot (asked of each transport once: a caller may replace it)."""
        transport = self.transport
        if self._follows is None or self._follows[0] is not transport:
            self._follows = (transport, takes_follow(transport))
        return cast(FollowingTransport, transport) if self._follows[1] else None
