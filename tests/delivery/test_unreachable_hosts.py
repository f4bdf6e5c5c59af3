"""RFC 5321 §4.5.4.1: hosts that did not answer are remembered, and not connected to again, for a while.

Real servers on loopback; the memory's time is the transport's injected clock, moved
by the tests (the sockets' own timeouts still run in real time).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import Host
from bumail_queue.delivery.smtp import SMTPTransport
from bumail_queue.items import RecipientStatus
from tests.helpers import FakeClock, envelope, mx, only_reply, timeouts
from tests.servers.smtp import SMTPTestServer, closed_port, make_tls, unanswered_port

DELIVERED, DEFERRED, FAILED = RecipientStatus.DELIVERED, RecipientStatus.DEFERRED, RecipientStatus.FAILED
MX = Route(type="mx")
MEMORY = 300.0
Servers = Callable[..., SMTPTestServer]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def remembering(transports: Callable[..., SMTPTransport], clock: FakeClock) -> Callable[..., SMTPTransport]:
    """Make transports that remember unreachable hosts ``MEMORY`` seconds on ``clock``."""

    def make(**options: Any) -> SMTPTransport:
        return transports(unreachable_memory_seconds=MEMORY, clock=clock, **options)

    return make


def refused_host(name: str = "mx.test") -> Host:
    return Host(name=name, address="127.0.0.1", port=closed_port())


def remembered(text: str) -> bool:
    return "(UNREACHABLE_HOST_MEMORY)" in text


# -- what is remembered ---------------------------------------------------------------


def test_a_host_that_refused_is_not_connected_to_again_within_the_memory(
    smtp_servers: Servers, remembering: Callable[..., SMTPTransport], clock: FakeClock, caplog
):
    caplog.set_level(logging.DEBUG, logger="bumail_queue")
    transport = remembering()
    host = refused_host()
    first = transport.deliver(envelope(item_id="item-1"), route=MX, hosts=[host])
    assert only_reply(first)[:3] == (DEFERRED, None, "4.4.1")
    server = smtp_servers(port=host.port)  # the host is back, but it is remembered
    clock.now += 40
    second = transport.deliver(envelope(item_id="item-2"), route=MX, hosts=[host])
    assert only_reply(second) == (
        DEFERRED,
        None,
        "4.4.1",
        f"{host} did not answer 40 s ago (Connection refused by {host}); "
        "not tried again before 260 s pass (UNREACHABLE_HOST_MEMORY)",
    )
    assert second.remote_host is None
    assert server.connections == 0
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "UNREACHABLE_HOST_MEMORY" in r.getMessage()]
    assert lines == [
        (logging.INFO, f"item-1 {host}: did not answer; not connected to again for 300 s (UNREACHABLE_HOST_MEMORY)"),
        (logging.DEBUG, f"item-2 {host}: not tried: {only_reply(second)[3]}"),
    ]
    clock.now += 260  # the memory has passed: tried again
    third = transport.deliver(envelope(item_id="item-3"), route=MX, hosts=[host])
    assert only_reply(third)[0] is DELIVERED
    assert server.connections == 1


def test_a_host_whose_greeting_did_not_come_is_remembered(
    smtp_servers: Servers, remembering: Callable[..., SMTPTransport], clock: FakeClock
):
    server = smtp_servers(stall_at="greeting")
    transport = remembering(timeouts=timeouts(greeting=0.5))
    first = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    status, code, enhanced, reason = only_reply(first)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert reason.startswith("Timed out waiting for the greeting")
    server.stall_at = None  # it would greet now, but it is remembered
    second = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    status, code, enhanced, text = only_reply(second)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert remembered(text)
    assert f"({reason})" in text
    assert server.connections == 1
    clock.now += MEMORY
    assert only_reply(transport.deliver(envelope(), route=MX, hosts=[mx(server)]))[0] is DELIVERED
    assert server.connections == 2


def test_a_host_that_never_accepted_the_connection_is_remembered(remembering: Callable[..., SMTPTransport]):
    transport = remembering(timeouts=timeouts(connect=0.5))
    with unanswered_port() as port:
        host = Host(name="mx.test", address="127.0.0.1", port=port)
        first = transport.deliver(envelope(), route=MX, hosts=[host])
        second = transport.deliver(envelope(), route=MX, hosts=[host])
    status, code, enhanced, reason = only_reply(first)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert "connecting" in reason
    assert not remembered(reason)
    status, code, enhanced, text = only_reply(second)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert text.startswith(f"{host} did not answer 0 s ago ({reason});")
    assert remembered(text)


def test_a_host_the_sessions_time_ran_out_on_is_not_remembered(
    smtp_servers: Servers, remembering: Callable[..., SMTPTransport]
):
    # The session's time, not the greeting's own, ran out: the host was cut short.
    stalled = smtp_servers(stall_at="greeting")
    transport = remembering(timeouts=timeouts(greeting=30, session=0.5))
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(stalled)])
    assert 'TIMEOUTS["SESSION"]' in only_reply(delivery)[3]
    stalled.stall_at = None
    assert only_reply(transport.deliver(envelope(), route=MX, hosts=[mx(stalled)]))[0] is DELIVERED
    assert stalled.connections == 2


@pytest.mark.parametrize(
    ("knobs", "status"),
    [
        ({"greeting": "421 4.3.2 Too busy"}, DEFERRED),
        ({"greeting": "554 5.3.2 No service"}, FAILED),
        ({"ehlo_reply": "451 4.3.0 Not now"}, DEFERRED),
        ({"drop_at": "greeting"}, DEFERRED),
        ({"stall_at": "EHLO"}, DEFERRED),
    ],
    ids=["421-greeting", "554-greeting", "451-ehlo", "dropped-before-greeting", "ehlo-timed-out"],
)
def test_a_host_that_answered_is_not_remembered(
    smtp_servers: Servers, remembering: Callable[..., SMTPTransport], knobs, status
):
    server = smtp_servers(**knobs)
    transport = remembering(timeouts=timeouts(greeting=0.5))
    for _ in range(2):
        delivery = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
        assert only_reply(delivery)[0] is status
        assert not remembered(only_reply(delivery)[3])
    assert server.connections == 2


def test_a_failed_tls_handshake_is_not_remembered(smtp_servers: Servers, remembering: Callable[..., SMTPTransport]):
    server = smtp_servers(tls=make_tls().server_context, implicit_tls=True)  # a certificate the client refuses
    route = Route(type="smarthost", host="127.0.0.1", port=server.port, tls="implicit", tls_required=True)
    transport = remembering()
    for _ in range(2):
        delivery = transport.deliver(envelope(), route=route, hosts=[Host(name="127.0.0.1", port=server.port)])
        assert only_reply(delivery)[:3] == (DEFERRED, None, "4.7.5")
    assert server.connections == 2


def test_refused_credentials_are_not_remembered(smtp_servers: Servers, remembering: Callable[..., SMTPTransport]):
    server = smtp_servers(auth=("mailer", "another password"))
    route = Route(type="smarthost", host="127.0.0.1", port=server.port, tls="none", username="mailer", password="wrong")
    transport = remembering()
    for _ in range(2):
        delivery = transport.deliver(envelope(), route=route, hosts=[Host(name="127.0.0.1", port=server.port)])
        assert only_reply(delivery)[:3] == (DEFERRED, 535, "4.7.8")
    assert server.connections == 2


# -- several hosts ----------------------------------------------------------------------


def test_of_two_mx_hosts_the_remembered_one_is_skipped(
    smtp_servers: Servers, remembering: Callable[..., SMTPTransport]
):
    transport = remembering()
    first, good = refused_host("mx1.test"), smtp_servers()
    hosts = [first, mx(good, "mx2.test")]
    delivery = transport.deliver(envelope(item_id="item-1"), route=MX, hosts=hosts)
    assert (only_reply(delivery)[0], delivery.remote_host) == (DELIVERED, "mx2.test")
    back = smtp_servers(port=first.port)
    delivery = transport.deliver(envelope(item_id="item-2"), route=MX, hosts=hosts)
    assert (only_reply(delivery)[0], delivery.remote_host) == (DELIVERED, "mx2.test")
    assert back.connections == 0
    assert good.connections == 1  # the pooled connection took both


def test_the_address_is_remembered_whatever_mx_name_leads_to_it(
    smtp_servers: Servers, remembering: Callable[..., SMTPTransport]
):
    transport = remembering()
    first = refused_host("mx1.test")
    transport.deliver(envelope(), route=MX, hosts=[first])
    back = smtp_servers(port=first.port)
    other_name = Host(name="mx9.other.test", address="127.0.0.1", port=first.port)
    text = only_reply(transport.deliver(envelope(), route=MX, hosts=[other_name]))[3]
    assert text.startswith(f"{other_name} did not answer 0 s ago (Connection refused by {first});")
    assert back.connections == 0


def test_an_envelope_whose_every_host_is_remembered_is_deferred_with_the_reason(
    smtp_servers: Servers, remembering: Callable[..., SMTPTransport], clock: FakeClock
):
    transport = remembering()
    hosts = [refused_host("mx1.test"), refused_host("mx2.test")]
    transport.deliver(envelope("a@example.org", "b@example.org"), route=MX, hosts=hosts)
    servers = [smtp_servers(port=host.port) for host in hosts]
    clock.now += 10
    delivery = transport.deliver(envelope("a@example.org", "b@example.org"), route=MX, hosts=hosts)
    assert only_reply(delivery) == (
        DEFERRED,
        None,
        "4.4.1",
        f"{hosts[1]} did not answer 10 s ago (Connection refused by {hosts[1]}); "
        "not tried again before 290 s pass (UNREACHABLE_HOST_MEMORY)",
    )
    assert delivery.remote_host is None
    assert [server.connections for server in servers] == [0, 0]


# -- forgetting -------------------------------------------------------------------------


def _answer_one_session(conn: socket.socket) -> None:
    """Speak just enough SMTP for one transaction and QUIT."""
    conn.settimeout(10)
    stream = conn.makefile("rwb")

    def say(line: bytes) -> None:
        stream.write(line + b"\r\n")
        stream.flush()

    say(b"220 mx.test ESMTP")
    while line := stream.readline():
        verb = line[:4].upper()
        if verb == b"DATA":
            say(b"354 Go ahead")
            while stream.readline() not in (b".\r\n", b""):
                pass
            say(b"250 2.0.0 Queued")
        elif verb == b"QUIT":
            say(b"221 2.0.0 Bye")
            return
        else:
            say(b"250 mx.test")


def test_a_host_that_answers_is_forgotten_though_another_delivery_just_remembered_it(
    remembering: Callable[..., SMTPTransport],
):
    # Two deliveries to one host at once: the first is accepted and waits for its
    # greeting; the second finds the accept queue full, times out connecting, and the
    # host is remembered. Then the first one's session goes through, and clears it.
    transport = remembering(timeouts=timeouts(connect=0.5), reuse_seconds=0)
    accepted, greet = threading.Event(), threading.Event()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        listener.settimeout(10)
        host = Host(name="mx.test", address="127.0.0.1", port=listener.getsockname()[1])

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                accepted.set()
                if greet.wait(10):
                    _answer_one_session(conn)

        with ThreadPoolExecutor(2) as pool:
            served = pool.submit(serve)
            first = pool.submit(transport.deliver, envelope(item_id="item-1"), route=MX, hosts=[host])
            assert accepted.wait(10)
            with socket.create_connection(("127.0.0.1", host.port), timeout=5):  # fills the accept queue
                second = transport.deliver(envelope(item_id="item-2"), route=MX, hosts=[host])
                assert not remembered(only_reply(second)[3])
                assert remembered(only_reply(transport.deliver(envelope(item_id="item-3"), route=MX, hosts=[host]))[3])
                greet.set()
                assert only_reply(first.result(10))[0] is DELIVERED
                served.result(10)
                assert transport.unreachable_count() == 0
                after = transport.deliver(envelope(item_id="item-4"), route=MX, hosts=[host])
    # Tried again at once, not deferred by the memory: the queue is still full.
    status, code, enhanced, text = only_reply(after)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert "connecting" in text
    assert not remembered(text)


# -- the setting --------------------------------------------------------------------------


def test_a_memory_of_zero_remembers_nothing(smtp_servers: Servers, transports: Callable[..., SMTPTransport], caplog):
    caplog.set_level(logging.DEBUG, logger="bumail_queue")
    transport = transports(unreachable_memory_seconds=0, clock=FakeClock())
    host = refused_host()
    for _ in range(2):
        text = only_reply(transport.deliver(envelope(), route=MX, hosts=[host]))[3]
        assert text == f"Connection refused by {host}"
    server = smtp_servers(port=host.port)
    assert only_reply(transport.deliver(envelope(), route=MX, hosts=[host]))[0] is DELIVERED
    assert server.connections == 1
    assert "UNREACHABLE_HOST_MEMORY" not in caplog.text


def test_the_memory_drops_what_expired_and_keeps_at_most_its_limit(
    remembering: Callable[..., SMTPTransport], clock: FakeClock, monkeypatch
):
    monkeypatch.setattr("bumail_queue.delivery.smtp.unreachable.MAX_UNREACHABLE_HOSTS", 3)
    transport = remembering()
    hosts = [refused_host(f"mx{n}.test") for n in range(4)]

    def text(host: Host) -> str:
        return only_reply(transport.deliver(envelope(), route=MX, hosts=[host]))[3]

    for host in hosts[:3]:
        text(host)
        clock.now += 1
    assert transport.unreachable_count() == 3
    text(hosts[3])  # one more than the limit: the oldest is dropped
    assert transport.unreachable_count() == 3
    assert [remembered(text(host)) for host in hosts[3:0:-1]] == [True, True, True]
    assert not remembered(text(hosts[0]))
    clock.now += MEMORY
    assert transport.unreachable_count() == 0
