"""Real SMTP servers on loopback whose every reply a test can script (aiosmtpd).

Fixtures (import them into a test module, or name this module in ``pytest_plugins``):

``smtp_server``
    One started :class:`SMTPTestServer` with the default behaviour: it accepts
    everything, offers SIZE (10 MiB), 8BITMIME and SMTPUTF8, no STARTTLS, no AUTH.
``smtp_servers``
    A factory: ``smtp_servers(**knobs)`` starts one more server and returns it
    (several for an MX host list). Every server it started is stopped after the test.
``smtp_tls``
    A :class:`TestTLS`: a test CA, a certificate for ``localhost``, ``127.0.0.1`` and
    ``mx.test``, ``server_context`` to give a server (``tls=``) and
    ``client_context``, which trusts the CA, to give a client.

:class:`SMTPTestServer` listens on ``host`` (127.0.0.1, or another loopback address
given, so that several MX hosts share ``MX_PORT``), ``port`` (an ephemeral one
unless given: ``smtp_servers(port=closed_port())`` brings up a host that refused a
client a moment ago) and records:

- ``messages``: a :class:`ReceivedMessage` for each message the server accepted
  (``mail_from``, ``""`` for the null sender, ``mail_options`` such as ``["SIZE=123", "BODY=8BITMIME"]``,
  ``rcpt_tos``, ``data`` as received, dot-stuffing undone, ``connection``, and
  ``read``, the read of the connection that brought its final dot, and ``received_at``,
  the ``time.monotonic()`` of that dot);
- ``connections``: how many TCP connections it accepted;
- ``sessions_open`` and ``most_sessions``: how many sessions are open now, and the
  most that were open at once. A session is open from its connection until its QUIT
  (before the 221 goes out, so a client that waits for the 221 before starting
  another never seems to overlap it) or the connection's end;
- ``commands``: a :class:`Command` (``connection``, ``verb``, ``arg``, ``read``, ``at``:
  its ``time.monotonic()``) per command received; an AUTH command's ``arg`` is only its
  mechanism. ``read`` numbers the reads of its connection (from 1): commands that came
  in one write of a client that waits for its replies between writes share one;
- ``logins``: the usernames that logged in.

``open_connections()`` counts the connections open now; ``hang_up(reply=None)`` closes every open connection from the server's side, as an
idle timeout does, after saying ``reply`` (``"421 4.4.2 Idle for too long"``) if given.

Knobs, given to ``smtp_servers(...)`` or set as attributes at any time (a reply knob
is read when its command arrives; ``size_limit``, ``smtputf8``, ``tls``, ``auth``
and ``auth_require_tls`` when a connection opens; ``implicit_tls`` at start):

``greeting``
    The greeting (``"220 mx.test ESMTP"``). A 421 closes the connection after it;
    any other non-2xx greeting gets ``503 5.5.1`` for every command but QUIT.
``ehlo_reply`` / ``helo_reply``
    Replace the reply to EHLO (e.g. ``"502 5.5.2 No EHLO"``, to make a client fall
    back to HELO) or HELO.
``starttls_reply``, ``auth_reply``, ``mail_reply``, ``rset_reply``, ``data_reply``
    Replace the reply to STARTTLS, AUTH, MAIL, RSET, DATA (``data_reply`` replaces the
    ``354``). ``mail_reply`` starting with 2 still opens the transaction. ``mail_reply``
    and ``data_reply`` may be lists, for the successive MAILs or DATAs, the last one
    repeating; a ``None`` in them is the usual reply.
``rcpt_replies``
    ``{address: reply}``, e.g. ``{"bad@x": "550 5.1.1 No such user", "later@x":
    "451 4.3.0 Try later", "full@x": "452 4.5.3 Too many recipients"}``; a list gives
    the replies to that address's successive RCPTs, its last one repeating. A 2xx
    reply accepts the recipient. Others get ``250 2.1.5 OK``.
``max_recipients``
    Answer ``452 4.5.3 Too many recipients`` once a transaction has that many.
``message_reply``
    The reply after the final dot (``"250 2.0.0 Queued"``), or a list for the
    successive messages, its last one repeating.
``hold_dots``
    While ``True``, the reply to each final dot waits (``held`` counts the replies
    waiting now, ``most_held`` the most at once); set it ``False`` to let them go.
``drop_at`` / ``stall_at`` and ``stall_seconds`` (30)
    A step at which the server closes the connection without a reply, or waits
    ``stall_seconds`` before going on: ``"greeting"``, ``"EHLO"``, ``"HELO"``,
    ``"STARTTLS"`` (after its 220: the handshake fails), ``"AUTH"``, ``"MAIL"``,
    ``"RCPT"``, ``"DATA"``, ``"MESSAGE"`` (after the 354, before reading the message:
    a stall there is closed after it), ``"DATA_END"`` (after the final dot),
    ``"RSET"``, ``"NOOP"``, ``"QUIT"``.
``tls``
    A server ``ssl.SSLContext``: STARTTLS is offered with it (or, with
    ``implicit_tls=True``, the whole connection is TLS).
``auth``
    ``(username, password)``: AUTH PLAIN and LOGIN are offered and MAIL needs a
    login; ``auth_require_tls=True`` offers AUTH only after STARTTLS.
``size_limit``
    The SIZE offered and enforced (10 MiB); ``None`` offers no SIZE.
``smtputf8`` / ``eightbitmime`` / ``pipelining``
    Offer SMTPUTF8 / 8BITMIME / PIPELINING (all ``True``: aiosmtpd reads pipelined
    commands one after another, as RFC 2920 asks, though it does not say so).
``dsn``
    Offer DSN (RFC 3461; ``False``): its MAIL and RCPT parameters are taken, and
    kept only in ``commands``.

``closed_port()`` returns a loopback port nothing listens on (a connection is
refused); ``unanswered_port()``, a context manager, gives one whose connections are
never accepted (on Linux they time out).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiosmtpd.smtp import MISSING, SMTP, AuthResult, LoginPassword

_FOREVER = 3600.0
_DSN_PARAMETER = re.compile(r"(?i)(RET|ENVID|NOTIFY|ORCPT)=")
_STEPS = frozenset(
    {
        "greeting",
        "EHLO",
        "HELO",
        "STARTTLS",
        "AUTH",
        "MAIL",
        "RCPT",
        "DATA",
        "MESSAGE",
        "DATA_END",
        "RSET",
        "NOOP",
        "QUIT",
    }
)


@dataclasses.dataclass(frozen=True)
class ReceivedMessage:
    """A message the server accepted."""

    mail_from: str
    mail_options: list[str]
    rcpt_tos: list[str]
    data: bytes
    connection: int
    read: int = 0
    received_at: float = 0.0


@dataclasses.dataclass(frozen=True)
class Command:
    """A command the server received, on its ``connection`` (numbered from 1), in the
    ``read``-th read of that connection."""

    connection: int
    verb: str
    arg: str
    read: int = 0
    at: float = 0.0  # time.monotonic() when it arrived


@dataclasses.dataclass(kw_only=True)
class SMTPTestServer:
    """A scriptable SMTP server on 127.0.0.1, run in a thread of its own; see the module's doc."""

    greeting: str = "220 mx.test ESMTP test server"
    ehlo_reply: str | None = None
    helo_reply: str | None = None
    starttls_reply: str | None = None
    auth_reply: str | None = None
    mail_reply: str | list[str | None] | None = None
    rcpt_replies: dict[str, str | list[str]] = dataclasses.field(default_factory=dict)
    max_recipients: int | None = None
    rset_reply: str | None = None
    data_reply: str | list[str | None] | None = None
    message_reply: str | list[str] | None = None
    drop_at: str | None = None
    stall_at: str | None = None
    stall_seconds: float = 30.0
    hold_dots: bool = False
    tls: ssl.SSLContext | None = None
    implicit_tls: bool = False
    auth: tuple[str, str] | None = None
    auth_require_tls: bool = False
    size_limit: int | None = 10 * 1024 * 1024
    smtputf8: bool = True
    eightbitmime: bool = True
    pipelining: bool = True
    dsn: bool = False
    port: int = 0  # 0: an ephemeral port, set once listening

    host: str = "127.0.0.1"  # another loopback address (127.0.0.2) shares MX_PORT with the first
    messages: list[ReceivedMessage] = dataclasses.field(default_factory=list, init=False)
    commands: list[Command] = dataclasses.field(default_factory=list, init=False)
    logins: list[str] = dataclasses.field(default_factory=list, init=False)
    connections: int = dataclasses.field(default=0, init=False)
    held: int = dataclasses.field(default=0, init=False)
    most_held: int = dataclasses.field(default=0, init=False)
    sessions_open: int = dataclasses.field(default=0, init=False)
    most_sessions: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        for step in (self.drop_at, self.stall_at):
            if step is not None and step not in _STEPS:
                raise ValueError(f"unknown step {step!r}; the steps are {sorted(_STEPS)}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._live: set[_ScriptedSMTP] = set()
        self._rcpt_seen: dict[str, int] = {}
        self._messages_seen = 0
        self._seen: dict[str, int] = {}

    def verbs(self, connection: int | None = None) -> list[str]:
        """Return the verbs received, on one connection or on all."""
        return [c.verb for c in self.commands if connection is None or c.connection == connection]

    def open_connections(self) -> int:
        """Return how many connections are open now."""
        return len(self._live)

    def hang_up(self, reply: str | None = None) -> None:
        """Close every open connection from the server's side, saying ``reply`` first if given."""
        assert self._loop is not None
        done = threading.Event()

        def close_all() -> None:
            for protocol in list(self._live):
                if isinstance(protocol.transport, asyncio.WriteTransport):
                    if reply is not None:
                        protocol.transport.write(f"{reply}\r\n".encode())
                    protocol.transport.close()
            done.set()

        self._loop.call_soon_threadsafe(close_all)
        if not done.wait(10):
            raise RuntimeError("the test SMTP server did not hang up")

    # -- running --------------------------------------------------------------------

    def start(self) -> SMTPTestServer:
        """Start listening; return the server once it accepts connections."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                server = loop.run_until_complete(
                    loop.create_server(
                        self._protocol, host=self.host, port=self.port, ssl=self.tls if self.implicit_tls else None
                    )
                )
            except BaseException as error:  # reported by start()
                failure.append(error)
                ready.set()
                loop.close()
                return
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown(server))
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"smtp-test-server-{id(self):x}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the test SMTP server did not start")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        """Close every connection, stop listening, and end the thread."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    async def _shutdown(self, server: asyncio.Server) -> None:
        server.close()
        for protocol in list(self._live):
            if isinstance(protocol.transport, asyncio.WriteTransport):
                protocol.transport.abort()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    def _protocol(self) -> _ScriptedSMTP:
        assert self._loop is not None
        self.connections += 1
        return _ScriptedSMTP(self, self.connections, self._loop)

    # -- the script -----------------------------------------------------------------

    def _rcpt_reply(self, address: str, accepted: int) -> str:
        reply = self.rcpt_replies.get(address)
        if isinstance(reply, list):
            seen = self._rcpt_seen.get(address, 0)
            self._rcpt_seen[address] = seen + 1
            reply = reply[min(seen, len(reply) - 1)]
        if reply is None and self.max_recipients is not None and accepted >= self.max_recipients:
            reply = "452 4.5.3 Too many recipients"
        return reply or "250 2.1.5 OK"

    def _scripted_reply(self, verb: str, reply: str | list[str | None] | None) -> str | None:
        """The reply a knob gives to this ``verb``: its own, or its list's next."""
        if isinstance(reply, list):
            seen = self._seen.get(verb, 0)
            self._seen[verb] = seen + 1
            return reply[min(seen, len(reply) - 1)]
        return reply

    def _message_reply(self) -> str:
        reply = self.message_reply
        if isinstance(reply, list):
            reply = reply[min(self._messages_seen, len(reply) - 1)]
        self._messages_seen += 1
        return reply or "250 2.0.0 Queued"


class _Handler:
    """aiosmtpd's hooks, answering as the server's script says."""

    def __init__(self, script: SMTPTestServer) -> None:
        self.script = script

    async def handle_EHLO(
        self, server: _ScriptedSMTP, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        if self.script.ehlo_reply is not None:
            return [self.script.ehlo_reply]
        session.host_name = hostname
        lines = [r[4:] for r in responses]
        if not self.script.eightbitmime:
            lines = [x for x in lines if x.upper() != "8BITMIME"]
        if self.script.auth is None:
            lines = [x for x in lines if not x.upper().startswith("AUTH")]
        if self.script.pipelining:
            lines.insert(1, "PIPELINING")
        if self.script.dsn:
            lines.insert(1, "DSN")
        return [f"250-{x}" for x in lines[:-1]] + [f"250 {lines[-1]}"]

    async def handle_HELO(self, server: _ScriptedSMTP, session: Any, envelope: Any, hostname: str) -> str:
        if self.script.helo_reply is not None:
            return self.script.helo_reply
        session.host_name = hostname
        return f"250 {server.hostname}"

    async def handle_AUTH(self, server: _ScriptedSMTP, session: Any, envelope: Any, args: list[str]) -> Any:
        return self.script.auth_reply if self.script.auth_reply is not None else MISSING

    async def handle_MAIL(
        self, server: _ScriptedSMTP, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if self.script.auth is not None and not session.authenticated:
            return "530 5.7.0 Authentication required"
        reply = self.script._scripted_reply("MAIL", self.script.mail_reply) or "250 2.1.0 OK"
        if reply.startswith("2"):
            envelope.mail_from = address
            envelope.mail_options.extend(options)
        return reply

    async def handle_RCPT(
        self, server: _ScriptedSMTP, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        reply = self.script._rcpt_reply(address, len(envelope.rcpt_tos))
        if reply.startswith("2"):
            envelope.rcpt_tos.append(address)
        return reply

    async def handle_RSET(self, server: _ScriptedSMTP, session: Any, envelope: Any) -> Any:
        return self.script.rset_reply if self.script.rset_reply is not None else MISSING

    async def handle_DATA(self, server: _ScriptedSMTP, session: Any, envelope: Any) -> str:
        await server.scripted("DATA_END")
        if self.script.hold_dots:
            self.script.held += 1
            self.script.most_held = max(self.script.most_held, self.script.held)
            while self.script.hold_dots:
                await asyncio.sleep(0.01)
            self.script.held -= 1
        reply = self.script._message_reply()
        if reply.startswith("2"):
            self.script.messages.append(
                ReceivedMessage(
                    mail_from="" if envelope.mail_from == "<>" else envelope.mail_from,
                    mail_options=list(envelope.mail_options),
                    rcpt_tos=list(envelope.rcpt_tos),
                    data=bytes(envelope.original_content),
                    connection=server.number,
                    read=server.reads,
                    received_at=time.monotonic(),
                )
            )
        return reply


class _ScriptedSMTP(SMTP):
    """One connection of an :class:`SMTPTestServer`."""

    def __init__(self, script: SMTPTestServer, number: int, loop: asyncio.AbstractEventLoop) -> None:
        self.script = script
        self.number = number
        self.reads = 0
        self._greeted = False
        self._greeting_refused = False
        self._session_open = False
        super().__init__(
            _Handler(script),
            data_size_limit=script.size_limit,
            enable_SMTPUTF8=script.smtputf8,
            hostname="mx.test",
            ident="test server",
            tls_context=None if script.implicit_tls else script.tls,
            auth_require_tls=script.auth_require_tls,
            authenticator=self._check_login,
            timeout=60,
            loop=loop,
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.script._live.add(self)
        self._session_open = True
        self.script.sessions_open += 1
        self.script.most_sessions = max(self.script.most_sessions, self.script.sessions_open)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        self.script._live.discard(self)
        self._end_session()
        super().connection_lost(error)

    def _end_session(self) -> None:
        if self._session_open:
            self._session_open = False
            self.script.sessions_open -= 1

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        super().data_received(data)

    def _check_login(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        if self.script.auth is None or not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        username, password = self.script.auth
        if data.login == username.encode() and data.password == password.encode():
            self.script.logins.append(username)
            return AuthResult(success=True, auth_data=data)
        return AuthResult(success=False, handled=False)

    async def scripted(self, step: str) -> None:
        """Drop the connection, or stall, if the script says so at ``step``."""
        if self.script.drop_at == step:
            await self._drop()
        if self.script.stall_at == step:
            await asyncio.sleep(self.script.stall_seconds)

    async def _drop(self) -> None:
        if self.transport is not None:
            self.transport.close()
        await asyncio.sleep(_FOREVER)  # connection_lost() cancels this

    async def push(self, status: Any) -> None:
        if self._greeted:
            await super().push(status)
            return
        self._greeted = True
        await self.scripted("greeting")
        greeting = self.script.greeting
        await super().push(greeting)
        if greeting.startswith("421"):
            await self._drop()
        self._greeting_refused = not greeting.startswith("2")

    async def _command(self, verb: str, arg: Any) -> bool:
        """Record a command and play the script; return whether the command goes on."""
        shown = (arg or "").split(" ")[0] if verb == "AUTH" else (arg or "")
        self.script.commands.append(Command(self.number, verb, shown, read=self.reads, at=time.monotonic()))
        if self._greeting_refused and verb != "QUIT":
            await self.push("503 5.5.1 Bad sequence of commands")
            return False
        await self.scripted(verb)
        return True

    async def smtp_EHLO(self, hostname: str) -> None:
        if await self._command("EHLO", hostname):
            await super().smtp_EHLO(hostname)

    async def smtp_HELO(self, hostname: str) -> None:
        if await self._command("HELO", hostname):
            await super().smtp_HELO(hostname)

    async def smtp_STARTTLS(self, arg: str) -> None:
        self.script.commands.append(Command(self.number, "STARTTLS", arg or "", read=self.reads, at=time.monotonic()))
        if self.script.starttls_reply is not None:
            await self.push(self.script.starttls_reply)
            return
        if self.script.drop_at == "STARTTLS":
            await self.push("220 2.0.0 Ready to start TLS")
            await self._drop()
        if self.script.stall_at == "STARTTLS":
            await asyncio.sleep(self.script.stall_seconds)
        await super().smtp_STARTTLS(arg)

    async def smtp_AUTH(self, arg: str) -> None:
        if await self._command("AUTH", arg):
            await super().smtp_AUTH(arg)

    async def smtp_MAIL(self, arg: str | None) -> None:
        if await self._command("MAIL", arg):
            await super().smtp_MAIL(self._without_dsn_parameters(arg))

    async def smtp_RCPT(self, arg: str | None) -> None:
        if await self._command("RCPT", arg):
            await super().smtp_RCPT(self._without_dsn_parameters(arg))

    def _without_dsn_parameters(self, arg: str | None) -> str | None:
        # aiosmtpd refuses parameters it does not know (555); a server that offers
        # DSN takes RFC 3461's, which ``commands`` keeps.
        if not self.script.dsn or arg is None:
            return arg
        return " ".join(word for word in arg.split(" ") if not _DSN_PARAMETER.match(word))

    async def smtp_RSET(self, arg: str) -> None:
        if await self._command("RSET", arg):
            await super().smtp_RSET(arg)

    async def smtp_NOOP(self, arg: str) -> None:
        if await self._command("NOOP", arg):
            await super().smtp_NOOP(arg)

    async def smtp_QUIT(self, arg: str) -> None:
        if await self._command("QUIT", arg):
            self._end_session()
            await super().smtp_QUIT(arg)

    async def smtp_DATA(self, arg: str) -> None:
        if not await self._command("DATA", arg):
            return
        data_reply = self.script._scripted_reply("DATA", self.script.data_reply)
        if data_reply is not None:
            await self.push(data_reply)
            return
        if self.script.drop_at == "MESSAGE" or self.script.stall_at == "MESSAGE":
            await self.push("354 End data with <CR><LF>.<CR><LF>")
            if self.script.stall_at == "MESSAGE":
                await asyncio.sleep(self.script.stall_seconds)
            await self._drop()
        await super().smtp_DATA(arg)


@dataclasses.dataclass(frozen=True)
class TestTLS:
    """A test CA and a certificate it issued for ``localhost``, ``127.0.0.1`` and ``mx.test``."""

    __test__ = False  # not a test class, whatever its name

    ca: Any
    server_context: ssl.SSLContext
    client_context: ssl.SSLContext


def make_tls(*identities: str) -> TestTLS:
    """Return a new CA, and contexts with a certificate for ``identities`` and trusting the CA."""
    import trustme

    ca = trustme.CA()
    certificate = ca.issue_cert(*(identities or ("localhost", "127.0.0.1", "mx.test")))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    return TestTLS(ca=ca, server_context=server_context, client_context=client_context)


def closed_port() -> int:
    """Return a port on 127.0.0.1 that nothing listens on (a connection is refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """Yield a port on 127.0.0.1 whose accept queue is full: a new connection times out."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port: int = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # fills the queue
            yield port


@pytest.fixture
def smtp_servers() -> Iterator[Callable[..., SMTPTestServer]]:
    """Start test SMTP servers on demand: ``smtp_servers(**knobs)``; all stopped afterwards."""
    started: list[SMTPTestServer] = []

    def start(**knobs: Any) -> SMTPTestServer:
        server = SMTPTestServer(**knobs)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def smtp_server(smtp_servers: Callable[..., SMTPTestServer]) -> SMTPTestServer:
    """One started test SMTP server that accepts everything."""
    return smtp_servers()


@pytest.fixture(scope="session")
def smtp_tls() -> TestTLS:
    """A test CA and contexts for a server and a client trusting it."""
    return make_tls()
