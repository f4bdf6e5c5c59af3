"""What the delivery layer passes between its parts, and what the worker asks of it.

The values: an ``Envelope`` to send, the ``Host``s to send it to (``Destinations``,
found by a ``Resolver``), and the ``Delivery`` a ``Transport`` returns; ``Follow``,
which a ``FollowingTransport`` calls for the next envelope of a session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Protocol

from bumail_queue.conf import Route
from bumail_queue.errors import QueueConfigurationError
from bumail_queue.items import Outcome, RecipientStatus, Reply
from bumail_queue.sts import TLSResult


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Envelope:
    """One SMTP transaction's worth of mail: a sender, some recipients, the message."""

    item_id: str
    sender: str  # "" is the null sender <>
    recipients: tuple[str, ...]
    message: bytes


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    """A server to connect to: its name (for TLS and logs), an address if known, a port.

    ``address`` is set when the resolver found it (an MX host's A/AAAA record);
    ``None`` means connect by ``name`` through the system's resolver (a smarthost).
    """

    name: str
    port: int
    address: str | None = None

    def __str__(self) -> str:
        where = self.address or self.name
        return (
            f"{self.name}[{where}]:{self.port}"
            if self.address and self.address != self.name
            else f"{where}:{self.port}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TLSSession:
    """How the TLS of one session opened under an MTA-STS policy ended (RFC 8460).

    ``failure`` is ``None`` when STARTTLS gave a certificate valid for ``host``;
    otherwise the result type, and ``reason`` says what was wrong.
    """

    host: str
    address: str | None
    failure: TLSResult | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    """What delivering one envelope decided: an outcome for every one of its recipients.

    ``remote_host`` names the server that gave the deciding replies (``None`` when no
    server answered: DNS, every host unreachable). ``tls`` says whether that server's
    session ran over TLS (STARTTLS or implicit), for the delivery log.
    ``option_error`` is set when the route's options were refused and its recipients
    deferred ``4.3.5``: the configuration is to fix, and the caller reports it.
    ``tls_sessions`` says how the TLS of each session opened under the route's
    MTA-STS policy ended, for the TLS reports (none without a policy).
    Through an email backend, ``message_ids`` holds the ESP's message id of each
    recipient it gave one to, and ``retry_after`` how long the ESP asked to be left
    alone (``Retry-After``): the next attempt is no sooner. ``unreached`` says that no
    server or API could have taken the message (a refused or failed connection, a
    DNS failure, an API that answered 5xx): a route's ``FALLBACK`` may take it, and
    nothing can be sent twice.
    """

    outcomes: Mapping[str, Outcome]
    remote_host: str | None = None
    tls: bool = False
    option_error: QueueConfigurationError | None = None
    tls_sessions: tuple[TLSSession, ...] = ()
    message_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)
    retry_after: timedelta | None = None
    unreached: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Destinations:
    """The hosts to try for one domain, in order, or why its recipients get no session.

    Exactly one of the two is meaningful: ``hosts`` is empty when ``failure`` is set.
    ``failure`` is the outcome every recipient of the domain gets (``failed`` or
    ``deferred``, with ``Reply.code`` ``None``: no server answered).
    """

    hosts: tuple[Host, ...]
    failure: Outcome | None

    @classmethod
    def failed(cls, status: str, text: str) -> Destinations:
        """Return destinations whose recipients fail for good with ``status``."""
        return cls(
            hosts=(), failure=Outcome(status=RecipientStatus.FAILED, reply=Reply(code=None, status=status, text=text))
        )

    @classmethod
    def deferred(cls, text: str) -> Destinations:
        """Return destinations whose recipients are tried again later (``4.4.3``)."""
        return cls(
            hosts=(),
            failure=Outcome(status=RecipientStatus.DEFERRED, reply=Reply(code=None, status="4.4.3", text=text)),
        )


class Resolver(Protocol):
    """Finds the hosts that receive a domain's mail (``delivery.dns.MXResolver``)."""

    def destinations(self, domain: str) -> Destinations: ...


class Transport(Protocol):
    """Delivers one envelope to the first host of ``hosts`` that takes it.

    ``reuse=False`` ends the session with its transaction instead of keeping the
    connection for the next: the worker asks it for a destination whose sessions
    ``SHAPING`` counts, so that no idle connection outlives its slot.
    """

    def deliver(self, envelope: Envelope, *, route: Route, hosts: Sequence[Host], reuse: bool = True) -> Delivery: ...

    def close_idle(self) -> None: ...

    def close(self) -> None: ...


Follow = Callable[[], "Envelope | None"]
"""Asked by a transport as an envelope's last message is about to end on a session it
keeps: the next envelope for the same route and hosts, or ``None``."""


class FollowingTransport(Transport, Protocol):
    """A transport that can begin the next envelope's transaction with the last one's
    final dot (``SMTPTransport``): the envelope ``follow`` returns must be the next one
    the calling thread delivers, with the same route and hosts."""

    def deliver(
        self,
        envelope: Envelope,
        *,
        route: Route,
        hosts: Sequence[Host],
        reuse: bool = True,
        follow: Follow | None = None,
    ) -> Delivery: ...
