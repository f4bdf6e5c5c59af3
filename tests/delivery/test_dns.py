"""MX resolution (RFC 5321 §5.1, RFC 7505) against a real DNS server on loopback."""

from __future__ import annotations

import ipaddress
import logging
import random
import socket
import time

import pytest

from bumail_queue.delivery.dns import Destinations, MXResolver
from bumail_queue.delivery.envelope import Host
from bumail_queue.items import RecipientStatus
from tests.servers.dns import LOOPBACK_NETWORKS, DNSZone, LoopbackDNSServer

PORT = 2525

# The zones below use loopback and documentation addresses, which the destination
# policy refuses unless opened (its own tests are in test_destination_policy.py).
OPEN_NETWORKS = tuple(ipaddress.ip_network(n) for n in (*LOOPBACK_NETWORKS, "192.0.2.0/24", "2001:db8::/32"))


def resolver_for(
    server: LoopbackDNSServer,
    *,
    timeout: float = 5.0,
    seed: int | None = 0,
    address_limit: int = 5,
    allowed: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = OPEN_NETWORKS,
) -> MXResolver:
    rng = None if seed is None else random.Random(seed)
    return MXResolver(
        nameservers=server.nameservers,
        port=PORT,
        timeout=timeout,
        rng=rng,
        allowed_networks=allowed,
        address_limit=address_limit,
    )


def host(name: str, address: str) -> Host:
    return Host(name=name, address=address, port=PORT)


def assert_failure(result: Destinations, status: RecipientStatus, code: str, *words: str) -> None:
    assert result.hosts == ()
    assert result.failure is not None
    assert result.failure.status is status
    assert result.failure.reply.code is None
    assert result.failure.reply.status == code
    for word in words:
        assert word in result.failure.reply.text
    assert "Traceback" not in result.failure.reply.text


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- MX records -----------------------------------------------------------------------


def test_mx_hosts_in_preference_order(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(30, "mx3.example.test"), (10, "mx1.example.test"), (20, "mx2.example.test")]},
            "mx1.example.test": {"A": ["127.0.0.1"]},
            "mx2.example.test": {"A": ["127.0.0.2"]},
            "mx3.example.test": {"A": ["127.0.0.3"]},
        }
    )
    result = resolver_for(dns_server).destinations("example.test")
    assert result.failure is None
    assert result.hosts == (
        host("mx1.example.test", "127.0.0.1"),
        host("mx2.example.test", "127.0.0.2"),
        host("mx3.example.test", "127.0.0.3"),
    )


def test_equal_preferences_in_random_order(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {
                "MX": [
                    (10, "a.example.test"),
                    (10, "b.example.test"),
                    (5, "first.example.test"),
                    (20, "last.example.test"),
                ]
            },
            "a.example.test": {"A": ["127.0.0.1"]},
            "b.example.test": {"A": ["127.0.0.2"]},
            "first.example.test": {"A": ["127.0.0.3"]},
            "last.example.test": {"A": ["127.0.0.4"]},
        }
    )
    orders = set()
    for seed in range(20):
        names = tuple(h.name for h in resolver_for(dns_server, seed=seed).destinations("example.test").hosts)
        # The same seed gives the same order: the rng alone decides.
        again = tuple(h.name for h in resolver_for(dns_server, seed=seed).destinations("example.test").hosts)
        assert names == again
        assert names[0] == "first.example.test"
        assert names[-1] == "last.example.test"
        orders.add(names[1:3])
    assert orders == {("a.example.test", "b.example.test"), ("b.example.test", "a.example.test")}


def test_without_a_given_rng_the_order_still_varies(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(10, f"mx{i}.example.test") for i in range(6)]},
            **{f"mx{i}.example.test": {"A": [f"127.0.0.{i + 1}"]} for i in range(6)},
        }
    )
    resolver = resolver_for(dns_server, seed=None, address_limit=6)
    orders = {tuple(h.name for h in resolver.destinations("example.test").hosts) for _ in range(10)}
    assert len(orders) > 1
    assert all(sorted(order) == [f"mx{i}.example.test" for i in range(6)] for order in orders)


def test_a_before_aaaa_for_each_mx_host(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(10, "mx1.example.test"), (20, "mx2.example.test")]},
            "mx1.example.test": {"A": ["127.0.0.1", "127.0.0.2"], "AAAA": ["::1"]},
            "mx2.example.test": {"AAAA": ["2001:db8::25"]},
        }
    )
    result = resolver_for(dns_server).destinations("example.test")
    assert result.failure is None
    assert result.hosts == (
        host("mx1.example.test", "127.0.0.1"),
        host("mx1.example.test", "127.0.0.2"),
        host("mx1.example.test", "::1"),
        host("mx2.example.test", "2001:db8::25"),
    )
    assert str(result.hosts[0]) == "mx1.example.test[127.0.0.1]:2525"


def test_mx_host_names_lose_the_final_dot_and_case(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(10, "MX1.Example.Test.")]},
            "mx1.example.test": {"A": ["127.0.0.1"]},
        }
    )
    assert resolver_for(dns_server).destinations("Example.TEST.").hosts == (host("mx1.example.test", "127.0.0.1"),)


def test_an_address_is_tried_once_even_when_two_mx_hosts_share_it(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(10, "mx1.example.test"), (20, "mx2.example.test")]},
            "mx1.example.test": {"A": ["127.0.0.1"]},
            "mx2.example.test": {"A": ["127.0.0.1", "127.0.0.2"]},
        }
    )
    assert resolver_for(dns_server).destinations("example.test").hosts == (
        host("mx1.example.test", "127.0.0.1"),
        host("mx2.example.test", "127.0.0.2"),
    )


def test_mx_hosts_without_an_address_are_skipped(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {
                "MX": [
                    (10, "missing.example.test"),  # NXDOMAIN
                    (20, "empty.example.test"),  # exists, no A nor AAAA
                    (30, "broken.example.test"),  # SERVFAIL
                    (40, "mx.example.test"),
                ]
            },
            "empty.example.test": {},
            "broken.example.test": "SERVFAIL",
            "mx.example.test": {"A": ["127.0.0.1"]},
        }
    )
    result = resolver_for(dns_server).destinations("example.test")
    assert result.failure is None
    assert result.hosts == (host("mx.example.test", "127.0.0.1"),)
    # No AAAA question after the A question said the name does not exist.
    assert ("missing.example.test", "AAAA") not in dns_server.queries


def test_mx_hosts_missing_or_without_an_address_fail(dns_server: LoopbackDNSServer) -> None:
    # Postfix takes NXDOMAIN and NODATA alike as "not found" (DNS_NOTFOUND): 5.4.4, not days of retries.
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(10, "missing.example.test"), (20, "empty.example.test")], "A": ["127.0.0.9"]},
            "empty.example.test": {},
        }
    )
    result = resolver_for(dns_server).destinations("example.test")
    # Never the domain's own address: it has MX records.
    assert_failure(
        result,
        RecipientStatus.FAILED,
        "5.4.4",
        "No MX host of example.test has an address",
        "missing.example.test does not exist (NXDOMAIN)",
        "empty.example.test has no A or AAAA record",
    )
    assert ("example.test", "A") not in dns_server.queries


def test_no_mx_host_with_an_address_after_a_timeout_says_so(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(10, "slow.example.test")]},
            "slow.example.test": "TIMEOUT",
        }
    )
    started = time.monotonic()
    result = resolver_for(dns_server, timeout=0.5).destinations("example.test")
    assert time.monotonic() - started < 2
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "example.test", "No MX host", "0.5 seconds")


# -- MX hosts that do not exist, numeric MX hosts ------------------------------------------


def test_mx_hosts_that_all_do_not_exist_fail(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {"example.test": {"MX": [(10, "mx1.gone.test"), (20, "mx2.gone.test")], "A": ["127.0.0.9"]}}
    )
    result = resolver_for(dns_server).destinations("example.test")
    assert_failure(
        result,
        RecipientStatus.FAILED,
        "5.4.4",
        "No MX host of example.test has an address",
        "mx1.gone.test does not exist (NXDOMAIN)",
        "mx2.gone.test does not exist (NXDOMAIN)",
    )
    assert ("example.test", "A") not in dns_server.queries  # never the implicit MX


def test_mx_hosts_that_exist_without_an_address_record_fail(dns_server: LoopbackDNSServer) -> None:
    # Postfix: NOERROR with no answer (NODATA) is DNS_NOTFOUND, as NXDOMAIN is: 5.4.4.
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(10, "mx1.example.test"), (20, "mx2.example.test")]},
            "mx1.example.test": {},
            "mx2.example.test": {"MX": [(10, "elsewhere.test")]},  # a name, but no A or AAAA
        }
    )
    result = resolver_for(dns_server).destinations("example.test")
    assert_failure(
        result,
        RecipientStatus.FAILED,
        "5.4.4",
        "mx1.example.test has no A or AAAA record",
        "mx2.example.test has no A or AAAA record",
    )
    assert {("mx1.example.test", "AAAA"), ("mx2.example.test", "AAAA")} <= set(dns_server.queries)


@pytest.mark.parametrize(
    ("failing", "failing_first", "words"),
    [
        pytest.param("SERVFAIL", False, "SERVFAIL", id="servfail-after"),
        pytest.param("SERVFAIL", True, "SERVFAIL", id="servfail-before"),
        pytest.param("TIMEOUT", False, "0.5 seconds", id="timeout-after"),
        pytest.param({"AAAA": "SERVFAIL"}, False, "SERVFAIL", id="nodata-and-servfail-after"),
        pytest.param({"AAAA": "SERVFAIL"}, True, "SERVFAIL", id="nodata-and-servfail-before"),
    ],
)
def test_a_missing_mx_host_beside_one_whose_lookup_failed_for_now_is_deferred(
    dns_server: LoopbackDNSServer, failing: object, failing_first: bool, words: str
) -> None:
    # The failing one may well have an address: never fail the mail because the DNS was down.
    preferences = (20, 10) if failing_first else (10, 20)
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(preferences[0], "missing.example.test"), (preferences[1], "flaky.example.test")]},
            "flaky.example.test": failing,
        }
    )
    result = resolver_for(dns_server, timeout=0.5).destinations("example.test")
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "No MX host of example.test", words)
    assert ("missing.example.test", "A") in dns_server.queries


def test_a_missing_mx_host_is_skipped_for_one_that_exists(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(10, "missing.example.test"), (20, "mx.example.test")]},
            "mx.example.test": {"A": ["127.0.0.1"], "AAAA": ["::1"]},
        }
    )
    result = resolver_for(dns_server).destinations("example.test")
    assert result.failure is None
    assert result.hosts == (host("mx.example.test", "127.0.0.1"), host("mx.example.test", "::1"))


def test_mx_hosts_beyond_the_bound_are_not_asked_before_failing(dns_server: LoopbackDNSServer) -> None:
    # "Every MX host" is every one looked up: MX_HOSTS_PER_ADDRESS * address_limit of them.
    dns_server.zone = DNSZone({"example.test": {"MX": [(i, f"mx{i}.gone.test") for i in range(10)]}})
    result = resolver_for(dns_server, address_limit=1).destinations("example.test")
    assert_failure(result, RecipientStatus.FAILED, "5.4.4", "mx0.gone.test", "mx1.gone.test")
    assert {name for name, kind in dns_server.queries if kind == "A"} == {"mx0.gone.test", "mx1.gone.test"}


@pytest.mark.parametrize(
    ("exchange", "address"),
    [
        ("8.8.8.8", "8.8.8.8"),
        ("127.0.0.1", "127.0.0.1"),  # loopback, opened by OPEN_NETWORKS
        ("2001:4860:4860::8888", "2001:4860:4860::8888"),
        ("2001:DB8:0::25", "2001:db8::25"),  # written as the address reads best
        ("::1", "::1"),
    ],
)
def test_a_numeric_mx_host_is_used_as_its_address_with_a_warning(
    dns_server: LoopbackDNSServer, caplog: pytest.LogCaptureFixture, exchange: str, address: str
) -> None:
    dns_server.zone = DNSZone({"example.test": {"MX": [(10, exchange + ".")]}})
    with caplog.at_level(logging.WARNING, logger="bumail_queue.delivery.dns"):
        result = resolver_for(dns_server).destinations("example.test")
    assert result == Destinations(hosts=(host(address, address),), failure=None)
    assert dns_server.queries == [("example.test", "MX")]  # no A or AAAA question for it
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "numeric MX host" in record.getMessage()
    assert f"domain=example.test exchange={exchange} " in record.getMessage()


def test_a_numeric_mx_host_keeps_its_place_among_named_ones(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(20, "mx.example.test"), (10, "192.0.2.25."), (30, "2001:db8::25.")]},
            "mx.example.test": {"A": ["127.0.0.1"]},
        }
    )
    result = resolver_for(dns_server).destinations("example.test")
    assert result.hosts == (
        host("192.0.2.25", "192.0.2.25"),
        host("mx.example.test", "127.0.0.1"),
        host("2001:db8::25", "2001:db8::25"),
    )
    assert {name for name, _ in dns_server.queries} == {"example.test", "mx.example.test"}


def test_a_numeric_mx_host_is_refused_by_the_policy_unless_its_network_is_allowed(
    dns_server: LoopbackDNSServer, caplog: pytest.LogCaptureFixture
) -> None:
    dns_server.zone = DNSZone({"example.test": {"MX": [(10, "127.0.0.1."), (20, "::1.")]}})
    with caplog.at_level(logging.WARNING, logger="bumail_queue.delivery.dns"):
        refused = resolver_for(dns_server, allowed=()).destinations("example.test")
    assert_failure(
        refused,
        RecipientStatus.FAILED,
        "5.4.4",
        "No usable address for example.test",
        "127.0.0.1 (loopback)",
        "::1 (loopback)",
        "ALLOWED_PRIVATE_NETWORKS",
    )
    assert "destination refused: domain=example.test host=127.0.0.1 address=127.0.0.1 " in caplog.text
    assert dns_server.queries == [("example.test", "MX")]

    loopback_v4 = (ipaddress.ip_network("127.0.0.0/8"),)
    allowed = resolver_for(dns_server, allowed=loopback_v4).destinations("example.test")
    assert allowed == Destinations(hosts=(host("127.0.0.1", "127.0.0.1"),), failure=None)


def test_a_numeric_mx_host_with_a_zone_index_is_no_address(dns_server: LoopbackDNSServer) -> None:
    # "fe80::1%eth0" would name an interface of this machine: it is looked up as a name.
    dns_server.zone = DNSZone({"example.test": {"MX": [(10, "fe80::1%eth0.")]}})
    result = resolver_for(dns_server, allowed=(ipaddress.ip_network("fe80::/10"),)).destinations("example.test")
    assert_failure(result, RecipientStatus.FAILED, "5.4.4", "fe80::1%eth0 does not exist (NXDOMAIN)")
    assert ("fe80::1%eth0", "A") in dns_server.queries


# -- No MX record: the implicit MX ------------------------------------------------------


def test_no_mx_means_the_domain_itself(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {"A": ["127.0.0.1"], "AAAA": ["::1"]}})
    result = resolver_for(dns_server).destinations("example.test")
    assert result.failure is None
    assert result.hosts == (host("example.test", "127.0.0.1"), host("example.test", "::1"))


def test_no_mx_and_no_address_fails(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {}})
    result = resolver_for(dns_server).destinations("example.test")
    assert_failure(result, RecipientStatus.FAILED, "5.1.2", "example.test", "no MX record and no address")


def test_no_implicit_mx_after_an_mx_servfail(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {"MX": "SERVFAIL", "A": ["127.0.0.1"]}})
    result = resolver_for(dns_server).destinations("example.test")
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "example.test", "SERVFAIL")
    assert dns_server.queries == [("example.test", "MX")]


def test_no_implicit_mx_after_an_mx_timeout(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {"MX": "TIMEOUT", "A": ["127.0.0.1"]}})
    result = resolver_for(dns_server, timeout=0.3).destinations("example.test")
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "example.test")
    assert set(dns_server.queries) == {("example.test", "MX")}


def test_implicit_mx_address_lookup_failing_is_deferred(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {"A": "SERVFAIL"}})
    result = resolver_for(dns_server).destinations("example.test")
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "example.test", "SERVFAIL")


def test_implicit_mx_with_only_one_family_failing_uses_the_other(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {"A": "SERVFAIL", "AAAA": ["::1"]}})
    assert resolver_for(dns_server).destinations("example.test").hosts == (host("example.test", "::1"),)


# -- Null MX, NXDOMAIN, temporary failures ------------------------------------------------


def test_null_mx_fails_without_any_further_lookup(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {"MX": [(0, ".")], "A": ["127.0.0.1"]}})
    result = resolver_for(dns_server).destinations("example.test")
    assert_failure(result, RecipientStatus.FAILED, "5.1.10", "example.test", "accepts no mail (null MX, RFC 7505)")
    assert dns_server.queries == [("example.test", "MX")]


def test_a_root_exchange_beside_real_mx_hosts_is_ignored(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(0, "."), (10, "mx.example.test")]},
            "mx.example.test": {"A": ["127.0.0.1"]},
        }
    )
    assert resolver_for(dns_server).destinations("example.test").hosts == (host("mx.example.test", "127.0.0.1"),)


def test_nxdomain_fails(dns_server: LoopbackDNSServer) -> None:
    result = resolver_for(dns_server).destinations("nowhere.test")
    assert_failure(result, RecipientStatus.FAILED, "5.1.2", "nowhere.test", "does not exist")
    assert dns_server.queries == [("nowhere.test", "MX")]


def test_servfail_is_deferred(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": "SERVFAIL"})
    result = resolver_for(dns_server).destinations("example.test")
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "example.test", "SERVFAIL")


def test_refused_is_deferred(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": "REFUSED"})
    result = resolver_for(dns_server).destinations("example.test")
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "example.test", "REFUSED")


def test_a_slow_server_is_deferred_within_the_timeout(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {"MX": [(10, "mx.example.test")]}}, delay=3)
    started = time.monotonic()
    result = resolver_for(dns_server, timeout=0.4).destinations("example.test")
    assert time.monotonic() - started < 1.5
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "example.test", "no answer within 0.4 seconds")


def test_the_timeout_bounds_the_whole_resolution(dns_server: LoopbackDNSServer) -> None:
    # Each lookup takes 0.3 s; six MX hosts need 13 of them, close to 4 s.
    dns_server.zone = DNSZone(
        {
            "example.test": {"MX": [(i, f"mx{i}.example.test") for i in range(6)]},
            **{f"mx{i}.example.test": {"A": [f"127.0.0.{i + 1}"]} for i in range(6)},
        },
        delay=0.3,
    )
    started = time.monotonic()
    result = resolver_for(dns_server, timeout=1.0).destinations("example.test")
    assert time.monotonic() - started < 2.2
    # What was found in time is used.
    assert result.failure is None
    assert 1 <= len(result.hosts) < 6
    assert result.hosts[0] == host("mx0.example.test", "127.0.0.1")


def test_no_nameserver_answering_is_deferred() -> None:
    resolver = MXResolver(nameservers=[("127.0.0.1", free_udp_port())], port=PORT, timeout=0.5)
    started = time.monotonic()
    result = resolver.destinations("example.test")
    assert time.monotonic() - started < 2
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", "example.test")


def test_the_next_nameserver_is_asked_on_its_own_port(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"example.test": {"A": ["127.0.0.1"]}})
    refusing = LoopbackDNSServer()
    refusing.zone = DNSZone({"example.test": "REFUSED"})
    refusing.start()
    try:
        nameservers = [*refusing.nameservers, *dns_server.nameservers]
        resolver = MXResolver(nameservers=nameservers, port=PORT, timeout=5, allowed_networks=OPEN_NETWORKS)
        assert refusing.port != dns_server.port
        assert resolver.destinations("example.test").hosts == (host("example.test", "127.0.0.1"),)
    finally:
        refusing.stop()
    assert refusing.queries[0] == ("example.test", "MX")
    assert dns_server.queries[0] == ("example.test", "MX")


# -- Address literals and internationalized domains ------------------------------------------


@pytest.mark.parametrize(
    ("domain", "address"),
    [("[192.0.2.1]", "192.0.2.1"), ("[IPv6:::1]", "::1"), ("[ipv6:2001:DB8:0::25]", "2001:db8::25")],
)
def test_address_literal_is_the_host_without_dns(dns_server: LoopbackDNSServer, domain: str, address: str) -> None:
    result = resolver_for(dns_server).destinations(domain)
    assert result == Destinations(hosts=(host(address, address),), failure=None)
    assert dns_server.queries == []


@pytest.mark.parametrize(
    "domain", ["[300.1.2.3]", "[IPv6:192.0.2.1]", "[x-tag:anything]", "[::1]", "[IPv6:fe80::1%eth0]"]
)
def test_other_address_literals_fail(dns_server: LoopbackDNSServer, domain: str) -> None:
    result = resolver_for(dns_server).destinations(domain)
    assert_failure(result, RecipientStatus.FAILED, "5.1.2", domain)
    assert dns_server.queries == []


def test_internationalized_domain_is_looked_up_as_a_labels(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "xn--bcher-kva.test": {"MX": [(10, "xn--mx-fka.xn--bcher-kva.test")]},
            "xn--mx-fka.xn--bcher-kva.test": {"A": ["127.0.0.1"]},
        }
    )
    result = resolver_for(dns_server).destinations("Bücher.test")
    assert result.hosts == (host("xn--mx-fka.xn--bcher-kva.test", "127.0.0.1"),)
    assert dns_server.queries[0] == ("xn--bcher-kva.test", "MX")


def test_internationalized_domain_as_its_own_mx(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone({"xn--bcher-kva.test": {"AAAA": ["::1"]}})
    result = resolver_for(dns_server).destinations("bücher.test")
    assert result.hosts == (host("xn--bcher-kva.test", "::1"),)


@pytest.mark.parametrize("domain", ["", "a..test", "-" * 64 + ".test", "."])
def test_a_domain_that_is_no_domain_name_fails(dns_server: LoopbackDNSServer, domain: str) -> None:
    result = resolver_for(dns_server).destinations(domain)
    assert_failure(result, RecipientStatus.FAILED, "5.1.3", "not a valid domain name")
    assert dns_server.queries == []


# -- Construction ------------------------------------------------------------------------------


def test_an_empty_list_of_nameservers_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MXResolver(nameservers=[], port=PORT)


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout"):
        MXResolver(nameservers=[("127.0.0.1", 53)], port=PORT, timeout=0)


# -- The test server itself --------------------------------------------------------------------


def test_the_server_answers_over_tcp_too(dns_server: LoopbackDNSServer) -> None:
    import dns.message
    import dns.query

    dns_server.zone = DNSZone({"example.test": {"A": ["127.0.0.1"]}})
    response = dns.query.tcp(
        dns.message.make_query("example.test", "A"), dns_server.address, port=dns_server.port, timeout=5
    )
    assert [r.address for r in response.answer[0]] == ["127.0.0.1"]
    assert dns_server.setting == f"127.0.0.1:{dns_server.port}"


@pytest.mark.parametrize("answer", ["TIMEOUT", "SERVFAIL"])
def test_a_failed_lookup_names_the_nameservers_it_asked(dns_server: LoopbackDNSServer, answer: str) -> None:
    dns_server.zone = DNSZone({"example.test": answer})
    result = resolver_for(dns_server, timeout=0.4).destinations("example.test")
    assert_failure(result, RecipientStatus.DEFERRED, "4.4.3", f"DNS_NAMESERVERS 127.0.0.1:{dns_server.port}")


def test_the_systems_nameservers_are_named_as_such() -> None:
    import dns.resolver

    from bumail_queue.delivery.dns import _nameservers_of

    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = ["192.0.2.53"]
    assert _nameservers_of(resolver, system=True) == "the system's nameservers, 192.0.2.53:53"
