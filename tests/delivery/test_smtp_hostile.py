"""The SMTP client against hostile servers on loopback: slow bytes, endless or huge
replies, silence, echoed credentials, too many failing MX hosts."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import Host
from bumail_queue.delivery.smtp import (
    MAX_REPLY_LINE,
    MAX_REPLY_LINES,
    SMTPTransport,
)
from bumail_queue.items import RecipientStatus
from tests.helpers import PASSWORD, USER, envelope, mx, only_reply, timeouts, wait_until
from tests.servers.hostile_smtp import HostileSMTPServer, Peer
from tests.servers.smtp import SMTPTestServer, TestTLS, closed_port

DELIVERED, DEFERRED, FAILED = (
    RecipientStatus.DELIVERED,
    RecipientStatus.DEFERRED,
    RecipientStatus.FAILED,
)
MX = Route(type="mx")
GREETING = b"220 hostile.test ESMTP\r\n"
ROOT = Path(__file__).resolve().parents[2]

Servers = Callable[..., SMTPTestServer]
Hostile = Callable[[Callable[[Peer], None]], HostileSMTPServer]


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    started: list[HostileSMTPServer] = []

    def start(script: Callable[[Peer], None]) -> HostileSMTPServer:
        started.append(HostileSMTPServer(script))
        return started[-1]

    yield start
    for server in started:
        server.stop()


# -- SESSION is a deadline, whatever the pace of the bytes ------------------------------


def dribbled_greeting(peer: Peer) -> None:
    # 200 bytes at one byte every 20 ms: each byte arrives well within any timeout.
    peer.dribble(b"220 " + b"x" * 196 + b"\r\n", interval=0.02)
    peer.serve_until("QUIT")


def test_a_dribbled_greeting_ends_when_session_runs_out(hostile: Hostile, transports: Callable[..., SMTPTransport]):
    server = hostile(dribbled_greeting)
    transport = transports(timeouts=timeouts(greeting=60, session=0.5))
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert 'TIMEOUTS["SESSION"]' in text
    assert "waiting for the greeting" in text
    [peer] = server.peers
    assert wait_until(lambda: peer.hung_up or peer.finished)
    assert peer.hung_up and not peer.finished  # the client left before the greeting was over


def test_a_dribbled_greeting_ends_when_its_step_timeout_runs_out(
    hostile: Hostile, transports: Callable[..., SMTPTransport]
):
    server = hostile(dribbled_greeting)
    transport = transports(timeouts=timeouts(greeting=0.5, session=60))
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert 'TIMEOUTS["GREETING"]' in text
    assert "SESSION" not in text
    [peer] = server.peers
    assert wait_until(lambda: peer.hung_up or peer.finished)
    assert peer.hung_up and not peer.finished


def silent_after_the_dot(peer: Peer) -> None:
    peer.send(GREETING)
    peer.serve_until("DATA_END")
    peer.hold()


def dribbled_after_the_dot(peer: Peer) -> None:
    peer.send(GREETING)
    peer.serve_until("DATA_END")
    peer.dribble(b"250 2.0.0 " + b"x" * 190 + b"\r\n", interval=0.02)
    peer.serve_until("QUIT")


@pytest.mark.parametrize(
    ("script", "steps", "limit"),
    [
        (silent_after_the_dot, {"data_end": 0.5}, 'TIMEOUTS["DATA_END"]'),
        (silent_after_the_dot, {"session": 1}, 'TIMEOUTS["SESSION"]'),
        (dribbled_after_the_dot, {"data_end": 0.5}, 'TIMEOUTS["DATA_END"]'),
        (dribbled_after_the_dot, {"session": 1}, 'TIMEOUTS["SESSION"]'),
    ],
)
def test_the_reply_after_the_dot_is_bounded(
    hostile: Hostile, transports: Callable[..., SMTPTransport], script, steps, limit
):
    server = hostile(script)
    transport = transports(timeouts=timeouts(**steps))
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert "waiting for the reply to the message" in text
    assert limit in text
    [peer] = server.peers
    assert wait_until(lambda: peer.hung_up or peer.finished)
    assert peer.hung_up and not peer.finished
    assert transport.pooled_count() == 0


# -- replies are bounded -----------------------------------------------------------------


def flooded_ehlo(peer: Peer) -> None:
    peer.send(GREETING)
    assert peer.read_line().upper().startswith("EHLO")
    peer.flood(b"250-" + b"x" * 70 + b"\r\n", 64 * 1024 * 1024)
    peer.send(b"250 8BITMIME\r\n")
    peer.serve_until("QUIT")


_DELIVER_IN_A_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import django
    django.setup()
    from bumail_queue.conf import Route, Timeouts
    from bumail_queue.delivery.envelope import Envelope, Host
    from bumail_queue.delivery.smtp import SMTPTransport

    def peak():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

    steps = dict(connect=5, greeting=60, mail=5, rcpt=5, data=5, data_block=5, data_end=5, session=120)
    transport = SMTPTransport(hostname="client.example.com", timeouts=Timeouts(**steps), reuse_seconds=0)
    envelope = Envelope(item_id="item-1", sender="s@example.com", recipients=("ann@example.org",), message=b"Subject: x\\r\\n\\r\\nx\\r\\n")
    before = peak()
    delivery = transport.deliver(envelope, route=Route(type="mx"), hosts=[Host(name="mx.test", address="127.0.0.1", port=int(sys.argv[1]))])
    grew = peak() - before
    [outcome] = delivery.outcomes.values()
    print(json.dumps({"grew": grew, "status": outcome.status.value, "enhanced": outcome.reply.status, "text": outcome.reply.text}))
    """
)


def test_an_endless_ehlo_reply_ends_at_100_lines_and_memory_stays_flat(
    hostile: Hostile,
):
    server = hostile(flooded_ehlo)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
    }
    child = subprocess.run(
        [sys.executable, "-c", _DELIVER_IN_A_CHILD, str(server.port)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert (result["status"], result["enhanced"]) == ("deferred", "4.5.0")
    assert f"longer than {MAX_REPLY_LINES} lines" in result["text"]
    assert result["grew"] < 20 * 1024 * 1024, result
    [peer] = server.peers
    assert wait_until(lambda: peer.hung_up or peer.finished)
    assert peer.hung_up and not peer.finished  # the client left before the flood was over


def endless_greeting_line(peer: Peer) -> None:
    peer.send(b"220 " + b"x" * 100_000)
    peer.hold()


def endless_ehlo_line(peer: Peer) -> None:
    peer.send(GREETING)
    peer.read_line()
    peer.send(b"250-" + b"x" * 100_000)
    peer.hold()


@pytest.mark.parametrize("script", [endless_greeting_line, endless_ehlo_line])
def test_a_reply_line_without_end_is_cut_at_2048_octets(
    hostile: Hostile, transports: Callable[..., SMTPTransport], script
):
    server = hostile(script)
    delivery = transports().deliver(envelope(), route=MX, hosts=[mx(server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.5.0")
    assert f"longer than {MAX_REPLY_LINE} octets" in text
    assert "mx.test" in text
    [peer] = server.peers
    assert wait_until(lambda: peer.hung_up)


def test_a_long_reply_within_the_bounds_is_read(hostile: Hostile, transports: Callable[..., SMTPTransport]):
    def script(peer: Peer) -> None:
        peer.send(GREETING)
        peer.read_line()
        lines = [b"250-hostile.test"] + [b"250-X-" + b"y" * (MAX_REPLY_LINE - 10) for _ in range(MAX_REPLY_LINES - 2)]
        peer.send(b"\r\n".join(lines) + b"\r\n250 8BITMIME\r\n")
        peer.serve_until("QUIT")

    server = hostile(script)
    delivery = transports().deliver(envelope(), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[:3] == (DELIVERED, 250, "2.0.0")


# -- STARTTLS: nothing said before the handshake counts after it ------------------------


def test_replies_injected_before_the_tls_handshake_are_discarded(
    hostile: Hostile, transports: Callable[..., SMTPTransport], smtp_tls: TestTLS
):
    def script(peer: Peer) -> None:
        peer.send(GREETING)
        peer.serve_until("STARTTLS", tls=True)
        # RFC 3207 §6: the reply to a command sent after TLS, smuggled in before it.
        peer.send(b"220 2.0.0 Ready\r\n250 injected-ehlo\r\n")
        peer.start_tls(smtp_tls.server_context)
        peer.serve_until("QUIT")

    server = hostile(script)
    delivery = transports().deliver(envelope(), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[:3] == (DELIVERED, 250, "2.0.0")
    assert delivery.tls is True
    [peer] = server.peers
    assert [c.split(" ")[0].upper() for c in peer.commands[:4]] == [
        "EHLO",
        "STARTTLS",
        "EHLO",
        "MAIL",
    ]


# -- MX_SESSION_LIMIT ----------------------------------------------------------------------


def test_mx_session_limit_stops_after_two_greeted_hosts(
    smtp_servers: Servers, transports: Callable[..., SMTPTransport]
):
    first, second = (
        smtp_servers(greeting="421 4.3.2 Too busy"),
        smtp_servers(ehlo_reply="451 4.3.0 Not now"),
    )
    third = smtp_servers()
    delivery = transports().deliver(
        envelope(),
        route=MX,
        hosts=[
            mx(first, "mx1.test"),
            mx(second, "mx2.test"),
            mx(third, "mx3.test"),
        ],
    )
    assert only_reply(delivery) == (DEFERRED, 451, "4.3.0", "4.3.0 Not now")
    assert delivery.remote_host == "mx2.test"
    assert (first.connections, second.connections, third.connections) == (1, 1, 0)


def test_mx_session_limit_does_not_count_refused_connections(
    smtp_servers: Servers, transports: Callable[..., SMTPTransport]
):
    busy, good = smtp_servers(greeting="421 4.3.2 Too busy"), smtp_servers()
    refused = [Host(name=f"mx{i}.test", address="127.0.0.1", port=closed_port()) for i in range(3)]
    hosts = [
        refused[0],
        mx(busy, "mx1.test"),
        refused[1],
        refused[2],
        mx(good, "mx2.test"),
    ]
    delivery = transports().deliver(envelope(), route=MX, hosts=hosts)
    assert only_reply(delivery)[0] is DELIVERED
    assert delivery.remote_host == "mx2.test"


def test_mx_session_limit_can_be_raised(smtp_servers: Servers, transports: Callable[..., SMTPTransport]):
    busy = [smtp_servers(greeting="421 4.3.2 Too busy") for _ in range(2)]
    good = smtp_servers()
    transport = transports(mx_session_limit=3)
    delivery = transport.deliver(
        envelope(),
        route=MX,
        hosts=[
            mx(busy[0], "mx1.test"),
            mx(busy[1], "mx2.test"),
            mx(good, "mx3.test"),
        ],
    )
    assert only_reply(delivery)[0] is DELIVERED
    assert good.connections == 1


# -- AUTH echoes are redacted --------------------------------------------------------------


def auth_forms() -> list[str]:
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return [
        b64(f"\0{USER}\0{PASSWORD}".encode()),
        b64(USER.encode()),
        b64(PASSWORD.encode()),
        PASSWORD,
    ]


def smarthost(server: SMTPTestServer) -> Route:
    return Route(
        type="smarthost",
        host="127.0.0.1",
        port=server.port,
        tls="none",
        username=USER,
        password=PASSWORD,
    )


def test_a_refused_auth_that_echoes_the_credentials_keeps_none_of_them(
    smtp_servers: Servers, transports: Callable[..., SMTPTransport], caplog
):
    caplog.set_level("DEBUG", logger="bumail_queue")
    server = smtp_servers(auth=(USER, PASSWORD), auth_reply="535 5.7.8 Refused: " + " ".join(auth_forms()))
    delivery = transports().deliver(envelope(), route=smarthost(server), hosts=[mx(server, "relay.test")])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, 535, "4.7.8")
    assert text == "5.7.8 Refused: " + " ".join(["[redacted]"] * 4)
    ours = " ".join(r.getMessage() for r in caplog.records if r.name.startswith("bumail_queue"))
    assert "AUTH -> 535" in ours
    for secret in auth_forms():
        assert secret not in ours


def test_a_reply_after_auth_that_echoes_the_password_keeps_none_of_it(
    smtp_servers: Servers, transports: Callable[..., SMTPTransport]
):
    server = smtp_servers(auth=(USER, PASSWORD), mail_reply=f"451 4.3.0 Not now, {PASSWORD}")
    delivery = transports().deliver(envelope(), route=smarthost(server), hosts=[mx(server, "relay.test")])
    assert only_reply(delivery) == (DEFERRED, 451, "4.3.0", "4.3.0 Not now, [redacted]")
    assert server.logins == [USER]


# -- TLS is recorded -------------------------------------------------------------------------


def test_the_delivery_says_whether_its_session_ran_over_tls(
    smtp_servers: Servers, smtp_tls: TestTLS, transports: Callable[..., SMTPTransport]
):
    transport = transports()
    starttls = smtp_servers(tls=smtp_tls.server_context)
    implicit = smtp_servers(tls=smtp_tls.server_context, implicit_tls=True)
    plain = smtp_servers()
    refusing = smtp_servers(tls=smtp_tls.server_context, mail_reply="550 5.7.1 Not from you")
    assert transport.deliver(envelope(), route=MX, hosts=[mx(starttls)]).tls is True
    implicit_route = Route(type="smarthost", host="localhost", port=implicit.port, tls="implicit")
    assert (
        transport.deliver(
            envelope(),
            route=implicit_route,
            hosts=[Host(name="localhost", address="127.0.0.1", port=implicit.port)],
        ).tls
        is True
    )
    assert transport.deliver(envelope(), route=MX, hosts=[mx(plain)]).tls is False
    refused = transport.deliver(envelope(), route=MX, hosts=[mx(refusing)])
    assert (only_reply(refused)[0], refused.tls) == (FAILED, True)
