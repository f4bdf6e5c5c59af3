"""A real HTTPS server on loopback serving MTA-STS policies, and a CA made for the test.

Fixtures (a conftest loads them with ``pytest_plugins``):

``test_pki``
    A :class:`TestPKI`: a CA made for the test (trustme), ``ca_file`` (its certificate
    as a PEM file, for ``TLS_CA_FILE``), and ``server_context(*names)``, a server
    ``SSLContext`` with a certificate for those names; ``other_ca_context(*names)``
    gives one from a CA nobody trusts, ``expired_context(*names)`` one whose
    certificate has expired.
``https_servers``
    A factory: ``https_servers(context)`` starts a :class:`PolicyServer` on
    127.0.0.1 with that server context; every one is stopped after the test.

A :class:`PolicyServer` answers each request from ``responses``, by the name in its
``Host`` header (without the port): a :class:`PolicyResponse` (``body``, ``status``,
``content_type``, extra ``headers``, ``content_length=False`` to end the body by
closing the connection, ``dribble`` seconds between the bytes of the status line
and the headers, as a hostile policy host sends them). A name it lacks gets 404. It records each
request in ``requests``: the ``Host`` header, the path, and the name the client
sent in SNI.
"""

from __future__ import annotations

import dataclasses
import datetime
import http.server
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@dataclasses.dataclass(frozen=True)
class PolicyResponse:
    """What the server answers for one host name."""

    body: bytes
    status: int = 200
    content_type: str | None = "text/plain"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    content_length: bool = True  # False: the body ends when the connection closes
    dribble: float = 0.0  # seconds between the bytes of the status line and headers


@dataclasses.dataclass(frozen=True)
class Request:
    """A request the server received."""

    host: str
    path: str
    sni: str | None


def policy_text(mode: str, *mx: str, max_age: int = 86400) -> bytes:
    """Return an RFC 8461 policy, CRLF lines as servers often send them."""
    lines = ["version: STSv1", f"mode: {mode}", *(f"mx: {pattern}" for pattern in mx), f"max_age: {max_age}"]
    return ("\r\n".join(lines) + "\r\n").encode()


class PolicyServer:
    """An HTTPS server on 127.0.0.1 answering from ``responses``; see the module's doc."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.responses: dict[str, PolicyResponse] = {}
        self.requests: list[Request] = []
        self.dribbles_cut = 0  # dribbled answers the client hung up on
        self._sni = threading.local()
        self._lock = threading.Lock()
        context.sni_callback = self._remember_sni
        self._context = context
        server = self
        self._http = _QuietServer(("127.0.0.1", 0), self._handler(server))
        self._http.daemon_threads = True
        self.port: int = self._http.server_address[1]
        self._thread: threading.Thread | None = None

    def count(self, host: str) -> int:
        """Return how many requests named ``host``."""
        with self._lock:
            return sum(1 for request in self.requests if request.host == host)

    def _remember_sni(self, sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, context: ssl.SSLContext) -> None:
        self._sni.name = name

    def _handler(self, server: PolicyServer) -> type[http.server.BaseHTTPRequestHandler]:
        class Handler(http.server.BaseHTTPRequestHandler):
            def setup(self) -> None:
                self.request = server._context.wrap_socket(self.request, server_side=True)
                self.request.settimeout(10)
                super().setup()

            def do_GET(self) -> None:
                host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
                with server._lock:
                    server.requests.append(Request(host=host, path=self.path, sni=getattr(server._sni, "name", None)))
                answer = server.responses.get(host, PolicyResponse(b"not found", status=404))
                self.send_response(answer.status)
                if answer.content_type is not None:
                    self.send_header("Content-Type", answer.content_type)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                if answer.content_length:
                    self.send_header("Content-Length", str(len(answer.body)))
                if answer.dribble:
                    self._dribble(answer)
                    return
                self.end_headers()
                self.wfile.write(answer.body)

            def _dribble(self, answer: PolicyResponse) -> None:
                head = b"".join(self._headers_buffer) + b"\r\n"  # type: ignore[attr-defined]
                self._headers_buffer = []  # type: ignore[attr-defined]
                try:
                    for index in range(len(head)):
                        self.wfile.write(head[index : index + 1])
                        self.wfile.flush()
                        time.sleep(answer.dribble)
                    self.wfile.write(answer.body)
                except OSError:
                    server.dribbles_cut += 1  # the client hung up

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        return Handler

    def start(self) -> PolicyServer:
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, name="test-https", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join(10)


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that refused the certificate: what the tests are about


@dataclasses.dataclass
class TestPKI:
    """A CA made for the test, its certificate as a file, and server certificates it issues."""

    __test__ = False  # not a test class, whatever its name

    ca: Any
    ca_file: str

    def server_context(self, *names: str) -> ssl.SSLContext:
        """Return a server context with a certificate for ``names`` from the trusted CA."""
        return _server_context(self.ca, names)

    def other_ca_context(self, *names: str) -> ssl.SSLContext:
        """Return a server context whose certificate, for ``names``, comes from a CA nobody trusts."""
        import trustme

        return _server_context(trustme.CA(), names)

    def expired_context(self, *names: str) -> ssl.SSLContext:
        """Return a server context whose certificate, for ``names``, from the trusted CA, has expired."""
        start, end = (datetime.datetime(year, 1, 1, tzinfo=datetime.UTC) for year in (1999, 2000))
        return _server_context(self.ca, names, not_before=start, not_after=end)


def _server_context(ca: Any, names: tuple[str, ...], **options: Any) -> ssl.SSLContext:
    certificate = ca.issue_cert(*names, **options)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(context)
    return context


@pytest.fixture
def test_pki(tmp_path: Path) -> TestPKI:
    """A CA made for this test; ``ca_file`` is what ``TLS_CA_FILE`` names."""
    import trustme

    ca = trustme.CA()
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return TestPKI(ca=ca, ca_file=str(path))


@pytest.fixture
def https_servers() -> Iterator[Callable[[ssl.SSLContext], PolicyServer]]:
    """Start HTTPS policy servers on demand: ``https_servers(context)``; all stopped afterwards."""
    started: list[PolicyServer] = []

    def start(context: ssl.SSLContext) -> PolicyServer:
        server = PolicyServer(context)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
