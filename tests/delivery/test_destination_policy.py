"""The destination policy and MX_ADDRESS_LIMIT: no recipient address or DNS answer aims
the worker at an internal service, and no domain costs an attempt unbounded lookups
or connections. Real DNS and SMTP servers on loopback stand in for internal services."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import selectors
import socket
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from django.test import override_settings

from bumail_queue import queue, signals
from bumail_queue.delivery.dns import (
    MX_HOSTS_PER_ADDRESS,
    MXResolver,
    destination_refusal,
)
from bumail_queue.delivery.envelope import Host
from bumail_queue.items import RecipientStatus
from tests.helpers import ScriptedTransport
from tests.servers.dns import LOOPBACK_NETWORKS, DNSZone, LoopbackDNSServer

PORT = 2525
LOOPBACK = tuple(ipaddress.ip_network(n) for n in LOOPBACK_NETWORKS)


def networks(*cidrs: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# -- The classifier ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.1.2.3", "private (RFC 1918)"),
        ("172.16.0.1", "private (RFC 1918)"),
        ("172.31.255.255", "private (RFC 1918)"),
        ("192.168.1.1", "private (RFC 1918)"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "CGNAT"),
        ("0.0.0.0", "this network"),
        ("0.1.2.3", "this network"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
        ("192.0.0.8", "IETF protocol assignments"),
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("192.88.99.1", "6to4 relay anycast"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fc00::1", "unique-local"),
        ("fd12:3456::1", "unique-local"),
        ("fe80::1", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("ff0e::1", "multicast"),  # global scope, yet no unicast host
        ("2001:db8::25", "documentation"),
        ("3fff::1", "documentation"),
        ("2001::1", "IETF protocol assignments"),  # Teredo
        ("2001:2::1", "IETF protocol assignments"),  # benchmarking
        ("100::1", "discard-only"),
        ("5f00::1", "segment routing"),
        ("4000::1", "not globally routable"),  # outside 2000::/3
        ("64:ff9b:1::1", "local-use NAT64"),
        ("::127.0.0.1", "IPv4-compatible"),
        ("::8.8.8.8", "IPv4-compatible"),
        # IPv6 forms that reach an IPv4 address are judged by that address.
        ("::ffff:127.0.0.1", "IPv4-mapped of 127.0.0.1, loopback"),
        ("::ffff:10.0.0.1", "IPv4-mapped of 10.0.0.1, private"),
        ("::ffff:169.254.169.254", "IPv4-mapped of 169.254.169.254, link-local"),
        ("2002:7f00:1::1", "6to4 of 127.0.0.1, loopback"),
        ("2002:a9fe:a9fe::", "6to4 of 169.254.169.254, link-local"),
        ("64:ff9b::7f00:1", "NAT64 of 127.0.0.1, loopback"),
        ("64:ff9b::a00:1", "NAT64 of 10.0.0.1, private"),
    ],
)
def test_addresses_that_are_not_globally_routable_are_refused(address: str, reason: str) -> None:
    why = destination_refusal(address)
    assert why is not None
    assert reason in why


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "2001:4860:4860::8888",
        "2a00:1450:4001::1a",
        "::ffff:8.8.8.8",
        "2002:808:808::1",
        "64:ff9b::808:808",
    ],
)
def test_globally_routable_addresses_are_used(address: str) -> None:
    assert destination_refusal(address) is None
    assert destination_refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("address", "allowed", "refused"),
    [
        ("127.0.0.1", ["127.0.0.0/8"], False),
        ("::ffff:127.0.0.1", ["127.0.0.0/8"], False),  # the very IPv4 host
        ("::1", ["::1/128"], False),
        ("10.20.30.40", ["10.20.0.0/16"], False),
        ("fd00::25", ["fd00::/8"], False),
        ("10.21.0.1", ["10.20.0.0/16"], True),
        ("127.0.0.1", ["::1/128"], True),
        ("::1", ["127.0.0.0/8"], True),
        ("2002:7f00:1::1", ["127.0.0.0/8"], True),  # a 6to4 relay is not the host itself
    ],
)
def test_allowed_networks_open_exactly_what_they_name(address: str, allowed: list[str], refused: bool) -> None:
    assert (destination_refusal(address, networks(*allowed)) is not None) is refused


# -- The resolver ---------------------------------------------------------------------------


def resolver_for(server: LoopbackDNSServer, *, allowed=(), address_limit: int = 5) -> MXResolver:
    return MXResolver(
        nameservers=server.nameservers, port=PORT, timeout=5, allowed_networks=allowed, address_limit=address_limit
    )


@pytest.mark.parametrize(
    ("domain", "address"),
    [
        ("[127.0.0.1]", "127.0.0.1"),
        ("[IPv6:::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("[169.254.169.254]", "169.254.169.254"),
    ],
)
def test_a_refused_address_literal_fails_naming_the_address_and_the_setting(
    dns_server: LoopbackDNSServer, domain: str, address: str, caplog: pytest.LogCaptureFixture
) -> None:
    address = str(ipaddress.ip_address(address))  # "::ffff:7f00:1" before Python 3.13
    with caplog.at_level(logging.WARNING, logger="bumail_queue.delivery.dns"):
        result = resolver_for(dns_server).destinations(domain)
    assert result.hosts == ()
    assert result.failure is not None
    assert result.failure.status is RecipientStatus.FAILED
    assert result.failure.reply.status == "5.4.4"
    assert address in result.failure.reply.text
    assert "ALLOWED_PRIVATE_NETWORKS" in result.failure.reply.text
    assert f"domain={domain} " in caplog.text
    assert f"address={address} " in caplog.text
    assert dns_server.queries == []


def test_private_addresses_are_skipped_and_public_ones_kept(
    dns_server: LoopbackDNSServer, caplog: pytest.LogCaptureFixture
) -> None:
    dns_server.zone = DNSZone({
        "mixed.test": {"MX": [(10, "inside.mixed.test"), (20, "outside.mixed.test")]},
        "inside.mixed.test": {"A": ["10.0.0.25", "192.168.1.25"], "AAAA": ["fd00::25"]},
        "outside.mixed.test": {"A": ["127.0.0.1", "8.8.8.8"], "AAAA": ["::ffff:10.0.0.25", "2001:4860:4860::8888"]},
    })  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="bumail_queue.delivery.dns"):
        result = resolver_for(dns_server).destinations("mixed.test")
    assert result.failure is None
    assert result.hosts == (
        Host(name="outside.mixed.test", address="8.8.8.8", port=PORT),
        Host(name="outside.mixed.test", address="2001:4860:4860::8888", port=PORT),
    )
    refused = {r.getMessage().split("address=")[1].split()[0] for r in caplog.records}
    assert refused == {"10.0.0.25", "192.168.1.25", "fd00::25", "127.0.0.1", "::ffff:10.0.0.25"}
    assert all("domain=mixed.test " in r.getMessage() for r in caplog.records)


def test_an_mx_whose_every_address_is_refused_fails(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({
        "internal.test": {"MX": [(10, "mx.internal.test")]},
        "mx.internal.test": {"A": ["127.0.0.1"], "AAAA": ["::1"]},
    })  # fmt: skip
    result = resolver_for(dns_server).destinations("internal.test")
    assert result.failure is not None
    assert (result.failure.status, result.failure.reply.status) == (RecipientStatus.FAILED, "5.4.4")
    assert "127.0.0.1 (loopback)" in result.failure.reply.text
    assert "::1 (loopback)" in result.failure.reply.text
    assert "ALLOWED_PRIVATE_NETWORKS" in result.failure.reply.text


def test_an_implicit_mx_on_a_refused_address_fails(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"metadata.test": {"A": ["169.254.169.254"]}})
    result = resolver_for(dns_server).destinations("metadata.test")
    assert result.failure is not None
    assert (result.failure.status, result.failure.reply.status) == (RecipientStatus.FAILED, "5.4.4")
    assert "169.254.169.254 (link-local)" in result.failure.reply.text


def test_refused_addresses_with_a_temporary_failure_are_deferred(dns_server: LoopbackDNSServer) -> None:
    # The better MX host may have a public address once its DNS answers again.
    dns_server.zone = DNSZone({
        "flaky.test": {"MX": [(10, "broken.flaky.test"), (20, "inside.flaky.test")]},
        "broken.flaky.test": "SERVFAIL",
        "inside.flaky.test": {"A": ["10.0.0.1"]},
    })  # fmt: skip
    result = resolver_for(dns_server).destinations("flaky.test")
    assert result.failure is not None
    assert (result.failure.status, result.failure.reply.status) == (RecipientStatus.DEFERRED, "4.4.3")
    assert "SERVFAIL" in result.failure.reply.text
    assert "10.0.0.1 (private (RFC 1918))" in result.failure.reply.text


def test_allowed_networks_let_the_resolver_keep_them(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({
        "internal.test": {"MX": [(10, "mx.internal.test")]},
        "mx.internal.test": {"A": ["127.0.0.1"], "AAAA": ["::1"]},
    })  # fmt: skip
    result = resolver_for(dns_server, allowed=networks("127.0.0.0/8")).destinations("internal.test")
    assert result.hosts == (Host(name="mx.internal.test", address="127.0.0.1", port=PORT),)


def thousand_mx_records(address_of) -> DNSZone:
    """A domain with 1,000 MX records, ``mx{i}.flood.test`` at preference ``i``."""
    return DNSZone({
        "flood.test": {"MX": [(i, f"mx{i}.flood.test") for i in range(1000)]},
        **{f"mx{i}.flood.test": {"A": [address_of(i)]} for i in range(1000)},
    })  # fmt: skip


def test_a_thousand_mx_records_cost_at_most_address_limit_addresses_and_few_lookups(
    dns_server: LoopbackDNSServer,
) -> None:
    dns_server.zone = thousand_mx_records(lambda i: f"127.0.{i // 250}.{i % 250 + 1}")
    result = resolver_for(dns_server, allowed=LOOPBACK, address_limit=5).destinations("flood.test")
    assert [h.address for h in result.hosts] == [f"127.0.0.{i}" for i in range(1, 6)]
    # The MX question (again over TCP: the answer does not fit in UDP), then A and AAAA
    # of the first five hosts; no AAAA after the fifth address was kept.
    hosts_asked = {name for name, kind in dns_server.queries if kind in {"A", "AAAA"}}
    assert hosts_asked == {f"mx{i}.flood.test" for i in range(5)}
    assert len(dns_server.queries) <= 2 + 2 * 5


def test_a_thousand_mx_records_without_a_usable_address_cost_a_bounded_number_of_lookups(
    dns_server: LoopbackDNSServer,
) -> None:
    dns_server.zone = thousand_mx_records(lambda i: "10.0.0.1")
    result = resolver_for(dns_server, address_limit=5).destinations("flood.test")
    assert result.failure is not None
    assert result.failure.reply.status == "5.4.4"
    hosts_asked = {name for name, kind in dns_server.queries if kind in {"A", "AAAA"}}
    assert len(hosts_asked) == MX_HOSTS_PER_ADDRESS * 5
    assert len(dns_server.queries) <= 2 + 2 * MX_HOSTS_PER_ADDRESS * 5


# -- Through the worker, with a listener standing for an internal service -----------------------------


@pytest.fixture
def failures() -> Iterator[list[tuple[str, object]]]:
    seen: list[tuple[str, object]] = []

    def receiver(sender, *, recipient, reply, **kwargs):
        seen.append((recipient, reply))

    signals.failed.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        signals.failed.disconnect(receiver)


def worker_settings(dns_server: LoopbackDNSServer, mx_port: int, **extra) -> dict:
    return {"HOSTNAME": "mta.example.com", "MX_PORT": mx_port, "DNS_NAMESERVERS": [dns_server.setting], **extra}


INTERNAL_RECIPIENTS = ["user@[127.0.0.1]", "user@[IPv6:::ffff:127.0.0.1]", "user@internal.test"]
INTERNAL_ZONE = {"internal.test": {"MX": [(10, "mx.internal.test")]}, "mx.internal.test": {"A": ["127.0.0.1"]}}


@pytest.mark.django_db(transaction=True)
def test_the_worker_never_connects_to_an_internal_listener(smtp_server, dns_server, failures, caplog) -> None:
    dns_server.zone = DNSZone(INTERNAL_ZONE)
    with (
        override_settings(BUMAIL_QUEUE=worker_settings(dns_server, smtp_server.port)),
        caplog.at_level(logging.WARNING, logger="bumail_queue"),
    ):
        for recipient in INTERNAL_RECIPIENTS:
            queue.enqueue(b"Subject: x\r\n\r\nx\r\n", sender="", recipients=[recipient])
        stats = queue.deliver_due()
    assert stats.failed == len(INTERNAL_RECIPIENTS)
    assert smtp_server.connections == 0
    assert sorted(r for r, _ in failures) == sorted(INTERNAL_RECIPIENTS)
    for _, reply in failures:
        assert reply.status == "5.4.4"
        assert "127.0.0.1" in reply.text
        assert "ALLOWED_PRIVATE_NETWORKS" in reply.text
    assert "domain=internal.test host=mx.internal.test address=127.0.0.1" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_the_worker_never_hands_the_metadata_address_to_the_transport(dns_server, failures) -> None:
    # No listener can stand on 169.254.169.254; a transport that records what it is given can.
    transport = ScriptedTransport()
    dns_server.zone = DNSZone(
        {"metadata.test": {"MX": [(10, "mx.metadata.test")]}, "mx.metadata.test": {"A": ["169.254.169.254"]}}
    )
    with override_settings(BUMAIL_QUEUE=worker_settings(dns_server, PORT)):
        queue.enqueue(
            b"Subject: x\r\n\r\nx\r\n", sender="", recipients=["user@[169.254.169.254]", "user@metadata.test"]
        )
        queue.deliver_due(transport=transport)
    assert transport.envelopes == []
    assert sorted(r for r, _ in failures) == ["user@[169.254.169.254]", "user@metadata.test"]
    assert all(reply.status == "5.4.4" and "169.254.169.254 (link-local)" in reply.text for _, reply in failures)


@pytest.mark.django_db(transaction=True)
def test_allowed_private_networks_let_the_worker_deliver_there(smtp_server, dns_server) -> None:
    dns_server.zone = DNSZone(INTERNAL_ZONE)
    settings = worker_settings(dns_server, smtp_server.port, ALLOWED_PRIVATE_NETWORKS=LOOPBACK_NETWORKS)
    with override_settings(BUMAIL_QUEUE=settings):
        for recipient in INTERNAL_RECIPIENTS:
            queue.enqueue(b"Subject: x\r\n\r\nx\r\n", sender="", recipients=[recipient])
        stats = queue.deliver_due()
    assert stats.delivered == len(INTERNAL_RECIPIENTS)
    assert sorted(r for m in smtp_server.messages for r in m.rcpt_tos) == sorted(INTERNAL_RECIPIENTS)


@contextlib.contextmanager
def listeners(addresses: list[str], port: int) -> Iterator[Counter[str]]:
    """Listen on each loopback address at ``port``; count and close every connection."""
    accepted: Counter[str] = Counter()
    selector = selectors.DefaultSelector()
    sockets = []
    for address in addresses:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(64)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, address)
        sockets.append(sock)
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            for key, _ in selector.select(0.05):
                with contextlib.suppress(BlockingIOError):
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    accepted[key.data] += 1
                    conn.close()  # before any greeting: the client moves on to the next address

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield accepted
    finally:
        stopping.set()
        thread.join(5)
        for sock in sockets:
            sock.close()
        selector.close()


def free_port_on(addresses: list[str]) -> int:
    for _ in range(20):
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            port = int(probe.getsockname()[1])
        try:
            for address in addresses:
                with socket.socket() as other:
                    other.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on every address")


@pytest.mark.django_db(transaction=True)
def test_a_thousand_mx_records_cost_one_attempt_at_most_mx_address_limit_connections(dns_server, failures) -> None:
    addresses = [f"127.0.0.{i}" for i in range(1, 21)]
    port = free_port_on(addresses)
    dns_server.zone = thousand_mx_records(lambda i: f"127.0.0.{i % 250 + 1}")
    settings = worker_settings(dns_server, port, ALLOWED_PRIVATE_NETWORKS=LOOPBACK_NETWORKS, MX_ADDRESS_LIMIT=3)
    with listeners(addresses, port) as accepted, override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue(b"Subject: x\r\n\r\nx\r\n", sender="", recipients=["user@flood.test"])
        stats = queue.deliver_due()
    assert stats.deferred == 1
    assert accepted == Counter({"127.0.0.1": 1, "127.0.0.2": 1, "127.0.0.3": 1})
    assert len(dns_server.queries) <= 2 + 2 * 3


@pytest.mark.django_db(transaction=True)
def test_a_refused_mx_address_is_skipped_for_an_allowed_one(smtp_server, dns_server) -> None:
    # 127.0.0.1 stands for a public MX (opened on purpose), 127.0.0.2 for an internal one.
    dns_server.zone = DNSZone({
        "mixed.test": {"MX": [(10, "inside.mixed.test"), (20, "outside.mixed.test")]},
        "inside.mixed.test": {"A": ["127.0.0.2"]},
        "outside.mixed.test": {"A": ["127.0.0.1"]},
    })  # fmt: skip
    settings = worker_settings(dns_server, smtp_server.port, ALLOWED_PRIVATE_NETWORKS=["127.0.0.1/32"])
    with listeners(["127.0.0.2"], smtp_server.port) as inside, override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue(b"Subject: x\r\n\r\nx\r\n", sender="", recipients=["user@mixed.test"])
        stats = queue.deliver_due()
    assert stats.delivered == 1
    assert inside == Counter()
    assert [m.rcpt_tos for m in smtp_server.messages] == [["user@mixed.test"]]
