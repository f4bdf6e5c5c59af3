"""The fetch of a policy over HTTPS (RFC 8461 §3.3), held to one deadline however
slowly the policy host sends.

The HTTPS client is urllib3: it connects to the address chosen by the caller and
verifies the certificate for the policy host's name (``server_hostname``), follows
nothing unless told, and reads a body in bounded pieces (``docs/mta-sts.md`` says why
it was chosen).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any

import urllib3
import urllib3.connection
import urllib3.exceptions

from bumail_queue.delivery.tlsrpt import certificate_failure
from bumail_queue.sts import TLSResult

from .policy import PolicyError, _fetch_error, _invalid

#: RFC 8461 §3.3: "senders may wish to" refuse a policy larger than 64 KiB.
MAX_POLICY_SIZE = 64 * 1024
#: How long each step of a fetch (connecting, each read) may wait at most.
FETCH_STEP_SECONDS = 10.0
_POLICY_PATH = "/.well-known/mta-sts.txt"
_READ_SIZE = 8192


def fetch_text(
    host_name: str,
    addresses: Sequence[str],
    *,
    port: int,
    context: ssl.SSLContext,
    deadline: float,
    seconds: float,
    monotonic: Callable[[], float],
) -> str:
    """GET ``https://<host_name>/.well-known/mta-sts.txt`` from the first of
    ``addresses`` that answers, by ``deadline`` (on ``monotonic``'s clock: the end of
    the fetch's ``seconds``, its address lookups included); raise ``PolicyError``."""
    fetch = _Fetch(host_name=host_name, port=port, seconds=seconds, deadline=deadline, monotonic=monotonic)
    with _Watchdog(max(0.0, deadline - monotonic())) as watchdog:
        last: PolicyError | None = None
        text: str | None = None
        for address in addresses:
            try:
                text = fetch.get(address, context, watchdog)
                break
            except _UnreachableError as error:
                last = error
            except PolicyError:
                if watchdog.expired:
                    raise fetch.too_slow() from None
                raise
        # A body cut short at the deadline may end where a line does: never parse it.
        if watchdog.expired:
            raise fetch.too_slow()
        if text is None:
            assert last is not None  # at least one address was tried
            raise last
        return text


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Fetch:
    """One fetch: of which host, on which port, until when."""

    host_name: str
    port: int
    seconds: float
    deadline: float
    monotonic: Callable[[], float]

    @property
    def where(self) -> str:
        return f"https://{self.host_name}{'' if self.port == 443 else f':{self.port}'}{_POLICY_PATH}"

    def too_slow(self) -> PolicyError:
        return _fetch_error(f"{self.where} took longer than {self.seconds:g} seconds")

    def get(self, address: str, context: ssl.SSLContext, watchdog: _Watchdog) -> str:
        """GET the policy from ``address``, as the policy host; return its text."""
        step = min(FETCH_STEP_SECONDS, max(0.001, self.deadline - self.monotonic()))
        where, host_name = self.where, self.host_name
        pool = _WatchedPool(
            address,
            watchdog=watchdog,
            port=self.port,
            ssl_context=context,
            server_hostname=host_name,  # SNI, and the name the certificate must hold
            timeout=urllib3.Timeout(connect=step, read=step),
            retries=False,
            maxsize=1,
        )
        try:
            response = pool.urlopen(
                "GET",
                _POLICY_PATH,
                headers={
                    "Host": host_name if self.port == 443 else f"{host_name}:{self.port}",
                    "Accept": "text/plain",
                    "User-Agent": "bumail_queue (MTA-STS)",
                },
                redirect=False,
                retries=False,
                preload_content=False,
                assert_same_host=False,
            )
            try:
                return self._body(response)
            finally:
                response.release_conn()
        except urllib3.exceptions.SSLError as error:
            failed = certificate_failure(error)
            if failed is not None:
                raise PolicyError(
                    TLSResult.STS_WEBPKI_INVALID, f"The certificate of {where} is not valid: {failed[1]}"
                ) from None
            raise _fetch_error(f"TLS with {where} failed: {_reason(error)}") from None
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError) as error:
            raise _UnreachableError(f"{where} could not be reached at {_shown(address)}: {_reason(error)}") from None
        except urllib3.exceptions.HTTPError as error:
            raise _fetch_error(f"{where} failed: {_reason(error)}") from None
        finally:
            pool.close()

    def _body(self, response: urllib3.BaseHTTPResponse) -> str:
        """Return the response's text, once its status, media type and size pass."""
        where = self.where
        if 300 <= response.status < 400:
            location = response.headers.get("Location", "")[:200]
            raise _fetch_error(
                f"{where} redirects ({response.status}) to {location!r}; RFC 8461 §3.3 forbids following"
            )
        if response.status != 200:
            raise _fetch_error(f"{where} answered HTTP {response.status}")
        media_type = response.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media_type != "text/plain":
            raise _invalid(f"{where} is served as {media_type or 'no media type'!r}, not 'text/plain' (RFC 8461 §3.2)")
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_POLICY_SIZE:
            raise _fetch_error(
                f"{where} is {int(length)} octets, more than the {MAX_POLICY_SIZE} octets a policy may have"
            )
        body = bytearray()
        while chunk := response.read1(_READ_SIZE):
            body += chunk
            if len(body) > MAX_POLICY_SIZE:
                raise _fetch_error(f"{where} is more than the {MAX_POLICY_SIZE} octets a policy may have")
            if self.monotonic() > self.deadline:
                raise self.too_slow()
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid(f"{where} is not UTF-8 text") from None


class _Watchdog:
    """Ends a fetch's connections once its time is up, however slowly their bytes come.

    urllib3's read timeout, like http.client's under it, bounds each ``recv`` afresh: a
    policy host sending its status line or headers one byte every few seconds is never
    cut off by it. A timer that shuts the connections down at the deadline is: the read
    under way then ends at once, and so does the fetch. It holds a duplicate of each
    socket, since wrapping a socket in TLS detaches the object it was made with, and
    shutting a duplicate down ends the connection the TLS socket reads from.
    """

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock``'s connection down at the deadline (at once if it has passed)."""
        duplicate = sock.dup()
        with self._lock:
            self._sockets.append(duplicate)
            expired = self.expired
        if expired:
            _shut(duplicate)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedConnection(urllib3.connection.HTTPSConnection):
    """urllib3's HTTPS connection, its socket handed to the fetch's watchdog as soon as
    it exists, so that the TLS handshake is bounded too."""

    def __init__(self, *args: Any, watchdog: _Watchdog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watchdog = watchdog

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        self._watchdog.watch(sock)
        return sock


class _WatchedPool(urllib3.HTTPSConnectionPool):
    """A pool whose connections the watchdog given (``watchdog=``) ends at the deadline."""

    ConnectionCls = _WatchedConnection


class _UnreachableError(PolicyError):
    """The policy host could not be reached at one address: the next is tried."""

    def __init__(self, text: str) -> None:
        super().__init__(TLSResult.STS_POLICY_FETCH_ERROR, text)


def _reason(error: BaseException) -> str:
    """Say what went wrong in a line: the innermost cause urllib3 wrapped."""
    cause = error
    while isinstance(cause, urllib3.exceptions.HTTPError) and cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(getattr(cause, "reason", None) or cause).splitlines()[0] if str(cause) else type(cause).__name__
    return text[:300]


def _shown(address: str) -> str:
    return f"[{address}]" if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address) else address
