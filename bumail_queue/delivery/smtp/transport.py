"""The SMTP transport: an envelope delivered to the first host that takes the session."""

from __future__ import annotations

import dataclasses
import logging
import smtplib
import ssl
import time
from collections.abc import Callable, Iterable, Sequence

from bumail_queue.addresses import mailbox_problem
from bumail_queue.conf import Route, Timeouts
from bumail_queue.delivery.dkim import Signatures
from bumail_queue.delivery.envelope import Delivery, Envelope, Host, TLSSession
from bumail_queue.items import Outcome, RecipientStatus

from .connection import _Steps
from .failures import RouteOptionError, _lost, _RouteRefusedError, _StaleConnectionError, _StepError
from .handshake import _Opener
from .pool import _Key, _Pool, _Session
from .replies import _own, _raw
from .tls import _Contexts, _Policy, _policy_of
from .transactions import _Message, _Transactions
from .unreachable import _UnreachableHosts

# The package's logger: the name docs/delivery.md and docs/worker.md give.
logger = logging.getLogger(__package__)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SMTPDelivery(Delivery):
    """A :class:`Delivery`, and the route's option smtplib refused, if it did.

    ``option_error`` is set when recipients were deferred ``4.3.5`` because of the
    route: the configuration is to fix, and the caller reports it.
    """

    option_error: RouteOptionError | None = None


class SMTPTransport:
    """Delivers envelopes over SMTP, keeping connections for reuse (``docs/delivery.md``).

    ``hostname`` is said in EHLO/HELO; ``timeouts`` bound each step and the session;
    ``reuse_seconds`` is how long an idle connection is kept (0: none is);
    ``mx_session_limit`` is how many MX hosts that greeted and failed temporarily are
    tried per envelope (Postfix's ``smtp_mx_session_limit``);
    ``unreachable_memory_seconds`` is how long a host that did not answer is not
    connected to again (RFC 5321 §4.5.4.1; 0: it is tried every time);
    ``dkim`` signs each message as it goes on the wire (``None``: no signing).
    ``ssl_context`` verifies the certificates of smarthosts and of MX hosts under an
    MTA-STS policy (when ``None``, one trusting ``ca_file``, ``TLS_CA_FILE``, or the
    system's trusted certificates without it); ``clock`` gives the time in seconds,
    for the session's deadline, the connections' idle time and how long a host is
    remembered.
    """

    def __init__(
        self,
        *,
        hostname: str,
        timeouts: Timeouts,
        reuse_seconds: float,
        mx_session_limit: int = 2,
        unreachable_memory_seconds: float = 300.0,
        dkim: Signatures | None = None,
        ssl_context: ssl.SSLContext | None = None,
        ca_file: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._hostname = hostname
        self._timeouts = timeouts
        self._mx_session_limit = mx_session_limit
        self._clock = clock
        self._steps = _Steps(timeouts, clock)
        self._pool = _Pool(reuse_seconds=reuse_seconds, steps=self._steps, clock=clock)
        self._opener = _Opener(
            hostname=hostname, steps=self._steps, contexts=_Contexts(ssl_context, ca_file=ca_file), clock=clock
        )
        self._transactions = _Transactions(self._steps, dkim)
        self._unreachable = _UnreachableHosts(seconds=unreachable_memory_seconds, clock=clock)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} hostname={self._hostname!r} pooled={self.pooled_count()}>"

    # -- the public API -------------------------------------------------------------

    def deliver(self, envelope: Envelope, *, route: Route, hosts: Sequence[Host], reuse: bool = True) -> SMTPDelivery:
        """Deliver ``envelope`` to the first of ``hosts`` that takes the session.

        Returns an outcome for every recipient of the envelope; raises nothing for
        what servers, the network or the route did. ``reuse=False``: the session
        ends (QUIT) with the transaction, its connection not kept for the next.
        """
        deadline = self._clock() + self._timeouts.session
        recipients = list(dict.fromkeys(envelope.recipients))
        outcomes: dict[str, Outcome] = {}
        tls_sessions: list[TLSSession] = []

        def finish(
            remote_host: str | None = None, option_error: RouteOptionError | None = None, *, tls: bool = False
        ) -> SMTPDelivery:
            return SMTPDelivery(
                outcomes={r: outcomes[r] for r in recipients},
                remote_host=remote_host,
                tls=tls,
                option_error=option_error,
                tls_sessions=tuple(tls_sessions),
            )

        problem = mailbox_problem(envelope.sender) if envelope.sender else None
        if problem:
            reply = _own("5.1.7", f"The sender address cannot be sent: {problem}.")
            outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in recipients)
            return finish()
        pending: list[str] = []
        for recipient in recipients:
            problem = mailbox_problem(recipient)
            if problem:
                reply = _own("5.1.3", f"The recipient address cannot be sent: {problem}.")
                outcomes[recipient] = Outcome(status=RecipientStatus.FAILED, reply=reply)
            else:
                pending.append(recipient)
        if not pending:
            return finish()

        try:
            policy = _policy_of(route, envelope.item_id)
        except RouteOptionError as error:
            self._option_failed(error, pending, outcomes)
            return finish(option_error=error)

        message = _Message.of(envelope.message)
        last: _StepError | None = None
        last_host: Host | None = None
        # Postfix's smtp_mx_session_limit: hosts that refuse the connection cost little,
        # each that greets and then fails costs a session; a smarthost is one host anyway.
        session_limit = self._mx_session_limit if route.type == "mx" else 0
        greeted_failures = 0
        for host in hosts:
            if self._clock() >= deadline:
                if last is None:
                    last = self._steps.expired("connecting")
                break
            if session_limit and greeted_failures >= session_limit:
                logger.debug("%s: MX_SESSION_LIMIT (%s) reached; %s not tried", envelope.item_id, session_limit, host)
                break
            if (remembered := self._unreachable.recall(host)) is not None:
                # RFC 5321 §4.5.4.1: no new connection to a host that just did not answer.
                logger.debug("%s %s: not tried: %s", envelope.item_id, host, remembered.reply.text)
                last, last_host = remembered, host
                continue
            while True:  # again while a pooled connection turns out stale: the next, or a new one
                try:
                    session = self._session(host, policy, route, envelope.item_id, deadline, tls_sessions)
                except _StepError as failure:
                    last, last_host = failure, host
                    if failure.greeted and failure.status is RecipientStatus.DEFERRED:
                        greeted_failures += 1
                    if failure.reply.code is None:  # a server's reply was logged with its step
                        logger.debug("%s %s: %s", envelope.item_id, host, failure.reply.text)
                    self._learn_from(host, failure, envelope.item_id)
                    break
                except _RouteRefusedError as failure:
                    self._option_failed(failure.error, pending, outcomes)
                    return finish(host.name, failure.error)
                self._unreachable.forget(host)  # it took the session: it is there, whatever comes next
                if self._transact(session, envelope, message, pending, outcomes, deadline, reuse=reuse):
                    return finish(host.name, tls=session.conn.tls)

        if last is None:
            last = _StepError(_own("4.4.4", "There is no host to deliver to."))
        outcomes.update((r, Outcome(status=last.status, reply=last.reply)) for r in pending)
        if last.answered and last_host is not None:
            return finish(last_host.name, tls=last.tls)
        return finish()

    def close_idle(self) -> None:
        """QUIT and close the pooled connections idle longer than ``reuse_seconds``."""
        self._pool.close_idle()

    def close(self) -> None:
        """QUIT and close every pooled connection."""
        self._pool.close()

    def pooled_count(self) -> int:
        """Return how many idle connections the pool holds."""
        return self._pool.count()

    def unreachable_count(self) -> int:
        """Return how many hosts are remembered as not answering (``UNREACHABLE_HOST_MEMORY``)."""
        return self._unreachable.count()

    # -- sessions -------------------------------------------------------------------

    def _learn_from(self, host: Host, failure: _StepError, item_id: str) -> None:
        """Remember a host that said nothing; forget one that began its greeting."""
        if failure.unreachable:
            if self._unreachable.remember(host, failure):
                logger.info(
                    "%s %s: did not answer; not connected to again for %g s (UNREACHABLE_HOST_MEMORY)",
                    item_id,
                    host,
                    self._unreachable.seconds,
                )
        elif failure.greeted:
            self._unreachable.forget(host)

    def _option_failed(self, error: RouteOptionError, pending: Iterable[str], outcomes: dict[str, Outcome]) -> None:
        logger.warning("%s: the route cannot be used: %s", error.item_id, error.message)
        reply = _own("4.3.5", f"The route's configuration was refused: {error.message}")
        outcomes.update((r, Outcome(status=RecipientStatus.DEFERRED, reply=reply)) for r in pending)

    def _session(
        self, host: Host, policy: _Policy, route: Route, item_id: str, deadline: float, tls_sessions: list[TLSSession]
    ) -> _Session:
        key = _Key(host.name.lower(), host.address, host.port, policy)
        while (session := self._pool.take(key)) is not None:
            if session.conn.has_extn("pipelining"):
                # Its RSET goes with MAIL, RCPT and DATA: no round trip of its own.
                session.reused = True
                return session
            try:
                self._steps.arm(session.conn, "mail", deadline, "waiting for the reply to RSET")
                code, _ = session.conn.rset()
            except (OSError, _StepError):
                code = -1
            if 200 <= code < 300:
                logger.debug("%s %s: reusing a connection, RSET -> %s", item_id, host, code)
                return session
            logger.debug("%s %s: a pooled connection failed RSET (%s); reconnecting", item_id, host, code)
            session.conn.close()
        return self._opener.open(host, key, route, item_id, deadline, starttls=True, sessions=tls_sessions)

    def _transact(
        self,
        session: _Session,
        envelope: Envelope,
        message: _Message,
        pending: list[str],
        outcomes: dict[str, Outcome],
        deadline: float,
        *,
        reuse: bool = True,
    ) -> bool:
        """Give every recipient of ``pending`` an outcome on ``session``; pool or close it.

        Return ``False``, having decided nothing, when ``session`` came from the pool
        and turned out closed: the caller takes another.
        """
        reusable = False
        try:
            self._transactions.run(session, envelope, message, pending, outcomes, deadline)
            reusable = True
        except _StaleConnectionError:
            logger.debug("%s %s: a pooled connection failed RSET; reconnecting", envelope.item_id, session.host)
            return False
        except _StepError as failure:
            self._settle(pending, outcomes, failure)
        except smtplib.SMTPServerDisconnected as error:
            self._settle(pending, outcomes, _lost(error, session.host, "during the transaction"))
        except smtplib.SMTPResponseException as error:
            self._settle(pending, outcomes, _StepError.protocol(-1, _raw(error), when="in the transaction"))
        except OSError as error:
            self._settle(pending, outcomes, _lost(error, session.host, "during the transaction"))
        finally:
            if reusable and reuse:
                self._pool.give(session)
            elif reusable:
                self._pool.give(session, keep=False)
            else:
                session.conn.close()
        return True

    def _settle(self, pending: Iterable[str], outcomes: dict[str, Outcome], failure: _StepError) -> None:
        outcome = Outcome(status=failure.status, reply=failure.reply)
        outcomes.update((r, outcome) for r in pending if r not in outcomes)
