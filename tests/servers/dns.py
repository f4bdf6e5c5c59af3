"""A real DNS server on loopback that answers from a zone each test sets.

Use the ``dns_server`` fixture (a conftest loads it with ``pytest_plugins = ["tests.servers.dns"]``;
a test module may instead bind it: ``dns_server = tests.servers.dns.dns_server``)::

    def test_delivery(dns_server):
        dns_server.zone = DNSZone({
            "example.test": {"MX": [(10, "mx1.example.test"), (20, "mx2.example.test")]},
            "mx1.example.test": {"A": ["127.0.0.1"], "AAAA": ["::1"]},
            "mx2.example.test": {"A": ["127.0.0.2"]},
            "broken.test": "SERVFAIL",
            "half.test": {"MX": "SERVFAIL", "A": ["127.0.0.1"]},
            "silent.test": "TIMEOUT",
        })
        resolver = MXResolver(nameservers=dns_server.nameservers, port=25)

The server object has:

- ``address`` (``"127.0.0.1"``) and ``port``: where it listens, on UDP and TCP;
- ``nameservers``: ``[(address, port)]``, as ``MXResolver`` takes them;
- ``setting``: ``"127.0.0.1:port"``, an entry for ``BUMAIL_QUEUE['DNS_NAMESERVERS']``;
- ``queue_settings(mx_port)``: the ``BUMAIL_QUEUE`` keys that send MX mail through
  this server to SMTP servers on loopback at ``mx_port`` (``ALLOWED_PRIVATE_NETWORKS``
  opens loopback, which the worker refuses by default);
- ``zone``: the ``DNSZone`` it answers from; assign a new one at any time
  (it starts empty: every name is NXDOMAIN);
- ``queries``: every question asked so far, as ``(name, type)`` pairs such as
  ``("example.test", "MX")``, names in lowercase without the final dot.

A zone maps names (any case, final dot or not, IDNs as A-labels) to either

- a dict of record type to records: ``"MX"`` a list of ``(preference, exchange)``
  (``(0, ".")`` is a null MX), ``"A"`` and ``"AAAA"`` lists of addresses, ``"TXT"`` a
  list of texts (each one record, split into strings of 255 octets); or, in
  place of the list, one of the answers below for that type alone; a type the
  dict lacks is answered with no record (NOERROR, NODATA);
- one of these answers to every question about the name: ``"SERVFAIL"``,
  ``"REFUSED"``, ``"NXDOMAIN"``, or ``"TIMEOUT"`` (no answer at all).

A name the zone lacks is NXDOMAIN. ``DNSZone(records, delay=0.5)`` waits that
many seconds before each answer (stopping the server cuts the wait short).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import socketserver
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from dnslib import AAAA, MX, QTYPE, RCODE, RR, TXT, A, DNSError, DNSLabel, DNSRecord
from dnslib.server import DNSHandler, DNSLogger, DNSServer

ADDRESS = "127.0.0.1"
_RCODES = {"SERVFAIL": RCODE.SERVFAIL, "REFUSED": RCODE.REFUSED, "NXDOMAIN": RCODE.NXDOMAIN}
_NO_REPLY = "TIMEOUT"
_TTL = 60

#: ``ALLOWED_PRIVATE_NETWORKS`` for tests whose MX hosts listen on loopback.
LOOPBACK_NETWORKS = ["127.0.0.0/8", "::1/128"]


def _key(name: str) -> str:
    return name.rstrip(".").lower()


@dataclasses.dataclass(frozen=True)
class DNSZone:
    """What the server answers: ``records`` by name, and a ``delay`` before each answer."""

    records: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    delay: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "records", {_key(name): entry for name, entry in self.records.items()})

    def entry(self, name: str) -> Any:
        """Return what the zone holds for ``name``, or ``None``."""
        return self.records.get(_key(name))


class _NoReplyError(DNSError):
    """Raised by the resolver to send nothing back (dnslib's handler drops the query)."""


class _ZoneResolver:
    """dnslib's resolver interface: build each reply from the server's current zone."""

    def __init__(self, server: LoopbackDNSServer) -> None:
        self._server = server

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        name = _key(str(request.q.qname))
        qtype = QTYPE.get(request.q.qtype, str(request.q.qtype))
        zone = self._server.zone
        with self._server.lock:
            self._server.queries.append((name, qtype))
        if zone.delay and self._server.stopping.wait(zone.delay):
            raise _NoReplyError("the server is stopping")
        entry = zone.entry(name)
        answer = entry.get(qtype, ()) if isinstance(entry, Mapping) else entry
        reply = request.reply()
        if entry is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif answer == _NO_REPLY:
            raise _NoReplyError(f"{name} is set to time out")
        elif isinstance(answer, str):
            reply.header.rcode = _RCODES[answer]
        else:
            for record in answer:
                reply.add_answer(RR(request.q.qname, getattr(QTYPE, qtype), rdata=_rdata(qtype, record), ttl=_TTL))
        return reply


def _rdata(qtype: str, record: Any) -> Any:
    if qtype == "MX":
        preference, exchange = record
        return MX(DNSLabel(exchange), preference)
    if qtype == "A":
        return A(record)
    if qtype == "AAAA":  # through ipaddress: dnslib cannot parse "::ffff:192.0.2.1"
        return AAAA(tuple(ipaddress.IPv6Address(record).packed))
    if qtype == "TXT":  # a long text as strings of 255 octets at most, as RFC 1035 §3.3.14 has them
        data = record.encode()
        return TXT([data[i : i + 255] for i in range(0, len(data), 255)] or [b""])
    raise ValueError(f"the test DNS server does not serve {qtype} records")


class _Handler(DNSHandler):
    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, socket.socket):  # TCP: never wait forever for a client
            self.request.settimeout(5)


class _UDPServer(socketserver.ThreadingMixIn, socketserver.UDPServer):
    # Not daemon threads: server_close() waits for the handlers, so none outlives the test.
    daemon_threads = False
    block_on_close = True


class _TCPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True


class LoopbackDNSServer:
    """A DNS server on ``127.0.0.1``, UDP and TCP on one ephemeral port; see the module doc."""

    address = ADDRESS

    def __init__(self) -> None:
        self.zone = DNSZone()
        self.queries: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._servers: list[DNSServer] = []
        self._threads: list[threading.Thread] = []
        self.port = 0

    @property
    def nameservers(self) -> list[tuple[str, int]]:
        return [(self.address, self.port)]

    @property
    def setting(self) -> str:
        return f"{self.address}:{self.port}"

    def queue_settings(self, mx_port: int) -> dict[str, Any]:
        """Return the ``BUMAIL_QUEUE`` keys for MX hosts found here and listening on loopback at ``mx_port``."""
        return {"MX_PORT": mx_port, "DNS_NAMESERVERS": [self.setting], "ALLOWED_PRIVATE_NETWORKS": LOOPBACK_NETWORKS}

    def start(self) -> None:
        resolver = _ZoneResolver(self)
        logger = DNSLogger(log="-request,-reply,-truncated,-error")  # silent
        for _ in range(20):  # the UDP port's TCP twin may be taken: pick another
            udp = DNSServer(resolver, address=ADDRESS, port=0, logger=logger, handler=_Handler, server=_UDPServer)
            port = udp.server.server_address[1]
            try:
                tcp = DNSServer(
                    resolver, address=ADDRESS, port=port, tcp=True, logger=logger, handler=_Handler, server=_TCPServer
                )
            except OSError:
                udp.server.server_close()
                continue
            self.port = port
            self._servers = [udp, tcp]
            break
        else:
            raise RuntimeError("no free port for both UDP and TCP on loopback")
        for server in self._servers:
            thread = threading.Thread(
                target=server.server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"test-dns-{self.port}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        for server in self._servers:
            server.server.shutdown()
            server.server.server_close()
        for thread in self._threads:
            thread.join()
        self._servers, self._threads = [], []


@pytest.fixture
def dns_server() -> Iterator[LoopbackDNSServer]:
    """A started ``LoopbackDNSServer`` with an empty zone, stopped after the test."""
    server = LoopbackDNSServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
