"""The connection to one host: smtplib's client, bounded in time and in what it reads.

Every step of a session is armed with a deadline (RFC 5321 §4.5.3.2 gives each step
its own timeout; the session's time bounds them all), and every ``recv`` and ``send``
gets what is left of it, however slowly the peer's bytes come.
"""

from __future__ import annotations

import base64
import dataclasses
import smtplib
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from bumail_queue.conf import Timeouts
from bumail_queue.delivery.envelope import Host

from .failures import _DeadlineError, _StepError
from .replies import MAX_REPLY_LINE, MAX_REPLY_LINES, _own

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

#: What an echoed credential becomes in a reply's text.
REDACTED = b"[redacted]"
# QUIT is a courtesy: never wait long for it.
_QUIT_TIMEOUT = 5.0
_RECV_SIZE = 8192


@dataclasses.dataclass(frozen=True, slots=True)
class _Step:
    """What the connection is doing, until when, and the limit that ends it then."""

    ends_at: float
    limit: str
    doing: str
    session: bool = False  # the session's time ends it, not the step's own timeout


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
        user, secret = (username.encode("utf-8", "replace"), password.encode("utf-8", "replace"))
        forms = {secret, *(base64.b64encode(x) for x in (secret, user, b"\0" + user + b"\0" + secret))}
        self._secrets = sorted((f for f in forms if f), key=len, reverse=True)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        # smtplib keeps the name given to __init__ only, and starttls() checks it.
        self._host = host
        try:
            sock = socket.create_connection(
                (self._target.address or host, port), self._time_left(), self.source_address
            )
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
        text = f"Timed out {self._step.doing} ({self._target}): {self._step.limit} ran out"
        return _DeadlineError(text, session=self._step.session)

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

    def unread(self) -> bytes:
        """Return what the server has sent that was not read yet, without waiting (``b""``: nothing).

        Asked when no reply is outstanding: anything there then is a reply out of step
        (or a 421 before a kept connection closes). It stays for the next read.
        """
        sock = self.sock
        if sock is None:
            return b""
        if self._inbox_of is not sock:
            self._inbox.clear()
            self._inbox_of = sock
        if not self._inbox:
            try:
                sock.settimeout(0.0)
                data = sock.recv(_RECV_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError):
                return b""
            except OSError:
                return b""  # the connection is gone: the next step says so
            self._inbox += data  # b"" when closed: the next step says so
        return bytes(self._inbox)

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


class _Steps:
    """Arms each step of a connection with its deadline: the step's timeout or what is
    left of the session, whichever ends first."""

    def __init__(self, timeouts: Timeouts, clock: Callable[[], float]) -> None:
        self._timeouts = timeouts
        self._clock = clock

    def session_limit_text(self) -> str:
        return f'the session\'s time limit, TIMEOUTS["SESSION"] ({self._timeouts.session:g} s),'

    def expired(self, doing: str) -> _StepError:
        return _StepError(_own("4.4.2", f"{self.session_limit_text().capitalize()} ran out before {doing}"))

    def arm(self, conn: _Connection, step: str, deadline: float, doing: str) -> None:
        """Start a step of ``conn``: it may last its own timeout (RFC 5321 §4.5.3.2) or
        what is left of the session, whichever ends first, however the peer sends."""
        now = self._clock()
        if deadline - now <= 0:
            raise self.expired(doing)
        seconds = getattr(self._timeouts, step)
        if now + seconds <= deadline:
            conn.arm(_Step(ends_at=now + seconds, limit=f'TIMEOUTS["{step.upper()}"] ({seconds:g} s)', doing=doing))
        else:
            conn.arm(_Step(ends_at=deadline, limit=self.session_limit_text(), doing=doing, session=True))

    def quit(self, conn: _Connection) -> None:
        """QUIT, briefly and without minding the answer, then close."""
        self.quit_all([conn])

    def quit_all(self, conns: Iterable[_Connection]) -> None:
        """QUIT each connection, briefly and without minding the answers, then close it.

        Every QUIT goes out before any reply is read, and one deadline bounds them all:
        closing twenty connections to a distant server costs one round trip, not twenty.
        """
        seconds = min(_QUIT_TIMEOUT, self._timeouts.mail)
        step = _Step(ends_at=self._clock() + seconds, limit=f"{seconds:g} s", doing="waiting for the reply to QUIT")
        said: list[_Connection] = []
        for conn in conns:
            try:
                if conn.sock is not None:
                    conn.arm(step)
                    conn.putcmd("quit")
                    said.append(conn)
                    continue
            except (OSError, _StepError):
                pass
            conn.close()
        for conn in said:
            try:
                conn.getreply()
            except (OSError, _StepError):
                pass
            finally:
                conn.close()
