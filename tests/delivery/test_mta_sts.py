"""MTA-STS (RFC 8461): the TXT record, the policy's text, its fetch over HTTPS from a
real server on loopback, the policies kept, and the SMTP client's TLS under a policy."""

from __future__ import annotations

import ipaddress
import threading
from datetime import UTC, datetime, timedelta

import pytest

from bumail_queue.conf import Route, get_settings
from bumail_queue.delivery.envelope import Envelope, Host, TLSSession
from bumail_queue.delivery.mta_sts import MAX_POLICY_SIZE, PolicyError, STSPolicies, parse_policy, parse_txt
from bumail_queue.items import RecipientStatus
from bumail_queue.stores.memory import MemoryStore
from bumail_queue.sts import STSMode, STSPolicy, TLSResult
from tests.helpers import FakeClock, wait_until
from tests.servers.dns import LOOPBACK_NETWORKS, DNSZone, LoopbackDNSServer
from tests.servers.https import PolicyResponse, PolicyServer, Request, TestPKI, policy_text
from tests.servers.smtp import SMTPTestServer

DOMAIN = "sts.test"
POLICY_HOST = "mta-sts.sts.test"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LOOPBACK = [ipaddress.ip_network(network) for network in LOOPBACK_NETWORKS]


class Clock:
    """The time policies are fetched and expire at, moved by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def policy_server(https_servers, test_pki: TestPKI) -> PolicyServer:
    server = https_servers(test_pki.server_context(POLICY_HOST))
    server.responses[POLICY_HOST] = PolicyResponse(policy_text("enforce", "mx.sts.test", "*.mail.sts.test"))
    return server


def announce(dns_server: LoopbackDNSServer, policy_id: str | None = "20260301", **more) -> None:
    """Serve ``_mta-sts.sts.test`` (with ``policy_id``; none for ``None``) and the policy host's address."""
    records = {POLICY_HOST: {"A": ["127.0.0.1"]}, **more}
    if policy_id is not None:
        records[f"_mta-sts.{DOMAIN}"] = {"TXT": [f"v=STSv1; id={policy_id};"]}
    dns_server.zone = DNSZone(records)


def policies(
    dns_server, server, test_pki, *, store=None, clock=None, monotonic=None, allowed=LOOPBACK, ca_file=None
) -> STSPolicies:
    return STSPolicies(
        cache=store if store is not None else MemoryStore(get_settings()),
        nameservers=dns_server.nameservers,
        https_port=server.port,
        ca_file=ca_file or test_pki.ca_file,
        allowed_networks=allowed,
        clock=clock or Clock(),
        monotonic=monotonic or FakeClock(),
    )


# -- the TXT record (RFC 8461 §3.1) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (["v=STSv1; id=20160831085700Z;"], "20160831085700Z"),
        (["v=STSv1;id=abc123"], "abc123"),
        (["v=STSv1; id=abc; ext_1=value;"], "abc"),
        (["v=spf1 -all", "v=STSv1; id=one;"], "one"),  # other records are set aside
        (["v=STSv1; id=one;", "v=STSv1; id=two;"], None),  # two: no policy
        (["v=STSv1;"], None),  # no id
        (["v=STSv1; id=has-a-dash;"], None),
        (["v=STSv1; id=" + "a" * 33 + ";"], None),
        (["v=STSv1; id=a; id=b;"], None),
        (["v=STSv2; id=a;"], None),
        ([], None),
    ],
)
def test_the_txt_record_announces_a_policy_id_or_none(texts, expected):
    assert parse_txt(texts) == expected


# -- the policy (RFC 8461 §3.2) -------------------------------------------------------------


def test_a_policy_is_parsed_from_crlf_or_lf_lines_its_extensions_ignored():
    text = "version: STSv1\r\nmode: enforce\r\nmx: MX1.Example.com.\nmx:*.mail.example.net\nfuture_field: x\nmax_age: 604800\n"
    policy = parse_policy(text, domain="example.com", policy_id="abc", fetched_at=T0)
    assert policy == STSPolicy(
        domain="example.com",
        id="abc",
        mode=STSMode.ENFORCE,
        mx=("mx1.example.com", "*.mail.example.net"),
        max_age=604800,
        fetched_at=T0,
    )
    assert policy.expires_at == T0 + timedelta(days=7)
    assert policy.lines() == (
        "version: STSv1",
        "mode: enforce",
        "mx: mx1.example.com",
        "mx: *.mail.example.net",
        "max_age: 604800",
    )


def test_a_none_policy_needs_no_mx():
    policy = parse_policy("version: STSv1\nmode: none\nmax_age: 86400\n", domain="d.test", policy_id="x", fetched_at=T0)
    assert (policy.mode, policy.mx) == (STSMode.NONE, ())


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("mode: enforce\nmx: a.test\nmax_age: 1\n", "no 'version' field"),
        ("version: STSv2\nmode: enforce\nmx: a.test\nmax_age: 1\n", "version is 'STSv2'"),
        ("version: STSv1\nmode: strict\nmx: a.test\nmax_age: 1\n", "mode is 'strict'"),
        ("version: STSv1\nmode: enforce\nmode: testing\nmx: a.test\nmax_age: 1\n", "2 'mode' fields"),
        ("version: STSv1\nmode: enforce\nmax_age: 86400\n", "names no mx"),
        ("version: STSv1\nmode: testing\nmx: a.test\nmax_age: 31557601\n", "max_age is '31557601'"),
        ("version: STSv1\nmode: testing\nmx: a.test\nmax_age: -5\n", "max_age is '-5'"),
        ("version: STSv1\nmode: testing\nmx: *.*.a.test\nmax_age: 5\n", "the mx '*.*.a.test'"),
        ("version: STSv1\nmode: testing\nmx: mail.*.test\nmax_age: 5\n", "the mx 'mail.*.test'"),
        ("<html>oops</html>", "is not 'name: value'"),
    ],
)
def test_an_invalid_policy_is_refused_saying_why(text, why):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, domain="d.test", policy_id="x", fetched_at=T0)
    assert caught.value.result is TLSResult.STS_POLICY_INVALID
    assert why in caught.value.text


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("mx.sts.test", True),
        ("MX.STS.TEST.", True),
        ("a.mail.sts.test", True),  # *.mail.sts.test: one label in the wildcard's place
        ("mail.sts.test", False),  # not the parent itself
        ("a.b.mail.sts.test", False),  # nor two labels
        ("mx.other.test", False),
    ],
)
def test_mx_patterns_match_as_rfc_8461_section_4_1_says(host, allowed):
    policy = parse_policy(
        policy_text("enforce", "mx.sts.test", "*.mail.sts.test").decode(), domain=DOMAIN, policy_id="x", fetched_at=T0
    )
    assert policy.allows(host) is allowed


# -- fetching (RFC 8461 §3.3) ---------------------------------------------------------------


def test_the_policy_is_fetched_from_the_address_dns_gave_with_sni_and_host_and_kept(
    dns_server, policy_server, test_pki
):
    announce(dns_server)
    store = MemoryStore(get_settings())
    found = policies(dns_server, policy_server, test_pki, store=store).policy_for(DOMAIN)
    assert found.policy is not None
    assert (found.policy.id, found.policy.mode, found.policy.mx, found.policy.max_age) == (
        "20260301",
        STSMode.ENFORCE,
        ("mx.sts.test", "*.mail.sts.test"),
        86400,
    )
    assert policy_server.requests == [Request(host=POLICY_HOST, path="/.well-known/mta-sts.txt", sni=POLICY_HOST)]
    assert ("_mta-sts.sts.test", "TXT") in dns_server.queries
    assert (POLICY_HOST, "A") in dns_server.queries
    assert store.get_sts_policy(DOMAIN) == found.policy


def failure_of(dns_server, server, test_pki, **options):
    found = policies(dns_server, server, test_pki, **options).policy_for(DOMAIN)
    assert found.policy is None
    return found.failure, found.reason


def test_a_redirect_is_not_followed(dns_server, policy_server, test_pki):
    announce(dns_server)
    policy_server.responses[POLICY_HOST] = PolicyResponse(
        b"", status=301, headers={"Location": "https://mta-sts.other.test/.well-known/mta-sts.txt"}
    )
    result, reason = failure_of(dns_server, policy_server, test_pki)
    assert result is TLSResult.STS_POLICY_FETCH_ERROR
    assert "redirects (301) to 'https://mta-sts.other.test/.well-known/mta-sts.txt'" in reason
    assert [r.host for r in policy_server.requests] == [POLICY_HOST]


@pytest.mark.parametrize("content_length", [True, False])
def test_a_body_over_64_kib_is_refused(dns_server, policy_server, test_pki, content_length):
    announce(dns_server)
    body = policy_text("enforce", "mx.sts.test") + b"# " + b"x" * MAX_POLICY_SIZE + b"\n"
    policy_server.responses[POLICY_HOST] = PolicyResponse(body, content_length=content_length)
    result, reason = failure_of(dns_server, policy_server, test_pki)
    assert result is TLSResult.STS_POLICY_FETCH_ERROR
    assert f"the {MAX_POLICY_SIZE} octets a policy may have" in reason


def test_a_policy_of_another_media_type_is_refused(dns_server, policy_server, test_pki):
    announce(dns_server)
    policy_server.responses[POLICY_HOST] = PolicyResponse(
        policy_text("enforce", "mx.sts.test"), content_type="text/html"
    )
    result, reason = failure_of(dns_server, policy_server, test_pki)
    assert result is TLSResult.STS_POLICY_INVALID
    assert "is served as 'text/html', not 'text/plain'" in reason


def test_text_plain_with_a_charset_is_taken(dns_server, policy_server, test_pki):
    announce(dns_server)
    policy_server.responses[POLICY_HOST] = PolicyResponse(
        policy_text("testing", "mx.sts.test"), content_type="text/plain; charset=utf-8"
    )
    found = policies(dns_server, policy_server, test_pki).policy_for(DOMAIN)
    assert found.policy is not None and found.policy.mode is STSMode.TESTING


def test_an_http_error_leaves_the_domain_without_a_policy(dns_server, policy_server, test_pki):
    announce(dns_server)
    del policy_server.responses[POLICY_HOST]
    assert failure_of(dns_server, policy_server, test_pki) == (
        TLSResult.STS_POLICY_FETCH_ERROR,
        f"https://{POLICY_HOST}:{policy_server.port}/.well-known/mta-sts.txt answered HTTP 404",
    )


@pytest.mark.parametrize(
    ("context", "words"),
    [
        ("other_ca_context", "unable to get local issuer certificate"),
        ("expired_context", "certificate has expired"),
        ("wrong_name", "Hostname mismatch"),
    ],
)
def test_a_policy_host_whose_certificate_fails_is_sts_webpki_invalid(
    dns_server, https_servers, test_pki, context, words
):
    announce(dns_server)
    if context == "wrong_name":
        server = https_servers(test_pki.server_context("mta-sts.other.test"))
    else:
        server = https_servers(getattr(test_pki, context)(POLICY_HOST))
    server.responses[POLICY_HOST] = PolicyResponse(policy_text("enforce", "mx.sts.test"))
    result, reason = failure_of(dns_server, server, test_pki)
    assert result is TLSResult.STS_WEBPKI_INVALID
    assert reason.startswith(
        f"The certificate of https://{POLICY_HOST}:{server.port}/.well-known/mta-sts.txt is not valid"
    )
    assert words in reason
    assert server.requests == []  # no request went over a connection that failed


def test_a_policy_host_in_a_private_network_is_not_connected_to(dns_server, policy_server, test_pki):
    announce(dns_server)
    result, reason = failure_of(dns_server, policy_server, test_pki, allowed=())
    assert result is TLSResult.STS_POLICY_FETCH_ERROR
    assert "Every address of mta-sts.sts.test is refused as not globally routable: 127.0.0.1 (loopback)" in reason
    assert "ALLOWED_PRIVATE_NETWORKS" in reason
    assert policy_server.requests == []


def test_without_a_txt_record_there_is_no_policy_and_no_fetch(dns_server, policy_server, test_pki):
    announce(dns_server, policy_id=None)
    found = policies(dns_server, policy_server, test_pki).policy_for(DOMAIN)
    assert (found.policy, found.failure) == (None, None)
    assert policy_server.requests == []


# -- kept policies ------------------------------------------------------------------------


def test_a_kept_policy_serves_another_worker_without_a_fetch(dns_server, policy_server, test_pki):
    announce(dns_server)
    store = MemoryStore(get_settings())
    first = policies(dns_server, policy_server, test_pki, store=store).policy_for(DOMAIN)
    second = policies(dns_server, policy_server, test_pki, store=store).policy_for(DOMAIN)
    assert second.policy == first.policy
    assert policy_server.count(POLICY_HOST) == 1


def test_a_changed_id_fetches_the_policy_again(dns_server, policy_server, test_pki):
    announce(dns_server, "one")
    finder = policies(dns_server, policy_server, test_pki)
    assert finder.policy_for(DOMAIN).policy.mode is STSMode.ENFORCE
    announce(dns_server, "two")
    policy_server.responses[POLICY_HOST] = PolicyResponse(policy_text("testing", "mx.sts.test"))
    found = finder.policy_for(DOMAIN).policy
    assert (found.id, found.mode) == ("two", STSMode.TESTING)
    assert policy_server.count(POLICY_HOST) == 2
    assert finder.policy_for(DOMAIN).policy == found  # and kept
    assert policy_server.count(POLICY_HOST) == 2


def test_an_enforce_policy_outlives_its_txt_record_until_it_expires(dns_server, policy_server, test_pki):
    announce(dns_server)
    clock = Clock()
    finder = policies(dns_server, policy_server, test_pki, clock=clock)
    fetched = finder.policy_for(DOMAIN).policy
    announce(dns_server, policy_id=None)  # an attacker strips the record, or the DNS stops answering
    clock.now = T0 + timedelta(seconds=86399)
    assert finder.policy_for(DOMAIN).policy == fetched
    assert finder.policy_for(DOMAIN).mode is STSMode.ENFORCE
    clock.now = T0 + timedelta(seconds=86400)
    assert finder.policy_for(DOMAIN).policy is None
    assert policy_server.count(POLICY_HOST) == 1


def test_a_kept_policy_applies_while_the_new_one_cannot_be_fetched(dns_server, policy_server, test_pki):
    announce(dns_server, "one")
    finder = policies(dns_server, policy_server, test_pki)
    kept = finder.policy_for(DOMAIN).policy
    announce(dns_server, "two")
    policy_server.responses[POLICY_HOST] = PolicyResponse(b"down", status=503)
    found = finder.policy_for(DOMAIN)
    assert (found.policy, found.failure) == (kept, None)


def test_a_failed_fetch_is_not_tried_again_for_five_minutes(dns_server, policy_server, test_pki):
    announce(dns_server)
    policy_server.responses[POLICY_HOST] = PolicyResponse(b"down", status=503)
    monotonic, clock = FakeClock(), Clock()
    finder = policies(dns_server, policy_server, test_pki, monotonic=monotonic, clock=clock)
    for _ in range(3):
        assert finder.policy_for(DOMAIN).failure is TLSResult.STS_POLICY_FETCH_ERROR
    assert policy_server.count(POLICY_HOST) == 1
    monotonic.now += 300
    clock.now += timedelta(seconds=300)
    policy_server.responses[POLICY_HOST] = PolicyResponse(policy_text("enforce", "mx.sts.test"))
    assert finder.policy_for(DOMAIN).mode is STSMode.ENFORCE
    assert policy_server.count(POLICY_HOST) == 2


def test_a_policy_host_that_dribbles_its_status_line_and_headers_is_cut_off_at_the_fetch_deadline(
    dns_server, policy_server, test_pki
):
    # One byte every 0.2 s: each read gets its bytes well within its own timeout, and
    # the answer would take about 20 s in all; the fetch has one second.
    announce(dns_server)
    policy_server.responses[POLICY_HOST] = PolicyResponse(policy_text("enforce", "mx.sts.test"), dribble=0.2)
    finder = STSPolicies(
        cache=MemoryStore(get_settings()),
        nameservers=dns_server.nameservers,
        https_port=policy_server.port,
        ca_file=test_pki.ca_file,
        allowed_networks=LOOPBACK,
        clock=Clock(),
        fetch_seconds=1.0,
    )
    found = finder.policy_for(DOMAIN)

    assert (found.policy, found.failure) == (None, TLSResult.STS_POLICY_FETCH_ERROR)
    assert (
        found.reason == f"https://{POLICY_HOST}:{policy_server.port}/.well-known/mta-sts.txt took longer than 1 seconds"
    )
    assert wait_until(lambda: policy_server.dribbles_cut == 1)  # the server saw the client hang up


def test_threads_waiting_for_a_fetch_under_way_give_up_at_the_deadline_of_their_own(
    dns_server, policy_server, test_pki
):
    announce(dns_server)
    policy_server.responses[POLICY_HOST] = PolicyResponse(policy_text("enforce", "mx.sts.test"), dribble=0.2)
    finder = STSPolicies(
        cache=MemoryStore(get_settings()),
        nameservers=dns_server.nameservers,
        https_port=policy_server.port,
        ca_file=test_pki.ca_file,
        allowed_networks=LOOPBACK,
        clock=Clock(),
        fetch_seconds=1.0,
    )
    found: list[object] = []
    threads = [threading.Thread(target=lambda: found.append(finder.policy_for(DOMAIN))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert not any(thread.is_alive() for thread in threads)
    assert [f.failure for f in found] == [TLSResult.STS_POLICY_FETCH_ERROR] * 4  # type: ignore[attr-defined]
    assert policy_server.count(POLICY_HOST) == 1  # one fetch for all of them


def test_a_failed_fetch_is_not_tried_again_by_another_worker_or_pass_sharing_the_store(
    dns_server, policy_server, test_pki
):
    # Each queue.deliver_due() (a task, a cron run) makes a worker, and its policies, of
    # its own: the store keeps the failure for them all.
    announce(dns_server)
    policy_server.responses[POLICY_HOST] = PolicyResponse(b"down", status=503)
    store, clock = MemoryStore(get_settings()), Clock()
    for _ in range(10):
        found = policies(dns_server, policy_server, test_pki, store=store, clock=clock).policy_for(DOMAIN)
        assert (found.failure, found.reason) == (
            TLSResult.STS_POLICY_FETCH_ERROR,
            f"https://{POLICY_HOST}:{policy_server.port}/.well-known/mta-sts.txt answered HTTP 503",
        )
    assert policy_server.count(POLICY_HOST) == 1
    clock.now += timedelta(minutes=5)
    policy_server.responses[POLICY_HOST] = PolicyResponse(policy_text("enforce", "mx.sts.test"))
    assert (
        policies(dns_server, policy_server, test_pki, store=store, clock=clock).policy_for(DOMAIN).mode
        is STSMode.ENFORCE
    )
    assert policy_server.count(POLICY_HOST) == 2


def test_a_fetch_purges_the_policies_and_failures_kept_past_their_time(dns_server, policy_server, test_pki):
    announce(dns_server)
    store, clock = MemoryStore(get_settings()), Clock()
    expired = STSPolicy(
        domain="old.test",
        id="1",
        mode=STSMode.ENFORCE,
        mx=("mx.old.test",),
        max_age=60,
        fetched_at=T0 - timedelta(hours=1),
    )
    store.put_sts_policy(expired)
    policies(dns_server, policy_server, test_pki, store=store, clock=clock).policy_for(DOMAIN)
    assert store.get_sts_policy("old.test") is None
    assert store.get_sts_policy(DOMAIN) is not None


def test_a_policy_of_more_than_100_mx_patterns_is_refused():
    text = (
        "version: STSv1\nmode: enforce\n" + "".join(f"mx: mx{n}.example.com\n" for n in range(101)) + "max_age: 86400\n"
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, domain=DOMAIN, policy_id="1", fetched_at=T0)
    assert caught.value.result is TLSResult.STS_POLICY_INVALID
    assert "it has 101 mx patterns, more than the 100 a policy may have here" in caught.value.text
    fits = text.replace("mx: mx100.example.com\n", "")
    assert len(parse_policy(fits, domain=DOMAIN, policy_id="1", fetched_at=T0).mx) == 100


# -- the SMTP client's TLS under a policy -----------------------------------------------------


def envelope() -> Envelope:
    return Envelope(
        item_id="item-1", sender="s@example.com", recipients=("r@sts.test",), message=b"Subject: x\r\n\r\nhi\r\n"
    )


def test_a_pooled_connection_is_not_reused_under_another_policy(smtp_servers, test_pki, transports):
    server: SMTPTestServer = smtp_servers(tls=test_pki.server_context("mx.sts.test"))
    transport = transports(ssl_context=None, ca_file=test_pki.ca_file)
    host = Host(name="mx.sts.test", address="127.0.0.1", port=server.port)
    plain_route, enforced = Route(type="mx"), Route(type="mx", mta_sts=STSMode.ENFORCE)
    first = transport.deliver(envelope(), route=plain_route, hosts=[host])
    again = transport.deliver(envelope(), route=plain_route, hosts=[host])
    assert (first.tls_sessions, again.tls_sessions, server.connections) == ((), (), 1)  # reused: no policy
    enforced_delivery = transport.deliver(envelope(), route=enforced, hosts=[host])
    assert server.connections == 2  # not the unverified session of the first two
    assert enforced_delivery.tls_sessions == (TLSSession(host="mx.sts.test", address="127.0.0.1"),)
    assert enforced_delivery.outcomes["r@sts.test"].status is RecipientStatus.DELIVERED
    transport.deliver(envelope(), route=enforced, hosts=[host])
    assert server.connections == 2  # a verified session serves the same policy again


def test_testing_goes_on_with_unverified_tls_when_the_certificate_fails(smtp_servers, test_pki, transports):
    server: SMTPTestServer = smtp_servers(tls=test_pki.other_ca_context("mx.sts.test"))
    transport = transports(ssl_context=None, ca_file=test_pki.ca_file)
    host = Host(name="mx.sts.test", address="127.0.0.1", port=server.port)
    delivery = transport.deliver(envelope(), route=Route(type="mx", mta_sts=STSMode.TESTING), hosts=[host])
    assert delivery.outcomes["r@sts.test"].status is RecipientStatus.DELIVERED
    assert delivery.tls is True
    [session] = delivery.tls_sessions
    assert (session.host, session.failure) == ("mx.sts.test", TLSResult.CERTIFICATE_NOT_TRUSTED)
    assert server.verbs().count("STARTTLS") == 2  # verified, refused; then unverified
