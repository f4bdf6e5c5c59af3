"""One attempt of one item: its recipients grouped by destination, each destination's
route and hosts (DNS, MTA-STS), shaping's room, the session, and what it decided."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bumail_queue.delivery.dsn import header_block
from bumail_queue.delivery.envelope import (
    Delivery,
    Envelope,
    Follow,
    Host,
    TLSSession,
)
from bumail_queue.delivery.routes import Destination, group_by_destination
from bumail_queue.items import AttemptResult, Outcome, QueueItem, RecipientStatus
from bumail_queue.outcomes import (
    Attempt,
    close_broken_connections,
    decide_attempt,
    report_error,
)
from bumail_queue.shaper import Held
from bumail_queue.suppression import suppressed_reply

from .followers import Followers
from .sessions import LOST_MESSAGE_REPLY, Follower, Handoff, Path

if TYPE_CHECKING:
    from bumail_queue.delivery.mta_sts import AppliedPolicy

logger = logging.getLogger("bumail_queue.worker")


class Attempts(Followers):
    """Tries every pending recipient of an item once."""

    def attempt(self, item: QueueItem) -> Attempt | None:
        """Try every pending recipient of ``item`` once; ``None`` if the item is gone.

        Those the claim found on the suppression list fail at once, untried.
        """
        return self._attempt(item)

    def _attempt(
        self, item: QueueItem, *, follower: Follower | None = None, handoff: Handoff | None = None
    ) -> Attempt | None:
        """``attempt()``; a ``follower`` goes on the session its predecessor left it, and
        the item that takes over this one's session, if one does, is put in ``handoff``."""
        with self._changed:
            prefetched = self._prefetched.pop(item.id, None)
            suppressed = self._suppressed.pop(item.id, {})
        message = follower.message if follower is not None else prefetched
        if message is None:
            close_broken_connections()  # the only database use of a delivery thread
            message = self.store.read_message(item.id)
        if message is None:
            if self.store.get(item.id) is None:
                return None  # cancelled, or finished by another worker: not ours to tell
            lost = {
                r.address: Outcome(status=RecipientStatus.FAILED, reply=LOST_MESSAGE_REPLY)
                for r in item.pending_recipients
            }
            return self._attempt_from(item, lost, dict.fromkeys(lost), message=None)
        # A suppressed recipient fails at once, with no session: its reply says until when.
        outcomes = {
            address: Outcome(status=RecipientStatus.FAILED, reply=suppressed_reply(entry))
            for address, entry in suppressed.items()
        }
        remote_hosts: dict[str, str | None] = dict.fromkeys(suppressed)
        tls: dict[str, bool] = {}
        held: list[Held] = []
        not_before: datetime | None = None
        message_ids: dict[str, str] = {}
        pending = [r.address for r in item.pending_recipients if r.address not in suppressed]
        sends = list(self._sends(item, pending, message, path=follower.path if follower is not None else None))
        for index, (destination, envelope, path) in enumerate(sends):
            delivery = (
                path
                if isinstance(path, Delivery)
                else self._deliver_to(
                    destination,
                    envelope,
                    path=path,
                    # Only the last transaction's session may pass to a follower.
                    handoff=handoff if index == len(sends) - 1 else None,
                )
            )
            if isinstance(delivery, Held):
                held.append(delivery)  # its recipients keep their state, not attempted
                continue
            for address in envelope.recipients:
                outcomes[address] = delivery.outcomes[address]
                remote_hosts[address] = delivery.remote_host
                tls[address] = delivery.tls
            message_ids.update(delivery.message_ids)
            if delivery.retry_after is not None:
                asked = self.clock() + delivery.retry_after
                not_before = asked if not_before is None else max(not_before, asked)
        if held:
            return self._held_attempt(
                item, outcomes, remote_hosts, held, message=message, tls=tls, suppressed=frozenset(suppressed)
            )
        # The message is handed on: the DSNs return its header block, and recording
        # the last pending recipient drops it from the store.
        return self._attempt_from(
            item,
            outcomes,
            remote_hosts,
            message=message,
            tls=tls,
            suppressed=frozenset(suppressed),
            not_before=not_before,
            message_ids=message_ids,
        )

    def _sends(
        self, item: QueueItem, pending: Sequence[str], message: bytes, *, path: Path | None
    ) -> Iterator[tuple[Destination, Envelope, Path | Delivery | None]]:
        """The transactions of an attempt: one per destination, each with its path if
        known (``None``: looked up when it is sent).

        With ``RETURN_PATH`` (VERP), a recipient of an SMTP route gets a transaction of
        its own, from an envelope sender naming it; with ``UNSUBSCRIBE`` for the item's
        channel, a recipient of any route gets one, its message starting with its own
        ``List-Unsubscribe``. The destination's route and hosts are looked up once for
        all of them, and a lookup that decides them (a DNS failure) stands for each.
        """
        one_click = self._one_click(item)
        for destination, addresses in group_by_destination(pending, self.settings, item.channel).items():
            whole = Envelope(item_id=item.id, sender=item.sender, recipients=tuple(addresses), message=message)
            senders = self._verp_senders(item, destination, addresses)
            if senders is None and one_click is None:
                yield destination, whole, path
                continue
            found = path if path is not None else self._path_to(destination, whole)
            if isinstance(found, Delivery):
                yield destination, whole, found
                continue
            for address in addresses:
                sender = item.sender if senders is None else senders[address]
                one = Envelope(
                    item_id=item.id,
                    sender=sender,
                    recipients=(address,),
                    message=self._message_to(item, address, message, one_click),
                )
                yield destination, one, found

    def _held_attempt(
        self,
        item: QueueItem,
        outcomes: dict[str, Outcome],
        remote_hosts: dict[str, str | None],
        held: list[Held],
        *,
        message: bytes,
        tls: dict[str, bool],
        suppressed: frozenset[str],
    ) -> Attempt:
        """An attempt some of whose destinations shaping held back: the item is due again
        when the first of them has room (or sooner, for its retry); held alone, it goes
        back with no attempt counted and no signal."""
        until = min(h.until for h in held)
        with self._changed:
            self._held_due = until if self._held_due is None else min(self._held_due, until)
        for h in held:
            logger.debug(
                "held item=%s destination=%s reason=%s until=%s",
                item.id, h.key, h.reason, until.isoformat(),
                extra={"action": "held", "item_id": item.id},
            )  # fmt: skip
        if not outcomes:
            result = AttemptResult(outcomes={}, next_attempt_at=until, count_attempt=False)
            return Attempt(item=item, result=result, remote_hosts={}, headers=header_block(message), held=True)
        attempt = self._attempt_from(item, outcomes, remote_hosts, message=message, tls=tls, suppressed=suppressed)
        # Due when the held destination has room, or sooner when a recipient deferred
        # elsewhere is due again first.
        deferred = any(o.status == RecipientStatus.DEFERRED for o in attempt.result.outcomes.values())
        next_at = min(attempt.result.next_attempt_at, until) if deferred else until
        attempt.result = dataclasses.replace(attempt.result, next_attempt_at=next_at)
        return attempt

    def _deliver_to(
        self,
        destination: Destination,
        envelope: Envelope,
        *,
        path: Path | None = None,
        handoff: Handoff | None = None,
    ) -> Delivery | Held:
        """Deliver ``envelope`` to ``destination`` (``Held`` when shaping has no room for
        it). ``path``: a follower's, its predecessor's, looked up a moment ago. ``handoff``:
        where the item that takes over the session goes, if one may."""
        if path is None:
            found = self._path_to(destination, envelope)
            if isinstance(found, Delivery):
                return found
            path = found
        shape = None if self.shaper is None else self.shaper.shape(destination, path.hosts)
        if shape is None:
            follow = None if handoff is None else functools.partial(self._take_follower, destination, path, handoff)
            return self._send(envelope, path, follow=follow)
        # Shaped: no follower. It would go out without a permit of its own (RATE counts
        # every session, SUSPEND stops them), and a counted session ends with its slot.
        assert self.shaper is not None
        entry = self.shaper.enter(shape, recipients=len(envelope.recipients))
        if isinstance(entry, Held):
            return entry
        delivery = None
        try:
            # A counted session keeps no idle connection: it ends with its slot.
            delivery = self._send(envelope, path, reuse=not shape.limits.uses_slots)
            return delivery
        finally:
            self.shaper.leave(entry, delivery)

    def _path_to(self, destination: Destination, envelope: Envelope) -> Path | Delivery:
        """Return the route and hosts of ``destination`` under its MTA-STS policy, or the
        ``Delivery`` that decides ``envelope`` without a session (DNS, no allowed host)."""
        route = destination.route
        hosts: Sequence[Host]
        if route.type == "backend":
            return Path(route=route, hosts=(), policy=None)  # the backend finds its own way
        if route.type == "smarthost":
            assert route.host is not None and route.port is not None
            hosts = [Host(name=route.host, port=route.port)]
        else:
            assert destination.domain is not None
            found = self.resolver.destinations(destination.domain)
            if found.failure is not None:
                return Delivery(outcomes=dict.fromkeys(envelope.recipients, found.failure), remote_host=None)
            hosts = found.hosts
        policy = self.mta_sts.policy_for(destination.domain) if destination.domain and self.mta_sts else None
        if policy is not None:
            route, allowed = policy.route(route), policy.hosts(hosts)
            if not allowed:  # enforce, and no MX host matches: 4.7.5, no session
                self._count_tls(policy, (), excluded=hosts)
                return Delivery(outcomes=dict.fromkeys(envelope.recipients, policy.refusal(hosts)), remote_host=None)
            hosts = allowed
        return Path(route=route, hosts=tuple(hosts), policy=policy)

    def _send(self, envelope: Envelope, path: Path, *, reuse: bool = True, follow: Follow | None = None) -> Delivery:
        delivery = self._send_by(envelope, path, reuse=reuse, follow=follow)
        fallback = path.route.fallback
        if fallback is None or not delivery.unreached:
            return delivery
        if any(o.status is not RecipientStatus.DEFERRED for o in delivery.outcomes.values()):
            return delivery  # something was decided: the route was reached after all
        # Nothing could have taken the message: the fallback cannot send it twice.
        logger.info(
            "fallback item=%s from=%s to=%s",
            envelope.item_id, path.route.label, fallback.label,
            extra={"action": "fallback", "item_id": envelope.item_id},
        )  # fmt: skip
        hosts: tuple[Host, ...] = ()
        if fallback.type == "smarthost":
            assert fallback.host is not None and fallback.port is not None  # a smarthost's, checked
            hosts = (Host(name=fallback.host, port=fallback.port),)
        return self._send_by(envelope, Path(route=fallback, hosts=hosts, policy=None), reuse=reuse)

    def _send_by(self, envelope: Envelope, path: Path, *, reuse: bool = True, follow: Follow | None = None) -> Delivery:
        route, hosts = path.route, path.hosts
        if route.type == "backend":
            return self.backends.deliver(envelope, route=route, reuse=reuse)
        if not reuse:
            delivery = self.transport.deliver(envelope, route=route, hosts=hosts, reuse=False)
        elif follow is not None and (following := self._following()) is not None:
            delivery = following.deliver(envelope, route=route, hosts=hosts, follow=follow)
        else:
            delivery = self.transport.deliver(envelope, route=route, hosts=hosts)
        if delivery.option_error is not None:
            # The route's options were refused (4.3.5): the configuration is to fix.
            report_error(delivery.option_error, envelope.item_id)
        if path.policy is not None:
            # A follower's session was opened, and counted, by its predecessor's delivery.
            self._count_tls(path.policy, delivery.tls_sessions)
        return delivery

    def _count_tls(
        self, policy: AppliedPolicy, sessions: Sequence[TLSSession], *, excluded: Sequence[Host] = ()
    ) -> None:
        """Count the sessions of a delivery under ``policy`` for the day's TLS report (RFC 8460)."""
        day = self.clock().astimezone(UTC).date()
        self.tls_reports.add(policy.counts(day, sessions, excluded=excluded))

    def _attempt_from(
        self,
        item: QueueItem,
        outcomes: dict[str, Outcome],
        remote_hosts: dict[str, str | None],
        *,
        message: bytes | None,
        tls: dict[str, bool] | None = None,
        suppressed: frozenset[str] = frozenset(),
        not_before: datetime | None = None,
        message_ids: Mapping[str, str] | None = None,
    ) -> Attempt:
        return decide_attempt(
            item,
            outcomes,
            remote_hosts,
            message=message,
            settings=self.settings,
            now=self.clock(),
            rng=self.rng,
            tls=tls,
            suppressed=suppressed,
            not_before=not_before,
            message_ids=message_ids,
        )
