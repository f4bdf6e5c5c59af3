"""What can go wrong in a session, as the exceptions that carry it to the recipients' outcomes."""

from __future__ import annotations

import smtplib
import socket
import ssl

from bumail_queue.delivery.envelope import Host
from bumail_queue.errors import QueueConfigurationError
from bumail_queue.items import RecipientStatus, Reply

from .replies import _own, _raw, _status_of, reply_from


class RouteOptionError(QueueConfigurationError):
    """smtplib refused an option of the route; its recipients were deferred ``4.3.5``.

    ``code`` is ``INVALID_OPTION``; ``item_id`` names the item being delivered. The
    message says what to fix and never holds the password.
    """

    def __init__(self, message: str, *, item_id: str | None = None) -> None:
        super().__init__(message)
        self.item_id = item_id


class _StepError(Exception):
    """A step went wrong: what every recipient without an outcome gets."""

    def __init__(
        self,
        reply: Reply,
        *,
        status: RecipientStatus = RecipientStatus.DEFERRED,
        answered: bool = False,
        unreachable: bool = False,
    ) -> None:
        super().__init__(reply.text)
        self.reply = reply
        self.status = status
        self.answered = answered  # a server replied: it is the Delivery's remote_host
        # The host said nothing at all: the transport remembers it (UNREACHABLE_HOST_MEMORY).
        self.unreachable = unreachable
        self.greeted = False  # the host had begun its greeting: it counts towards MX_SESSION_LIMIT
        self.tls = False  # the session ran over TLS when it failed

    @classmethod
    def of_reply(cls, code: int, raw: bytes, *, when: str) -> _StepError:
        status = _status_of(code)
        if status is None or status is RecipientStatus.DELIVERED:
            return cls.protocol(code, raw, when=when)
        return cls(reply_from(code, raw), status=status, answered=True)

    @classmethod
    def protocol(cls, code: int, raw: bytes, *, when: str) -> _StepError:
        reply = reply_from(code, raw)
        text = f"Unexpected reply {code if code >= 0 else '(no valid code)'} {when}: {reply.text}"
        return cls(_own("4.5.0", text), answered=True)


class _OutOfStepError(_StepError):
    """The server replied out of step: before what the reply answers was sent, or once
    too often. No reply of the transaction it broke decides anything (RFC 2920 §3.1:
    each reply answers the command in its place); its recipients wait, and the
    transport ends the connection and remembers the host."""

    def __init__(self, host: Host, what: str) -> None:
        text = f"{host} replied out of step ({what}); the connection was ended and no reply of it was taken"
        super().__init__(_own("4.5.0", text), answered=True)


class _StaleConnectionError(Exception):
    """A pooled connection failed the RSET that begins its reuse: nothing was decided."""


class _RouteRefusedError(Exception):
    def __init__(self, error: RouteOptionError) -> None:
        super().__init__(str(error))
        self.error = error


class _DeadlineError(TimeoutError):
    """A step's time ran out; the text says which limit it was (the step's or the session's)."""

    def __init__(self, text: str, *, session: bool = False) -> None:
        super().__init__(text)
        self.session = session  # the session's time ran out, not the step's own timeout


def _refused(message: str, item_id: str) -> _RouteRefusedError:
    return _RouteRefusedError(RouteOptionError(message, item_id=item_id))


def _timed_out(error: BaseException) -> bool:
    return any(isinstance(e, TimeoutError) for e in (error, error.__cause__, error.__context__))


def _deadline_of(error: BaseException) -> _DeadlineError | None:
    """Return the deadline that ran out, if ``error`` is or comes from one."""
    for cause in (error, error.__cause__, error.__context__):
        if isinstance(cause, _DeadlineError):
            return cause
    return None


def _ran_out(error: BaseException) -> _StepError | None:
    """Return the failure of a step whose time ran out, if ``error`` says so."""
    deadline = _deadline_of(error)
    return None if deadline is None else _StepError(_own("4.4.2", str(deadline)))


def _lost(error: OSError, host: Host, when: str) -> _StepError:
    """Return the failure of a connection that timed out or dropped ``when``."""
    if (ran_out := _ran_out(error)) is not None:
        return ran_out
    if _timed_out(error):
        return _StepError(_own("4.4.2", f"Timed out {when} ({host})"))
    return _StepError(_own("4.4.2", f"Connection to {host} dropped {when}"))


def _connect_failure(error: OSError, host: Host) -> _StepError:
    """Return the failure of a connection that could not be made, or whose greeting did not come.

    It is ``unreachable`` when the host said nothing: the connection was refused or
    could not be made, or CONNECT or GREETING ran out of its own time. A host that
    closed the connection, or failed the TLS handshake, is there; a name that does
    not resolve is DNS's failure, not the host's.
    """
    if (deadline := _deadline_of(error)) is not None:
        # The session's time running out says nothing of this host: others took it.
        return _StepError(_own("4.4.2", str(deadline)), unreachable=not deadline.session)
    if isinstance(error, smtplib.SMTPServerDisconnected):
        return _lost(error, host, "waiting for the greeting")
    if isinstance(error, smtplib.SMTPResponseException):
        return _StepError.protocol(-1, _raw(error), when="as the greeting")
    if isinstance(error, ssl.SSLError):
        return _StepError(_own("4.7.5", f"TLS handshake with {host} failed: {error}"))
    if _timed_out(error):
        return _StepError(_own("4.4.2", f"Timed out connecting to {host}"), unreachable=True)
    if isinstance(error, ConnectionRefusedError):
        return _StepError(_own("4.4.1", f"Connection refused by {host}"), unreachable=True)
    if isinstance(error, socket.gaierror):
        return _StepError(_own("4.4.3", f"The host name of {host} does not resolve: {error}"))
    return _StepError(_own("4.4.1", f"Cannot connect to {host}: {error}"), unreachable=True)
