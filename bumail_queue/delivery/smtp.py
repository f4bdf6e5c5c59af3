"""Deliver an envelope over SMTP, as a careful MTA's client does, on :mod:`smtplib`.

``docs/delivery.md`` describes the behaviour for users; this is the summary.

``SMTPTransport.deliver()`` takes one envelope, the route it goes by and the hosts to
try (the MX hosts of the recipients' domain, in preference order, or the one
smarthost), and returns an outcome for every recipient. It never raises for what a
server, the network or the route did: each of those becomes an outcome.

Hosts
    Tried in order. The next one is tried when a host refuses the connection, cannot
    be reached, times out, drops the connection, or answers the greeting, EHLO/HELO,
    STARTTLS or AUTH with anything but success, or a TLS handshake fails. Once a host
    has accepted the session (after AUTH), the recipients' fate is decided there.
    When every host failed, each recipient gets the last host's outcome: its 4xx
    reply (deferred), its 5xx reply (failed: a 5xx greeting or HELO from the last
    host), or, with no reply, ``4.4.1`` (refused, unreachable), ``4.4.2`` (dropped,
    timed out), ``4.4.3`` (the name does not resolve), ``4.7.x`` (TLS, AUTH).
    On an MX route, once ``mx_session_limit`` hosts have begun their greeting and
    then failed temporarily, no further host is tried (Postfix's
    ``smtp_mx_session_limit``); refused connections do not count.

TLS
    A smarthost's ``TLS``: ``"implicit"`` connects with TLS from the start,
    ``"starttls"`` requires STARTTLS (not offered or refused: ``4.7.0``; a failed
    handshake: ``4.7.5``; never plain text), ``"none"`` stays in plain text. Its
    certificate is verified when ``TLS_VERIFY`` (against ``ssl_context``, by default
    ``ssl.create_default_context()``). An MX route uses STARTTLS whenever it is
    offered, without verifying the certificate (as MTAs do); a failed handshake there
    means a new connection in plain text. With ``TLS_REQUIRED`` an MX route requires
    STARTTLS as above, still unverified. Bytes the server sent after its 220 to
    STARTTLS and before the handshake are discarded (RFC 3207 §6). The returned
    ``Delivery.tls`` says whether the deciding session ran over TLS.

AUTH
    With a ``USERNAME``, smtplib's ``login()``. A 4xx reply defers with it; a 5xx
    reply (535: the credentials are wrong) defers too, as ``4.7.8``, keeping the
    server's code and text: a configuration to fix must not lose mail. The password
    is never in a reply, a log line, an exception or a repr: a server's reply that
    echoes the password, or the base64 of the password, the username or the PLAIN
    argument, has each of them replaced by ``[redacted]``, for the whole session.

The transaction
    ``MAIL FROM`` carries ``SIZE=`` when the server offers SIZE (a message above the
    server's limit fails every recipient, ``5.3.4``, before MAIL), ``SMTPUTF8`` when
    the sender or a recipient is not ASCII (a server without SMTPUTF8: those
    recipients, or all when it is the sender, fail ``5.6.7``; nothing is downgraded),
    and ``BODY=8BITMIME`` when the message has 8-bit bytes and the server offers it
    (a server without 8BITMIME is sent the bytes as they are). A 4xx MAIL reply
    defers, a 5xx fails, every recipient. Each RCPT reply is kept: 2xx accepted, 4xx
    deferred, 5xx failed. A 452 (RFC 5321 §4.5.3.1.10, too many recipients) leaves
    that recipient and the ones after it for another transaction on the same
    connection (RSET, MAIL, RCPT...) once this one is done; a 452 to the first RCPT
    of a transaction defers the rest with it. DATA is sent only when a RCPT was
    accepted (RSET otherwise), and the reply after the final dot decides every
    accepted recipient. A 421 anywhere defers what is undecided and drops the
    connection.

Pipelining (RFC 2920)
    When the server offers PIPELINING, MAIL, every RCPT and DATA go in one write (with
    the RSET that begins a reused connection's transaction in front), and their
    replies are read in order: two round trips per transaction instead of four or
    more. The replies decide as above, with two differences the protocol makes: DATA
    has been sent even when no RCPT was accepted (the server refuses it; a 354 is
    answered with an empty message), and after a 452 every later RCPT has been heard
    too, so those accepted take the message and each one that heard 452 is left for
    the next transaction.

The message
    Sent as its bytes, lines ending in CRLF (lone CR or LF become CRLF), dot-stuffed,
    in 64 KiB blocks: smtplib's ``data()`` does neither CRLF for bytes nor the step
    timeouts below, so the DATA phase uses its ``putcmd``/``send``/``getreply``. MAIL
    and RCPT use ``docmd`` with the address as it is (``mail()``/``rcpt()`` would pass
    it through ``email.utils.parseaddr``).

Timeouts (RFC 5321 §4.5.3.2)
    Each step has its own deadline: ``connect`` (TCP, and the handshake of
    implicit TLS), ``greeting`` (the greeting, EHLO/HELO, STARTTLS, AUTH), ``mail``
    (MAIL, RSET), ``rcpt``, ``data`` (the DATA command), ``data_block`` (each block
    of the message), ``data_end`` (the reply after the dot); and ``deliver()`` as a
    whole is bounded by ``session``: each step ends ``min(step, time left)`` after
    it starts, however slowly the peer's bytes come (the socket's timeout is set to
    what is left before each ``recv`` and ``send``). A timeout or a dropped
    connection defers what is undecided, ``4.4.2``, with no reply code, a text that
    names the limit that ran out (the step's or ``SESSION``), and the connection is
    discarded.

Addresses
    A recipient that is not an RFC 5321 mailbox (``addresses.mailbox_problem``: a CR,
    LF or other control character, a NUL...) is never sent: it fails alone, ``5.1.3``.
    Such a sender fails every recipient, ``5.1.7``, with no session.

Route options smtplib refuses
    When smtplib refuses what the route gives it (a password it cannot encode, AUTH
    configured but not offered by the server, a route with an unknown type or TLS
    mode), every undecided recipient is deferred ``4.3.5`` and ``deliver()`` returns
    an :class:`SMTPDelivery` whose ``option_error`` is a :class:`RouteOptionError`
    (``code == "INVALID_OPTION"``), for the caller to report (the ``error`` signal).
    It is logged as a warning here too.

Replies
    A server's reply text is decoded as UTF-8 (invalid bytes replaced), NULs removed,
    lone surrogates replaced, line breaks made spaces, and cut at 512 characters. Its
    enhanced status code (RFC 3463) is read from the start of the text when its class
    matches the reply code's, else derived from the code: ``2.0.0``, ``4.0.0``,
    ``5.0.0``. ``Reply.text`` is the text without the reply code, enhanced code
    included (``"5.1.1 No such user"``). A reply without a valid code, or with one
    that has no place at that step, defers with ``4.5.0`` and drops the connection.
    So does a reply line longer than :data:`MAX_REPLY_LINE` octets or a reply longer
    than :data:`MAX_REPLY_LINES` lines: no more than that is ever held.

Connections
    After a transaction the connection is kept for ``reuse_seconds`` in a pool keyed
    by host name, address, port, TLS policy and username; the next envelope for that
    host starts with RSET (pipelined with MAIL when the server offers PIPELINING),
    and a pooled connection that fails it is discarded and a new one opened,
    silently. ``reuse_seconds`` 0 means QUIT after each envelope.
    ``close_idle()`` closes what was idle longer than ``reuse_seconds``, ``close()``
    everything in the pool. ``deliver()`` may be called from several threads at
    once; a connection is used by one of them at a time.

Each SMTP step logs at most one DEBUG line on this module's logger.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import logging
import re
import smtplib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from bumail_queue.addresses import mailbox_problem, needs_smtputf8
from bumail_queue.conf import Route, Timeouts
from bumail_queue.errors import QueueConfigurationError
from bumail_queue.items import Outcome, RecipientStatus, Reply

from .envelope import Delivery, Envelope, Host

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["MAX_REPLY_LINE", "MAX_REPLY_LINES", "MAX_REPLY_TEXT", "RouteOptionError", "SMTPDelivery", "SMTPTransport", "clean_reply_text", "reply_from"]

logger = logging.getLogger(__name__)

#: The longest ``Reply.text`` kept, in characters.
MAX_REPLY_TEXT = 512
#: The longest reply line read, in octets without its CRLF: past it the session ends
#: (Postfix's ``line_length_limit``; RFC 5321 §4.5.3.1.5 asks for 512 at least).
MAX_REPLY_LINE = 2048
#: The most lines a reply may have: past it the session ends (Postfix bounds a reply too).
MAX_REPLY_LINES = 100
#: What an echoed credential becomes in a reply's text.
REDACTED = b"[redacted]"
#: How much of the message is sent under one ``data_block`` timeout.
BLOCK_SIZE = 64 * 1024
# QUIT is a courtesy: never wait long for it.
_QUIT_TIMEOUT = 5.0
_RECV_SIZE = 8192

_ENHANCED = re.compile(r"([245])\.([0-9]{1,3})\.([0-9]{1,3})(?=\s|$)")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BREAKS = re.compile(r"[\r\n]+")
_LINE_END = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)


class RouteOptionError(QueueConfigurationError):
    """smtplib refused an option of the route; its recipients were deferred ``4.3.5``.

    ``code`` is ``INVALID_OPTION``; ``item_id`` names the item being delivered. The
    message says what to fix and never holds the password.
    """

    def __init__(self, message: str, *, item_id: str | None = None) -> None:
        super().__init__(message)
        self.item_id = item_id


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SMTPDelivery(Delivery):
    """A :class:`Delivery`, and the route's option smtplib refused, if it did.

    ``option_error`` is set when recipients were deferred ``4.3.5`` because of the
    route: the configuration is to fix, and the caller reports it.
    """

    option_error: RouteOptionError | None = None


def clean_reply_text(text: str) -> str:
    """Return ``text`` fit to keep: no NUL, no lone surrogate, one line, 512 characters at most."""
    text = _SURROGATE.sub("\ufffd", text.replace("\x00", ""))
    return _BREAKS.sub(" ", text).strip()[:MAX_REPLY_TEXT].rstrip()


def reply_from(code: int, raw: bytes | str) -> Reply:
    """Return the :class:`Reply` of a server's ``code`` and reply text (bytes as read)."""
    text = clean_reply_text(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
    match = _ENHANCED.match(text)
    if match and str(code)[:1] == match.group(1):
        status = match.group(0)
    else:
        status = f"{str(code)[:1]}.0.0" if 200 <= code < 600 else "4.5.0"
    return Reply(code=code, status=status, text=text)


def _status_of(code: int) -> RecipientStatus | None:
    """Return what a reply code decides for a recipient; ``None`` for no valid code."""
    if 200 <= code < 300:
        return RecipientStatus.DELIVERED
    if 400 <= code < 500:
        return RecipientStatus.DEFERRED
    if 500 <= code < 600:
        return RecipientStatus.FAILED
    return None


def _own(status: str, text: str) -> Reply:
    """Return a reply of ours (no server answered it)."""
    return Reply(code=None, status=status, text=clean_reply_text(text))


class _TLS(enum.Enum):
    NONE = "none"
    OPPORTUNISTIC = "opportunistic"
    STARTTLS = "starttls"
    IMPLICIT = "implicit"


@dataclasses.dataclass(frozen=True, slots=True)
class _Policy:
    """How to talk to a host: TLS, whether its certificate is verified, who logs in."""

    tls: _TLS
    verify: bool
    username: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class _Key:
    """What a pooled connection may be reused for."""

    name: str
    address: str | None
    port: int
    policy: _Policy


@dataclasses.dataclass(eq=False, slots=True)
class _Session:
    conn: _Connection
    host: Host
    key: _Key
    last_used: float = 0.0
    reused: bool = False  # taken from the pool: its first transaction starts with RSET


@dataclasses.dataclass(frozen=True, slots=True)
class _Message:
    """The message as it goes on the wire after DATA, and what MAIL says about it."""

    data: bytes  # CRLF lines, dot-stuffed, ending with CRLF "." CRLF
    size: int  # RFC 1870: CRLF lines, before dot-stuffing
    eight_bit: bool

    @classmethod
    def of(cls, message: bytes) -> _Message:
        # A stored message is nearly always CRLF already, with no line starting with
        # "."; counting is far cheaper than the substitutions, so they run only when needed.
        crlf = message.count(b"\r\n")
        text = message if message.count(b"\r") == message.count(b"\n") == crlf else _LINE_END.sub(b"\r\n", message)
        if text and not text.endswith(b"\r\n"):
            text += b"\r\n"
        stuffed = _LEADING_DOT.sub(b"..", text) if text.startswith(b".") or b"\n." in text else text
        return cls(data=stuffed + b".\r\n", size=len(text), eight_bit=not message.isascii())


class _StepError(Exception):
    """A step went wrong: what every recipient without an outcome gets."""

    def __init__(self, reply: Reply, *, status: RecipientStatus = RecipientStatus.DEFERRED, answered: bool = False) -> None:
        super().__init__(reply.text)
        self.reply = reply
        self.status = status
        self.answered = answered  # a server replied: it is the Delivery's remote_host
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


class _StaleConnectionError(Exception):
    """A pooled connection failed the RSET that begins its reuse: nothing was decided."""


class _RouteRefusedError(Exception):
    def __init__(self, error: RouteOptionError) -> None:
        super().__init__(str(error))
        self.error = error


def _timed_out(error: BaseException) -> bool:
    return any(isinstance(e, TimeoutError) for e in (error, error.__cause__, error.__context__))


def _ran_out(error: BaseException) -> _StepError | None:
    """Return the failure of a step whose time ran out, if ``error`` says so."""
    for cause in (error, error.__cause__, error.__context__):
        if isinstance(cause, _DeadlineError):
            return _StepError(_own("4.4.2", str(cause)))
    return None


def _lost(error: OSError, host: Host, when: str) -> _StepError:
    """Return the failure of a connection that timed out or dropped ``when``."""
    if (ran_out := _ran_out(error)) is not None:
        return ran_out
    if _timed_out(error):
        return _StepError(_own("4.4.2", f"Timed out {when} ({host})"))
    return _StepError(_own("4.4.2", f"Connection to {host} dropped {when}"))


def _connect_failure(error: OSError, host: Host) -> _StepError:
    """Return the failure of a connection that could not be made."""
    if (ran_out := _ran_out(error)) is not None:
        return ran_out
    if isinstance(error, smtplib.SMTPServerDisconnected):
        return _lost(error, host, "waiting for the greeting")
    if isinstance(error, smtplib.SMTPResponseException):
        return _StepError.protocol(-1, _raw(error), when="as the greeting")
    if isinstance(error, ssl.SSLError):
        return _StepError(_own("4.7.5", f"TLS handshake with {host} failed: {error}"))
    if _timed_out(error):
        return _StepError(_own("4.4.2", f"Timed out connecting to {host}"))
    if isinstance(error, ConnectionRefusedError):
        return _StepError(_own("4.4.1", f"Connection refused by {host}"))
    if isinstance(error, socket.gaierror):
        return _StepError(_own("4.4.3", f"The host name of {host} does not resolve: {error}"))
    return _StepError(_own("4.4.1", f"Cannot connect to {host}: {error}"))


def _unverified_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _policy_of(route: Route, item_id: str) -> _Policy:
    if route.type == "mx":
        return _Policy(_TLS.STARTTLS if route.tls_required else _TLS.OPPORTUNISTIC, verify=False, username=None)
    if route.type != "smarthost":
        raise RouteOptionError(f"The route's type {route.type!r} is not 'mx' or 'smarthost'.", item_id=item_id)
    modes = {"starttls": _TLS.STARTTLS, "implicit": _TLS.IMPLICIT, "none": _TLS.NONE}
    if route.tls not in modes:
        raise RouteOptionError(f"The route's TLS {route.tls!r} is not 'starttls', 'implicit' or 'none'.", item_id=item_id)
    if (route.username is None) != (route.password is None):
        raise RouteOptionError("The route needs both a USERNAME and a PASSWORD for AUTH, or neither.", item_id=item_id)
    return _Policy(modes[route.tls], verify=route.tls_verify, username=route.username)


class _DeadlineError(TimeoutError):
    """A step's time ran out; the text says which limit it was (the step's or the session's)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Step:
    """What the connection is doing, until when, and the limit that ends it then."""

    ends_at: float
    limit: str
    doing: str


class _Connection(smtplib.SMTP):
    """smtplib's client, reading and writing within the armed step's deadline.

    smtplib reads replies through ``sock.makefile()``: every ``recv`` gets the socket's
    timeout afresh, so a peer sending one byte at a time is never timed out, and every
    continuation line is kept. Here ``getreply`` and ``send`` set the socket's timeout
    to what is left of the step before each ``recv``/``send``, a reply line is kept up
    to :data:`MAX_REPLY_LINE` octets and a reply up to :data:`MAX_REPLY_LINES` lines,
    and the connection's credentials are redacted from what is read.

    ``connect(name, port)`` opens TCP to the host's address (or name), does the
    handshake of implicit TLS (SNI and the certificate check use ``name``) within the
    armed step, then calls ``on_connected`` (which arms the greeting's step).
    """

    def __init__(
        self,
        *,
        local_hostname: str,
        host: Host,
        clock: Callable[[], float],
        on_connected: Callable[[], None],
        implicit_tls: ssl.SSLContext | None,
    ) -> None:
        super().__init__(local_hostname=local_hostname)
        self._target = host
        self._clock = clock
        self._on_connected = on_connected
        self._implicit_tls = implicit_tls
        self._step = _Step(ends_at=clock(), limit="no step was started", doing="")  # arm() before any I/O
        self._inbox = bytearray()
        self._inbox_of: socket.socket | None = None
        self._secrets: list[bytes] = []
        self.heard = False  # the server sent something: the greeting had begun
        self.tls = False

    def arm(self, step: _Step) -> None:
        self._step = step

    def redact(self, username: str, password: str) -> None:
        """Keep the forms of the credentials AUTH sends out of every reply read from now on.

        The password as it is, and base64 of the password, of the username (LOGIN,
        RFC 4616 and draft-murchison-sasl-login) and of the PLAIN argument.
        """
        user, secret = username.encode("utf-8", "replace"), password.encode("utf-8", "replace")
        forms = {secret, *(base64.b64encode(x) for x in (secret, user, b"\0" + user + b"\0" + secret))}
        self._secrets = sorted((f for f in forms if f), key=len, reverse=True)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        # smtplib keeps the name given to __init__ only, and starttls() checks it.
        self._host = host
        try:
            sock = socket.create_connection((self._target.address or host, port), self._time_left(), self.source_address)
        except TimeoutError:
            raise self._ran_out() from None
        try:
            if self._implicit_tls is not None:
                sock.settimeout(self._time_left())
                sock = self._implicit_tls.wrap_socket(sock, server_hostname=host)
                self.tls = True
            self._on_connected()
        except TimeoutError:
            sock.close()
            raise self._ran_out() from None
        except BaseException:
            sock.close()
            raise
        return sock

    def _time_left(self) -> float:
        left = self._step.ends_at - self._clock()
        if left <= 0:
            raise self._ran_out()
        return left

    def _ran_out(self) -> _DeadlineError:
        return _DeadlineError(f"Timed out {self._step.doing} ({self._target}): {self._step.limit} ran out")

    def _too_long(self, what: str) -> _StepError:
        self.close()
        return _StepError(_own("4.5.0", f"Reply from {self._target} {what}"), answered=True)

    def send(self, s: ReadableBuffer | str) -> None:
        sock = self.sock
        if sock is None:
            raise smtplib.SMTPServerDisconnected("please run connect() first")
        data = memoryview(s.encode(self.command_encoding) if isinstance(s, str) else s).cast("B")
        while data:
            sock.settimeout(self._time_left())
            try:
                sent = sock.send(data)
            except TimeoutError:
                self.close()
                raise self._ran_out() from None
            except OSError as error:
                self.close()
                raise smtplib.SMTPServerDisconnected("Server not connected") from error
            data = data[sent:]

    def getreply(self) -> tuple[int, bytes]:
        """Read one reply: its code (-1 when a line has none) and its lines' texts, joined by LF."""
        texts: list[bytes] = []
        code = -1
        while True:
            if len(texts) == MAX_REPLY_LINES:
                raise self._too_long(f"longer than {MAX_REPLY_LINES} lines")
            line = self._read_line()
            texts.append(line[4:].strip(b" \t\r\n"))
            head = line[:3]
            if len(head) != 3 or not head.isdigit():
                code = -1
                break
            code = int(head)
            if line[3:4] != b"-":
                break
        return code, self._redacted(b"\n".join(texts))

    def _redacted(self, text: bytes) -> bytes:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def _read_line(self) -> bytes:
        if self._inbox_of is not self.sock:
            # A new socket (after STARTTLS): nothing read before the handshake may be
            # taken as said over TLS (RFC 3207 §6, the command-injection attack).
            self._inbox.clear()
            self._inbox_of = self.sock
        while (end := self._inbox.find(b"\n")) < 0:
            if len(self._inbox) > MAX_REPLY_LINE + 1:  # + 1: the CR before LF
                raise self._too_long(f"has a line longer than {MAX_REPLY_LINE} octets")
            self._inbox += self._recv()
        line = bytes(self._inbox[: end + 1])
        del self._inbox[: end + 1]
        if len(line.rstrip(b"\r\n")) > MAX_REPLY_LINE:
            raise self._too_long(f"has a line longer than {MAX_REPLY_LINE} octets")
        return line

    def _recv(self) -> bytes:
        sock = self.sock
        if sock is None:
            raise smtplib.SMTPServerDisconnected("Connection unexpectedly closed")
        sock.settimeout(self._time_left())
        try:
            data = sock.recv(_RECV_SIZE)
        except TimeoutError:
            self.close()
            raise self._ran_out() from None
        except OSError as error:
            self.close()
            raise smtplib.SMTPServerDisconnected(f"Connection unexpectedly closed: {error}") from None
        if not data:
            self.close()
            raise smtplib.SMTPServerDisconnected("Connection unexpectedly closed")
        self.heard = True
        return data

    def close(self) -> None:
        self._inbox.clear()
        super().close()


class SMTPTransport:
    """Delivers envelopes over SMTP, keeping connections for reuse; see the module's doc.

    ``hostname`` is said in EHLO/HELO; ``timeouts`` bound each step and the session;
    ``reuse_seconds`` is how long an idle connection is kept (0: none is);
    ``mx_session_limit`` is how many MX hosts that greeted and failed temporarily are
    tried per envelope (Postfix's ``smtp_mx_session_limit``).
    ``ssl_context`` verifies smarthost certificates (``ssl.create_default_context()``
    when ``None``); ``clock`` gives the time in seconds, for the session's deadline and
    the connections' idle time.
    """

    def __init__(
        self,
        *,
        hostname: str,
        timeouts: Timeouts,
        reuse_seconds: float,
        mx_session_limit: int = 2,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._hostname = hostname
        self._timeouts = timeouts
        self._reuse_seconds = max(0.0, reuse_seconds)
        self._mx_session_limit = mx_session_limit
        # Made when a session first needs TLS: loading the system's CA certificates
        # takes tens of milliseconds, which a worker relaying in plain text never needs.
        self._contexts: dict[bool, ssl.SSLContext] = {} if ssl_context is None else {True: ssl_context}
        self._clock = clock
        self._lock = threading.Lock()
        self._pool: dict[_Key, list[_Session]] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} hostname={self._hostname!r} pooled={self.pooled_count()}>"

    # -- the public API -------------------------------------------------------------

    def deliver(self, envelope: Envelope, *, route: Route, hosts: Sequence[Host]) -> SMTPDelivery:
        """Deliver ``envelope`` to the first of ``hosts`` that takes the session.

        Returns an outcome for every recipient of the envelope; raises nothing for
        what servers, the network or the route did.
        """
        deadline = self._clock() + self._timeouts.session
        recipients = list(dict.fromkeys(envelope.recipients))
        outcomes: dict[str, Outcome] = {}

        def finish(remote_host: str | None = None, option_error: RouteOptionError | None = None, *, tls: bool = False) -> SMTPDelivery:
            return SMTPDelivery(
                outcomes={r: outcomes[r] for r in recipients}, remote_host=remote_host, tls=tls, option_error=option_error
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
                    last = self._expired("connecting")
                break
            if session_limit and greeted_failures >= session_limit:
                logger.debug("%s: MX_SESSION_LIMIT (%s) reached; %s not tried", envelope.item_id, session_limit, host)
                break
            while True:  # again while a pooled connection turns out stale: the next, or a new one
                try:
                    session = self._session(host, policy, route, envelope.item_id, deadline)
                except _StepError as failure:
                    last, last_host = failure, host
                    if failure.greeted and failure.status is RecipientStatus.DEFERRED:
                        greeted_failures += 1
                    if failure.reply.code is None:  # a server's reply was logged with its step
                        logger.debug("%s %s: %s", envelope.item_id, host, failure.reply.text)
                    break
                except _RouteRefusedError as failure:
                    self._option_failed(failure.error, pending, outcomes)
                    return finish(host.name, failure.error)
                if self._transact(session, envelope, message, pending, outcomes, deadline):
                    return finish(host.name, tls=session.conn.tls)

        if last is None:
            last = _StepError(_own("4.4.4", "There is no host to deliver to."))
        outcomes.update((r, Outcome(status=last.status, reply=last.reply)) for r in pending)
        answered = last.answered and last_host is not None
        return finish(last_host.name if answered and last_host is not None else None, tls=answered and last.tls)

    def close_idle(self) -> None:
        """QUIT and close the pooled connections idle longer than ``reuse_seconds``."""
        now = self._clock()
        stale: list[_Session] = []
        with self._lock:
            for key in list(self._pool):
                idle = self._pool[key]
                stale.extend(s for s in idle if now - s.last_used > self._reuse_seconds)
                idle[:] = [s for s in idle if now - s.last_used <= self._reuse_seconds]
                if not idle:
                    del self._pool[key]
        self._quit_all(stale)

    def close(self) -> None:
        """QUIT and close every pooled connection."""
        with self._lock:
            sessions = [s for idle in self._pool.values() for s in idle]
            self._pool.clear()
        self._quit_all(sessions)

    def pooled_count(self) -> int:
        """Return how many idle connections the pool holds."""
        with self._lock:
            return sum(len(idle) for idle in self._pool.values())

    # -- sessions -------------------------------------------------------------------

    def _option_failed(self, error: RouteOptionError, pending: Iterable[str], outcomes: dict[str, Outcome]) -> None:
        logger.warning("%s: the route cannot be used: %s", error.item_id, error.message)
        reply = _own("4.3.5", f"The route's configuration was refused: {error.message}")
        outcomes.update((r, Outcome(status=RecipientStatus.DEFERRED, reply=reply)) for r in pending)

    def _session_limit_text(self) -> str:
        return f'the session\'s time limit, TIMEOUTS["SESSION"] ({self._timeouts.session:g} s),'

    def _expired(self, doing: str) -> _StepError:
        return _StepError(_own("4.4.2", f"{self._session_limit_text().capitalize()} ran out before {doing}"))

    def _arm(self, conn: _Connection, step: str, deadline: float, doing: str) -> None:
        """Start a step of ``conn``: it may last its own timeout (RFC 5321 §4.5.3.2) or
        what is left of the session, whichever ends first, however the peer sends."""
        now = self._clock()
        if deadline - now <= 0:
            raise self._expired(doing)
        seconds = getattr(self._timeouts, step)
        if now + seconds <= deadline:
            conn.arm(_Step(ends_at=now + seconds, limit=f'TIMEOUTS["{step.upper()}"] ({seconds:g} s)', doing=doing))
        else:
            conn.arm(_Step(ends_at=deadline, limit=self._session_limit_text(), doing=doing))

    def _tls_context(self, *, verify: bool) -> ssl.SSLContext:
        with self._lock:
            context = self._contexts.get(verify)
            if context is None:
                context = self._contexts[verify] = ssl.create_default_context() if verify else _unverified_context()
            return context

    def _session(self, host: Host, policy: _Policy, route: Route, item_id: str, deadline: float) -> _Session:
        key = _Key(host.name.lower(), host.address, host.port, policy)
        while (session := self._take(key)) is not None:
            if session.conn.has_extn("pipelining"):
                # Its RSET goes with MAIL, RCPT and DATA: no round trip of its own.
                session.reused = True
                return session
            try:
                self._arm(session.conn, "mail", deadline, "waiting for the reply to RSET")
                code, _ = session.conn.rset()
            except (OSError, _StepError):
                code = -1
            if 200 <= code < 300:
                logger.debug("%s %s: reusing a connection, RSET -> %s", item_id, host, code)
                return session
            logger.debug("%s %s: a pooled connection failed RSET (%s); reconnecting", item_id, host, code)
            session.conn.close()
        return self._connect(host, key, route, item_id, deadline, starttls=True)

    def _connect(self, host: Host, key: _Key, route: Route, item_id: str, deadline: float, *, starttls: bool) -> _Session:
        """Open a session with ``host`` up to AUTH; raise ``_StepError`` to try the next host."""
        policy = key.policy
        conn = _Connection(
            local_hostname=self._hostname,
            host=host,
            clock=self._clock,
            on_connected=lambda: self._arm(conn, "greeting", deadline, "waiting for the greeting"),
            implicit_tls=self._tls_context(verify=policy.verify) if policy.tls is _TLS.IMPLICIT else None,
        )
        self._arm(conn, "connect", deadline, "connecting")
        try:
            return self._open(conn, host, key, route, item_id, deadline, starttls=starttls)
        except _StepError as failure:
            failure.greeted, failure.tls = failure.greeted or conn.heard, conn.tls
            raise

    def _open(
        self, conn: _Connection, host: Host, key: _Key, route: Route, item_id: str, deadline: float, *, starttls: bool
    ) -> _Session:
        policy = key.policy
        try:
            try:
                code, raw = conn.connect(host.name, host.port)
            except ssl.SSLError as error:
                raise _connect_failure(error, host) from None
            except (ValueError, OverflowError) as error:
                raise self._refused(f"smtplib cannot connect to {host}: {error}", item_id) from None
            except OSError as error:
                raise _connect_failure(error, host) from None
            logger.debug("%s %s: greeting -> %s", item_id, host, code)
            if not 200 <= code < 300:
                self._quit(conn)
                raise _StepError.of_reply(code, raw, when="as the greeting")
            self._hello(conn, host, item_id, deadline)
            tls_wanted = policy.tls in (_TLS.STARTTLS, _TLS.OPPORTUNISTIC) and starttls
            context = self._tls_context(verify=policy.verify) if tls_wanted else None
            if context is not None and not self._starttls(conn, host, policy, context, item_id, deadline):
                conn.close()  # an opportunistic handshake failed: again, without STARTTLS
                return self._connect(host, key, route, item_id, deadline, starttls=False)
            if policy.username is not None:
                self._login(conn, host, policy.username, route.password or "", item_id, deadline)
        except _StepError:
            conn.close()
            raise
        except _RouteRefusedError:
            self._quit(conn)
            raise
        except smtplib.SMTPServerDisconnected as error:
            conn.close()
            raise _lost(error, host, "before MAIL") from None
        except smtplib.SMTPResponseException as error:
            conn.close()
            raise _StepError.protocol(-1, _raw(error), when="before MAIL") from None
        except OSError as error:
            conn.close()
            raise _lost(error, host, "before MAIL") from None
        except BaseException:
            conn.close()
            raise
        return _Session(conn=conn, host=host, key=key)

    def _refused(self, message: str, item_id: str) -> _RouteRefusedError:
        return _RouteRefusedError(RouteOptionError(message, item_id=item_id))

    def _hello(self, conn: _Connection, host: Host, item_id: str, deadline: float) -> None:
        """EHLO, or HELO when EHLO gets a 5xx reply."""
        self._arm(conn, "greeting", deadline, "waiting for the reply to EHLO")
        try:
            code, raw = conn.ehlo(self._hostname)
        except ValueError as error:
            raise self._refused(f"smtplib refused the EHLO host name {self._hostname!r}: {error}", item_id) from None
        logger.debug("%s %s: EHLO -> %s", item_id, host, code)
        if code == 250:
            return
        if not 500 <= code < 600:
            self._quit(conn)
            raise _StepError.of_reply(code, raw, when="to EHLO")
        self._arm(conn, "greeting", deadline, "waiting for the reply to HELO")
        code, raw = conn.helo(self._hostname)
        logger.debug("%s %s: HELO -> %s", item_id, host, code)
        if not 200 <= code < 300:
            self._quit(conn)
            raise _StepError.of_reply(code, raw, when="to HELO")

    def _starttls(
        self, conn: _Connection, host: Host, policy: _Policy, context: ssl.SSLContext, item_id: str, deadline: float
    ) -> bool:
        """Upgrade to TLS when offered or required; return ``False`` when an opportunistic handshake failed."""
        required = policy.tls is _TLS.STARTTLS
        if not conn.has_extn("starttls"):
            if required:
                self._quit(conn)
                raise _StepError(_own("4.7.0", f"TLS is required but {host} does not offer STARTTLS"), answered=True)
            return True
        self._arm(conn, "greeting", deadline, "waiting for the reply to STARTTLS")
        try:
            code, raw = conn.starttls(context=context)
        except (smtplib.SMTPServerDisconnected, _DeadlineError):
            raise
        except smtplib.SMTPResponseException as error:  # smtplib raises for any reply but 220
            code, raw = error.smtp_code, _raw(error)
        except (OSError, ValueError) as error:  # after the 220: the handshake
            logger.debug("%s %s: TLS handshake failed: %s", item_id, host, error)
            if not required:
                return False
            if _timed_out(error):
                raise _StepError(_own("4.4.2", f"Timed out in the TLS handshake with {host}")) from None
            raise _StepError(_own("4.7.5", f"TLS handshake with {host} failed: {error}"), answered=True) from None
        logger.debug("%s %s: STARTTLS -> %s", item_id, host, code)
        conn.tls = code == 220
        if code != 220:
            if required:
                self._quit(conn)
                refused = reply_from(code, raw)
                text = f"TLS is required but {host} refused STARTTLS: {code} {refused.text}"
                raise _StepError(_own("4.7.0", text), answered=True)
            return True  # opportunistic: go on in plain text
        self._arm(conn, "greeting", deadline, "waiting for the reply to EHLO")
        code, raw = conn.ehlo(self._hostname)
        logger.debug("%s %s: EHLO -> %s", item_id, host, code)
        if code != 250:
            self._quit(conn)
            raise _StepError.of_reply(code, raw, when="to EHLO after STARTTLS")
        return True

    def _login(self, conn: _Connection, host: Host, username: str, password: str, item_id: str, deadline: float) -> None:
        self._arm(conn, "greeting", deadline, "waiting for the reply to AUTH")
        # A server may echo what AUTH sent in its replies; none of it may be kept.
        conn.redact(username, password)
        try:
            code, _ = conn.login(username, password)
        except smtplib.SMTPAuthenticationError as error:
            logger.debug("%s %s: AUTH -> %s", item_id, host, error.smtp_code)
            self._quit(conn)
            reply = reply_from(error.smtp_code, error.smtp_error)
            if 500 <= error.smtp_code < 600:
                # Wrong credentials: a configuration to fix, not a reason to lose mail.
                raise _StepError(
                    Reply(code=reply.code, status="4.7.8", text=reply.text), answered=True
                ) from None
            raise _StepError.of_reply(error.smtp_code, _raw(error), when="to AUTH") from None
        except smtplib.SMTPNotSupportedError:
            raise self._refused(f"The route has a USERNAME but {host} does not offer AUTH here.", item_id) from None
        except (smtplib.SMTPServerDisconnected, smtplib.SMTPResponseException):
            raise
        except smtplib.SMTPException:
            raise self._refused(
                f"{host} offers no AUTH mechanism smtplib can use (it knows CRAM-MD5, PLAIN, LOGIN).", item_id
            ) from None
        except ValueError:
            # Never the exception's text: it could quote a character of the password.
            raise self._refused("smtplib cannot send the route's USERNAME or PASSWORD (not ASCII).", item_id) from None
        finally:
            conn.user = conn.password = ""  # smtplib keeps them on the object otherwise
        logger.debug("%s %s: AUTH -> %s", item_id, host, code)

    # -- the transactions -----------------------------------------------------------

    def _transact(
        self,
        session: _Session,
        envelope: Envelope,
        message: _Message,
        pending: list[str],
        outcomes: dict[str, Outcome],
        deadline: float,
    ) -> bool:
        """Give every recipient of ``pending`` an outcome on ``session``; pool or close it.

        Return ``False``, having decided nothing, when ``session`` came from the pool
        and turned out closed: the caller takes another.
        """
        reusable = False
        try:
            self._transactions(session, envelope, message, pending, outcomes, deadline)
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
            if reusable:
                self._give(session)
            else:
                session.conn.close()
        return True

    def _settle(self, pending: Iterable[str], outcomes: dict[str, Outcome], failure: _StepError) -> None:
        outcome = Outcome(status=failure.status, reply=failure.reply)
        outcomes.update((r, outcome) for r in pending if r not in outcomes)

    def _command(self, session: _Session, item_id: str, step: str, deadline: float, verb: str, args: str = "") -> tuple[int, bytes]:
        """Send ``verb`` and read its reply, the two within one step."""
        self._arm(session.conn, step, deadline, f"waiting for the reply to {verb}")
        session.conn.putcmd(verb, args)
        return self._reply(session, item_id, step, deadline, verb, args, armed=True)

    def _reply(
        self, session: _Session, item_id: str, step: str, deadline: float, verb: str, args: str = "", *, armed: bool = False
    ) -> tuple[int, bytes]:
        """Read the reply to ``verb``, sent already; a 421 or a malformed reply raises."""
        if not armed:
            self._arm(session.conn, step, deadline, f"waiting for the reply to {verb}")
        code, raw = session.conn.getreply()
        logger.debug("%s %s: %s -> %s", item_id, session.host, f"{verb} {args}".rstrip(), code)
        if code == 421:
            raise _StepError.of_reply(code, raw, when=f"to {verb}")
        if _status_of(code) is None and not (verb == "DATA" and code == 354):
            raise _StepError.protocol(code, raw, when=f"to {verb}")
        return code, raw

    def _transactions(
        self,
        session: _Session,
        envelope: Envelope,
        message: _Message,
        pending: list[str],
        outcomes: dict[str, Outcome],
        deadline: float,
    ) -> None:
        """Run transactions until every recipient of ``pending`` has an outcome."""
        conn, item_id = session.conn, envelope.item_id
        utf8 = conn.has_extn("smtputf8")
        if not utf8:
            reply = _own("5.6.7", f"{session.host} does not offer SMTPUTF8, which this non-ASCII address needs")
            unsendable = pending if needs_smtputf8(envelope.sender) else [r for r in pending if needs_smtputf8(r)]
            outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in unsendable)
        todo = [r for r in pending if r not in outcomes]
        limit = conn.esmtp_features.get("size", "").strip()
        if todo and limit.isdigit() and 0 < int(limit) < message.size:
            reply = _own("5.3.4", f"The message ({message.size} bytes) is larger than {session.host} takes ({int(limit)} bytes)")
            outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in todo)
            todo = []
        options = []
        if conn.has_extn("size"):
            options.append(f"SIZE={message.size}")
        if message.eight_bit and conn.has_extn("8bitmime"):
            options.append("BODY=8BITMIME")
        if utf8 and (needs_smtputf8(envelope.sender) or any(map(needs_smtputf8, todo))):
            options.append("SMTPUTF8")

        if conn.has_extn("pipelining"):
            reset = session.reused
            while todo:
                todo = self._pipelined(session, envelope, message, todo, outcomes, deadline, options, reset=reset)
                reset = True
            return
        first = True
        while todo:
            if not first:
                self._rset(session, item_id, deadline)
            first = False
            if "SMTPUTF8" in options:
                conn.command_encoding = "utf-8"  # RSET sets it back to ASCII
            mail_args = f"FROM:<{envelope.sender}>" + "".join(f" {o}" for o in options)
            try:
                code, raw = self._command(session, item_id, "mail", deadline, "MAIL", mail_args)
            except ValueError as error:  # refused by smtplib, nothing was sent
                reply = _own("5.1.7", f"smtplib refused the sender address: {error}")
                outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in todo)
                return
            if not 200 <= code < 300:
                outcome = _outcome(code, raw)
                outcomes.update((r, outcome) for r in todo)
                return
            todo = self._recipients(session, envelope, message, todo, outcomes, deadline)

    def _pipelined(
        self,
        session: _Session,
        envelope: Envelope,
        message: _Message,
        todo: list[str],
        outcomes: dict[str, Outcome],
        deadline: float,
        options: list[str],
        *,
        reset: bool,
    ) -> list[str]:
        """One transaction with RFC 2920 pipelining: ``[RSET] MAIL RCPT... DATA`` in one
        write, their replies read in order, then the message; return the recipients
        left for another transaction (after a 452)."""
        conn, item_id = session.conn, envelope.item_id
        encoding = "utf-8" if "SMTPUTF8" in options else "ascii"
        mail_args = f"FROM:<{envelope.sender}>" + "".join(f" {o}" for o in options)
        try:
            group = [f"MAIL {mail_args}\r\n".encode(encoding)]
        except UnicodeEncodeError as error:
            reply = _own("5.1.7", f"smtplib refused the sender address: {error}")
            outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in todo)
            return []
        sent: list[str] = []
        for recipient in todo:
            try:
                group.append(f"RCPT TO:<{recipient}>\r\n".encode(encoding))
            except UnicodeEncodeError as error:
                reply = _own("5.1.3", f"smtplib refused the recipient address: {error}")
                outcomes[recipient] = Outcome(status=RecipientStatus.FAILED, reply=reply)
                continue
            sent.append(recipient)
        if not sent:
            return []
        if reset:
            group.insert(0, b"RSET\r\n")
        group.append(b"DATA\r\n")
        self._arm(conn, "mail", deadline, "sending MAIL")
        try:
            conn.send(b"".join(group))
            if reset:
                code, raw = self._reply(session, item_id, "mail", deadline, "RSET")
                if not 200 <= code < 300:
                    raise _StepError.of_reply(code, raw, when="to RSET")
        except (OSError, smtplib.SMTPException, _StepError) as error:
            if session.reused:
                raise _StaleConnectionError from error
            raise
        session.reused = False
        mail_code, mail_raw = self._reply(session, item_id, "mail", deadline, "MAIL", mail_args)
        accepted: list[str] = []
        left: list[str] = []
        too_many: Outcome | None = None
        for recipient in sent:
            code, raw = self._reply(session, item_id, "rcpt", deadline, "RCPT", f"TO:<{recipient}>")
            if not 200 <= mail_code < 300:
                continue  # refused after a refused MAIL: the MAIL reply decides
            if code == 452:
                too_many = _outcome(code, raw)
                left.append(recipient)
            elif 200 <= code < 300:
                accepted.append(recipient)
            else:
                outcomes[recipient] = _outcome(code, raw)
        code, raw = self._reply(session, item_id, "data", deadline, "DATA")
        if not 200 <= mail_code < 300:
            outcome = _outcome(mail_code, mail_raw)
            outcomes.update((r, outcome) for r in sent)
            left = []
        elif too_many is not None and left == sent:
            # Not one recipient was decided: another transaction would get the same.
            outcomes.update((r, too_many) for r in left)
            left = []
        self._after_data(session, item_id, code, raw, message, accepted, outcomes, deadline)
        return left

    def _after_data(
        self,
        session: _Session,
        item_id: str,
        code: int,
        raw: bytes,
        message: _Message,
        accepted: list[str],
        outcomes: dict[str, Outcome],
        deadline: float,
    ) -> None:
        """Act on the reply to DATA: send the message after a 354, else it decides ``accepted``."""
        if code == 354:
            if accepted:
                self._send_message(session, item_id, message, accepted, outcomes, deadline)
            else:
                self._end_empty_data(session, item_id, deadline)
        elif 200 <= code < 300:
            raise _StepError.protocol(code, raw, when="to DATA")
        else:
            outcome = _outcome(code, raw)
            outcomes.update((r, outcome) for r in accepted)

    def _end_empty_data(self, session: _Session, item_id: str, deadline: float) -> None:
        # DATA went with the recipients, every one was refused, and yet the server
        # said 354: end the message at once; no recipient takes it (RFC 2920 §3.1).
        self._arm(session.conn, "data_block", deadline, "ending an empty message")
        session.conn.send(b".\r\n")
        self._reply(session, item_id, "data_end", deadline, "DATA (empty)")

    def _recipients(
        self,
        session: _Session,
        envelope: Envelope,
        message: _Message,
        todo: list[str],
        outcomes: dict[str, Outcome],
        deadline: float,
    ) -> list[str]:
        """RCPT each of ``todo`` then DATA, in the open transaction; return the recipients left for another."""
        item_id = envelope.item_id
        accepted: list[str] = []
        left: list[str] = []
        too_many: Outcome | None = None
        for index, recipient in enumerate(todo):
            try:
                code, raw = self._command(session, item_id, "rcpt", deadline, "RCPT", f"TO:<{recipient}>")
            except ValueError as error:  # refused by smtplib, nothing was sent
                reply = _own("5.1.3", f"smtplib refused the recipient address: {error}")
                outcomes[recipient] = Outcome(status=RecipientStatus.FAILED, reply=reply)
                continue
            if code == 452:
                too_many = _outcome(code, raw)
                left = todo[index:]
                break
            if 200 <= code < 300:
                accepted.append(recipient)
            else:
                outcomes[recipient] = _outcome(code, raw)
        if too_many is not None and left == todo:
            # Not one recipient was decided: another transaction would get the same.
            outcomes.update((r, too_many) for r in left)
            left = []
        if accepted:
            code, raw = self._command(session, item_id, "data", deadline, "DATA")
            self._after_data(session, item_id, code, raw, message, accepted, outcomes, deadline)
        elif not left:
            self._rset(session, item_id, deadline)  # no DATA: close the transaction (the next one starts with RSET)
        return left

    def _rset(self, session: _Session, item_id: str, deadline: float) -> None:
        code, raw = self._command(session, item_id, "mail", deadline, "RSET")
        if not 200 <= code < 300:
            raise _StepError.of_reply(code, raw, when="to RSET")

    def _send_message(
        self, session: _Session, item_id: str, message: _Message, accepted: list[str], outcomes: dict[str, Outcome], deadline: float
    ) -> None:
        """Send the message after a 354; its reply decides every accepted recipient."""
        conn = session.conn
        view = memoryview(message.data)
        for start in range(0, len(view), BLOCK_SIZE):
            self._arm(conn, "data_block", deadline, "sending the message")
            try:
                conn.send(view[start : start + BLOCK_SIZE])
            except smtplib.SMTPServerDisconnected as error:
                raise _lost(error, session.host, "while sending the message") from None
        self._arm(conn, "data_end", deadline, "waiting for the reply to the message")
        try:
            code, raw = conn.getreply()
        except smtplib.SMTPServerDisconnected as error:
            raise _lost(error, session.host, "waiting for the reply to the message") from None
        logger.debug("%s %s: message of %s bytes -> %s", item_id, session.host, message.size, code)
        if _status_of(code) is None:
            raise _StepError.protocol(code, raw, when="to the message")
        outcome = _outcome(code, raw)
        outcomes.update((r, outcome) for r in accepted)
        if code == 421:
            raise _StepError.of_reply(code, raw, when="to the message")

    # -- the pool -------------------------------------------------------------------

    def _take(self, key: _Key) -> _Session | None:
        """Return the most recently used pooled connection for ``key``, if still fresh."""
        stale: list[_Session] = []
        found: _Session | None = None
        now = self._clock()
        with self._lock:
            idle = self._pool.get(key, [])
            while idle and found is None:
                session = idle.pop()
                if now - session.last_used <= self._reuse_seconds:
                    found = session
                else:
                    stale.append(session)
            if not idle:
                self._pool.pop(key, None)
        self._quit_all(stale)
        return found

    def _give(self, session: _Session) -> None:
        if self._reuse_seconds <= 0 or session.conn.sock is None:
            self._quit(session.conn)
            return
        session.last_used = self._clock()
        with self._lock:
            self._pool.setdefault(session.key, []).append(session)

    def _quit_all(self, sessions: Iterable[_Session]) -> None:
        for session in sessions:
            self._quit(session.conn)

    def _quit(self, conn: _Connection) -> None:
        """QUIT, briefly and without minding the answer, then close."""
        try:
            if conn.sock is not None:
                seconds = min(_QUIT_TIMEOUT, self._timeouts.mail)
                conn.arm(_Step(ends_at=self._clock() + seconds, limit=f"{seconds:g} s", doing="waiting for the reply to QUIT"))
                conn.quit()
        except (OSError, _StepError):
            pass
        finally:
            conn.close()


def _raw(error: smtplib.SMTPResponseException) -> bytes:
    """Return the reply text an smtplib exception carries, as the bytes read."""
    text = error.smtp_error
    return text if isinstance(text, bytes) else text.encode("utf-8", "replace")


def _outcome(code: int, raw: bytes) -> Outcome:
    """Return the outcome a reply decides (its code being a 2xx, 4xx or 5xx)."""
    status = _status_of(code)
    assert status is not None
    return Outcome(status=status, reply=reply_from(code, raw))
