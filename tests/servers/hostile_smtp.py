"""A raw-socket SMTP server on loopback that misbehaves as a test scripts it.

aiosmtpd answers well-formed, whole replies; a hostile server does not: it sends its
greeting one byte at a time, a reply of endless lines, a line with no end, nothing at
all. ``HostileSMTPServer(script)`` calls ``script(peer)`` in a thread of its own for
each connection it accepts; a :class:`Peer` holds what such a script needs:

``send(data)`` / ``dribble(data, interval)`` / ``flood(line, total)``
    Send bytes at once, one byte every ``interval`` seconds, or ``line`` again and
    again up to ``total`` octets. Each raises :class:`ClientGoneError` once the client has
    closed the connection.
``read_line()``
    The next command line from the client (``ClientGoneError`` at its end).
``buffered()``
    Whether more of the client's bytes were read with the last line: it sent them in
    one write, without waiting for a reply (pipelining).
``serve_until(verb)``
    Answer as a plain server would (greeting excluded): EHLO (offering STARTTLS when
    ``tls`` is given), HELO, MAIL, RCPT, RSET, NOOP with 250, DATA with 354 and, after
    the final dot, 250; return the verb the script stops at, unanswered. ``"DATA_END"``
    stops once the final dot has been read. QUIT is answered and ends the script.
``start_tls(context)``
    The server's side of the TLS handshake, after a 220 to STARTTLS.
``hold()``
    Say nothing more until the client goes.

Each peer records ``commands`` (the client's command lines), ``hung_up`` (the client
closed the connection while the script was still going) and ``finished`` (the script
ran to its end). ``server.peers`` lists them, in the order the connections came.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest

_HOLD_LIMIT = 60.0


class ClientGoneError(Exception):
    """The client closed the connection."""


class Peer:
    """One connection of a :class:`HostileSMTPServer`, as its script sees it."""

    def __init__(self, sock: socket.socket, number: int) -> None:
        self.sock = sock
        self.number = number
        self.commands: list[str] = []
        self.hung_up = False
        self.finished = False
        self._inbox = b""

    def _gone(self) -> ClientGoneError:
        self.hung_up = True
        return ClientGoneError()

    def client_closed(self) -> bool:
        """Return whether the client has closed its side (without reading a command)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            return bool(readable) and self.sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def send(self, data: bytes) -> None:
        if self.client_closed():
            raise self._gone()
        try:
            self.sock.sendall(data)
        except OSError:
            raise self._gone() from None

    def dribble(self, data: bytes, interval: float) -> None:
        for index in range(len(data)):
            self.send(data[index : index + 1])
            time.sleep(interval)

    def flood(self, line: bytes, total: int) -> None:
        chunk = line * max(1, 65536 // len(line))
        sent = 0
        while sent < total:
            self.send(chunk)
            sent += len(chunk)

    def hold(self) -> None:
        deadline = time.monotonic() + _HOLD_LIMIT
        while time.monotonic() < deadline:
            if self.client_closed():
                raise self._gone()
            time.sleep(0.02)

    def read_line(self) -> str:
        while b"\n" not in self._inbox:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                raise self._gone()
            self._inbox += data
        line, _, self._inbox = self._inbox.partition(b"\n")
        text = line.rstrip(b"\r").decode("utf-8", "replace")
        self.commands.append(text)
        return text

    def buffered(self) -> bool:
        return bool(self._inbox)

    def start_tls(self, context: ssl.SSLContext) -> None:
        self._inbox = b""
        self.sock.settimeout(10)
        self.sock = context.wrap_socket(self.sock, server_side=True)

    def serve_until(self, stop: str, *, tls: bool = False) -> str:
        while True:
            line = self.read_line()
            verb = line.split(" ", 1)[0].upper()
            if verb == stop:
                return verb
            if verb == "EHLO":
                self.send(b"250-hostile.test\r\n" + (b"250-STARTTLS\r\n" if tls else b"") + b"250 8BITMIME\r\n")
            elif verb == "DATA":
                self.send(b"354 Go ahead\r\n")
                while self.read_line() != ".":
                    pass
                if stop == "DATA_END":
                    return stop
                self.send(b"250 2.0.0 Queued\r\n")
            elif verb == "QUIT":
                self.send(b"221 2.0.0 Bye\r\n")
                return verb
            else:
                self.send(b"250 2.0.0 OK\r\n")


class HostileSMTPServer:
    """Listens on 127.0.0.1 (an ephemeral ``port``) and plays ``script`` on each connection."""

    def __init__(self, script: Callable[[Peer], None]) -> None:
        self.script = script
        self.host = "127.0.0.1"
        self.peers: list[Peer] = []
        self._listener = socket.create_server((self.host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, name=f"hostile-smtp-{self.port}", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            peer = Peer(sock, len(self.peers) + 1)
            self.peers.append(peer)
            thread = threading.Thread(target=self._play, args=(peer,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _play(self, peer: Peer) -> None:
        try:
            self.script(peer)
            peer.finished = True
        except ClientGoneError:
            pass
        except OSError:
            peer.hung_up = True
        finally:
            with contextlib.suppress(OSError):
                peer.sock.close()

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        for peer in self.peers:
            with contextlib.suppress(OSError):
                peer.sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)


@pytest.fixture
def hostile_smtp() -> Iterator[Callable[[Callable[[Peer], None]], HostileSMTPServer]]:
    """Start hostile servers on demand: ``hostile_smtp(script)``; all stopped afterwards."""
    started: list[HostileSMTPServer] = []

    def start(script: Callable[[Peer], None]) -> HostileSMTPServer:
        server = HostileSMTPServer(script)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
