"""The SMTP transport: an envelope delivered to the first host that takes the session."""

from __future__ import annotations

import dataclasses
import logging
import smtplib
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from bumail_queue.addresses import mailbox_problem
from bumail_queue.conf import Route, Timeouts
from bumail_queue.delivery.dkim import Signatures
from bumail_queue.delivery.envelope import Delivery, Envelope, Follow, Host, TLSSession
from bumail_queue.items import Outcome, RecipientStatus

from .connection import _Steps
from .failures import RouteOptionError, _lost, _OutOfStepError, _RouteRefusedError, _StaleConnectionError, _StepError
from .handshake import _Opener
from .pool import _Key, _Pool, _Session
from .replies import _own, _raw
from .tls import _Contexts, _Policy, _policy_of
from .transactions import _Follow, _Message, _Opening, _Plan, _Transactions
from .unreachable import OUT_OF_STEP_MEMORY, _HostMemory, _UnreachableHosts

# The package's logger: the name docs/delivery.md and docs/worker.md give.
logger = logging.getLogger(__package__)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SMTPDelivery(Delivery):
    """A :class:`Delivery`, and the route's option smtplib refused, if it did.

    ``option_error`` is set when recipients were deferred ``4.3.5`` because of the
    route: the configuration is to fix, and the caller reports it.
    """

    option_error: RouteOptionError | None = None


@dataclasses.dataclass(slots=True)
class _Primed:
    """A follower's transaction begun on its predecessor's session: its commands went
    with the predecessor's final dot, and their replies wait to be read. ``since``:
    when the predecessor's delivery left the session (``None`` while it still reads)."""

    session: _Session
    plan: _Plan
    opening: _Opening
    since: float | None = None


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
        self._out_of_step = _HostMemory(seconds=OUT_OF_STEP_MEMORY, clock=clock)
        self._reuse_seconds = max(0.0, reuse_seconds)  # also how long a follower's session waits for it
        self._primed: dict[str, _Primed] = {}  # by the follower's item id
        self._primed_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} hostname={self._hostname!r} pooled={self.pooled_count()}>"

    # -- the public API -------------------------------------------------------------

    def deliver(
        self,
        envelope: Envelope,
        *,
        route: Route,
        hosts: Sequence[Host],
        reuse: bool = True,
        follow: Follow | None = None,
    ) -> SMTPDelivery:
        """Deliver ``envelope`` to the first of ``hosts`` that takes the session.

        Returns an outcome for every recipient of the envelope; raises nothing for
        what servers, the network or the route did. ``reuse=False``: the session
        ends (QUIT) with the transaction, its connection not kept for the next, and
        ``follow`` is not called.

        ``follow`` is called at most once, as the final dot of ``envelope``'s last
        transaction is about to go on a session kept for reuse to a server that offers
        PIPELINING: it returns the next envelope for the same route and hosts, or
        ``None``. That envelope's MAIL, RCPT and DATA go with the dot (RFC 2920), and
        it must be the next one this thread delivers, with the same route and hosts:
        its delivery begins by reading their replies, so a reused connection costs one
        round trip per message.
        """
        deadline = self._clock() + self._timeouts.session
        recipients, outcomes, pending = _screened(envelope)
        tls_sessions: list[TLSSession] = []
        if not reuse:
            follow = None

        def finish(
            remote_host: str | None = None, option_error: RouteOptionError | None = None, *, tls: bool = False
        ) -> SMTPDelivery:
            return SMTPDelivery(
                outcomes={r: outcomes[r] for r in recipients},
                remote_host=remote_host,
                tls=tls,
                option_error=option_error,
                tls_sessions=tuple(tls_sessions),
                # No server said a word: none can have taken the message.
                unreached=remote_host is None and option_error is None,
            )

        primed = self._take_primed(envelope.item_id)
        if not pending:
            if primed is not None:
                primed.session.conn.close()
            return finish()

        try:
            policy = _policy_of(route, envelope.item_id)
        except RouteOptionError as error:
            if primed is not None:
                primed.session.conn.close()
            self._option_failed(error, pending, outcomes)
            return finish(option_error=error)

        if primed is not None:
            session = self._resume(
                primed, envelope, policy, hosts, pending, outcomes, deadline, reuse=reuse, follow=follow
            )
            if session is not None:
                return finish(session.host.name, tls=session.conn.tls)
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
                if self._transact(session, envelope, message, pending, outcomes, deadline, reuse=reuse, follow=follow):
                    return finish(host.name, tls=session.conn.tls)

        if last is None:
            last = _StepError(_own("4.4.4", "There is no host to deliver to."))
        # A session's failure (the greeting, EHLO, TLS, a lost connection) is about no
        # one recipient.
        shared = Outcome(status=last.status, reply=last.reply, names_recipient=False)
        outcomes.update((r, shared) for r in pending)
        if last.answered and last_host is not None:
            return finish(last_host.name, tls=last.tls)
        return finish()

    def close_idle(self) -> None:
        """QUIT and close the pooled connections idle longer than ``reuse_seconds``."""
        self._pool.close_idle()
        self._drop_primed(older_than=self._reuse_seconds)

    def close(self) -> None:
        """QUIT and close every pooled connection."""
        self._pool.close()
        self._drop_primed(older_than=None)

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
            if said := session.conn.unread():
                self._spoke_unasked(session, said, item_id)
                continue
            session.lockstep = self._out_of_step.holds(host)
            if session.clean or session.pipelining:
                # Between transactions MAIL needs no RSET; else RSET goes with MAIL, RCPT
                # and DATA. Either way the first reply tells whether the server is still there.
                session.reused = True
                return session
            try:
                self._steps.arm(session.conn, "mail", deadline, "waiting for the reply to RSET")
                code, _ = session.conn.rset()
            except (OSError, _StepError):
                code = -1
            if 200 <= code < 300:
                logger.debug("%s %s: reusing a connection, RSET -> %s", item_id, host, code)
                session.clean = True
                return session
            logger.debug("%s %s: a pooled connection failed RSET (%s); reconnecting", item_id, host, code)
            session.conn.close()
        session = self._opener.open(host, key, route, item_id, deadline, starttls=True, sessions=tls_sessions)
        session.lockstep = self._out_of_step.holds(host)
        return session

    def _spoke_unasked(self, session: _Session, said: bytes, item_id: str) -> None:
        """Close a kept connection whose server spoke while it waited: a 421 before it
        closes (RFC 5321 §3.8), or a reply out of step, which makes its host one to
        send one command at a time. Nothing was sent on it: nothing is decided."""
        session.conn.close()
        if said.startswith(b"421"):
            logger.debug("%s %s: a kept connection said 421; reconnecting", item_id, session.host)
            return
        self._out_of_step.remember(session.host, _OutOfStepError(session.host, "a reply while none was outstanding"))
        logger.warning(
            "%s %s: a kept connection sent a reply while none was outstanding; reconnecting, "
            "one command at a time for %g s",
            item_id,
            session.host,
            self._out_of_step.seconds,
        )

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
        follow: Follow | None,
        primed: _Primed | None = None,
    ) -> bool:
        """Give every recipient of ``pending`` an outcome on ``session``; pool it, leave
        it to the follower whose commands went with its last dot, or close it.

        ``primed``: the first transaction began with the previous message's final dot.
        Return ``False``, having decided nothing, when ``session`` came from the pool or
        was handed on and turned out closed: the caller takes another.
        """
        reusable = False
        try:
            if primed is None:
                plan, opened = self._transactions.plan(session, envelope, message, pending, outcomes), None
            else:
                plan, opened = primed.plan, primed.opening
            self._transactions.run(session, plan, deadline, follow=self._primer(session, follow), opened=opened)
            reusable = True
        except _StaleConnectionError:
            logger.debug("%s %s: a kept connection had closed; reconnecting", envelope.item_id, session.host)
            return False
        except _OutOfStepError as failure:
            self._out_of_step.remember(session.host, failure)
            logger.warning(
                "%s: %s; one command at a time to it for %g s",
                envelope.item_id,
                failure.reply.text,
                self._out_of_step.seconds,
            )
            self._settle(pending, outcomes, failure)
        except _StepError as failure:
            self._settle(pending, outcomes, failure)
        except smtplib.SMTPServerDisconnected as error:
            self._settle(pending, outcomes, _lost(error, session.host, "during the transaction"))
        except smtplib.SMTPResponseException as error:
            self._settle(pending, outcomes, _StepError.protocol(-1, _raw(error), when="in the transaction"))
        except OSError as error:
            self._settle(pending, outcomes, _lost(error, session.host, "during the transaction"))
        finally:
            if not reusable:
                session.conn.close()  # a follower primed on it finds it closed: it was not tried
            elif session.held_for is not None:
                self._leave_to_follower(session, session.held_for)
            else:
                self._pool.give(session, keep=reuse)
        return True

    # -- followers (RFC 2920: the next transaction's commands with the final dot) ----

    def _primer(self, session: _Session, follow: Follow | None) -> _Follow | None:
        """Return what asks for the follower when ``session``'s last final dot is about
        to go, and gives its first commands; ``None`` when the session is not kept."""
        if follow is None:
            return None

        def prime() -> bytes | None:
            if not self._pool.reusable(session):
                return None  # it is closed after this message
            follower = follow()
            return None if follower is None else self._prime(session, follower)

        return prime

    def _prime(self, session: _Session, envelope: Envelope) -> bytes | None:
        """Work out ``envelope``'s first transaction on ``session`` and keep it for its
        delivery; return its commands. ``None`` when nothing of it can go so (its
        delivery then finds the session in the pool and decides as usual)."""
        _, outcomes, pending = _screened(envelope)
        if not pending:
            return None
        plan = self._transactions.plan(session, envelope, _Message.of(envelope.message), pending, outcomes)
        opening = self._transactions.opening(plan, plan.todo, reset=False) if plan.todo else None
        if opening is None:
            return None
        session.held_for = envelope.item_id
        with self._primed_lock:
            self._primed[envelope.item_id] = _Primed(session=session, plan=plan, opening=opening)
        return opening.data

    def _leave_to_follower(self, session: _Session, item_id: str) -> None:
        """The delivery that sent the final dot is done with ``session``: from now on it
        waits for its follower (``close_idle()`` drops it once ``reuse_seconds`` pass)."""
        with self._primed_lock:
            if (primed := self._primed.get(item_id)) is not None:
                primed.since = self._clock()

    def _take_primed(self, item_id: str) -> _Primed | None:
        with self._primed_lock:
            primed = self._primed.pop(item_id, None)
        if primed is not None:
            primed.session.held_for = None
        return primed

    def _resume(
        self,
        primed: _Primed,
        envelope: Envelope,
        policy: _Policy,
        hosts: Sequence[Host],
        pending: list[str],
        outcomes: dict[str, Outcome],
        deadline: float,
        *,
        reuse: bool,
        follow: Follow | None,
    ) -> _Session | None:
        """Go on with the transaction begun with the previous message's final dot: read
        the replies to its commands, then send the message. Return the session when it
        decided, ``None`` when it had closed, or is not to one of ``hosts``: nothing was
        decided, and the hosts are tried as usual."""
        session = primed.session
        keys = {_Key(host.name.lower(), host.address, host.port, policy) for host in hosts}
        if session.conn.sock is None or session.key not in keys:
            session.conn.close()  # the server drops the transaction begun: nothing is delivered
            return None
        session.reused = True
        outcomes.update(primed.plan.outcomes)
        primed.plan.outcomes = outcomes
        message = primed.plan.message
        if self._transact(
            session, envelope, message, pending, outcomes, deadline, reuse=reuse, follow=follow, primed=primed
        ):
            return session
        return None

    def _drop_primed(self, *, older_than: float | None) -> None:
        """Close the sessions primed for a follower whose delivery never came: those left
        ``older_than`` seconds ago, or all of them (``None``, when the transport closes)."""
        now = self._clock()
        with self._primed_lock:
            dropped = [
                item_id
                for item_id, primed in self._primed.items()
                if older_than is None or (primed.since is not None and now - primed.since >= older_than)
            ]
            sessions = [self._primed.pop(item_id).session for item_id in dropped]
        for session in sessions:
            session.conn.close()  # the server drops the transaction begun: nothing is delivered

    def _settle(self, pending: Iterable[str], outcomes: dict[str, Outcome], failure: _StepError) -> None:
        outcome = Outcome(status=failure.status, reply=failure.reply, names_recipient=False)
        outcomes.update((r, outcome) for r in pending if r not in outcomes)


def _screened(envelope: Envelope) -> tuple[list[str], dict[str, Outcome], list[str]]:
    """Return the envelope's recipients (each once), the outcomes of those no session can
    take (an address that cannot go into MAIL or RCPT), and the recipients left to send."""
    recipients = list(dict.fromkeys(envelope.recipients))
    outcomes: dict[str, Outcome] = {}
    problem = mailbox_problem(envelope.sender) if envelope.sender else None
    if problem:
        reply = _own("5.1.7", f"The sender address cannot be sent: {problem}.")
        outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in recipients)
        return recipients, outcomes, []
    pending: list[str] = []
    for recipient in recipients:
        problem = mailbox_problem(recipient)
        if problem:
            reply = _own("5.1.3", f"The recipient address cannot be sent: {problem}.")
            outcomes[recipient] = Outcome(status=RecipientStatus.FAILED, reply=reply)
        else:
            pending.append(recipient)
    return recipients, outcomes, pending
