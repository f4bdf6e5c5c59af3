"""RFC 2920 across messages: the next transaction's MAIL, RCPT and DATA go with the final
dot of the one before, on real loopback servers, and every reply still decides its own
command. The wire is checked from the server's side: ``Command.read`` and
``ReceivedMessage.read`` number the reads of a connection, so what came in one write of
the client shares one read."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import Envelope, Host
from bumail_queue.delivery.smtp import SMTPDelivery, SMTPTransport
from bumail_queue.items import RecipientStatus
from tests.helpers import MESSAGE, FakeClock, Followers, chain, envelope, mx, only_reply, timeouts, wait_until
from tests.servers.hostile_smtp import HostileSMTPServer, Peer
from tests.servers.smtp import SMTPTestServer

DELIVERED, DEFERRED, FAILED = RecipientStatus.DELIVERED, RecipientStatus.DEFERRED, RecipientStatus.FAILED
MX = Route(type="mx")
Servers = Callable[..., SMTPTestServer]
Hostile = Callable[[Callable[[Peer], None]], HostileSMTPServer]


def letter(n: int, *recipients: str) -> Envelope:
    body = MESSAGE.replace(b"Subject: Hello", f"Subject: Letter {n}".encode())
    return envelope(*(recipients or (f"r{n}@example.org",)), item_id=f"item-{n}", message=body)


def test_the_next_transaction_goes_with_the_final_dot(smtp_server: SMTPTestServer, transport: SMTPTransport):
    deliveries = chain(transport, smtp_server, letter(1), letter(2), letter(3))

    assert [only_reply(d)[0] for d in deliveries] == [DELIVERED] * 3
    assert [m.rcpt_tos for m in smtp_server.messages] == [["r1@example.org"], ["r2@example.org"], ["r3@example.org"]]
    assert smtp_server.connections == 1
    assert smtp_server.verbs() == ["EHLO"] + ["MAIL", "RCPT", "DATA"] * 3  # no RSET between them
    # The server read each message's final dot with the next one's MAIL, RCPT and DATA:
    # one write, hence one round trip, per message after the first.
    mails = [c.read for c in smtp_server.commands if c.verb == "MAIL"]
    datas = [c.read for c in smtp_server.commands if c.verb == "DATA"]
    dots = [m.read for m in smtp_server.messages]
    assert mails[1:] == datas[1:] == dots[:-1]
    assert dots == [mails[0] + 1, mails[0] + 2, mails[0] + 3]
    assert transport.pooled_count() == 1


def test_without_pipelining_follow_is_not_asked_and_each_command_waits_for_its_reply(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(pipelining=False)
    follow = Followers(letter(2))
    first = transport.deliver(letter(1), route=MX, hosts=[mx(server)], follow=follow)
    second = transport.deliver(letter(2), route=MX, hosts=[mx(server)])

    assert follow.calls == 0
    assert (only_reply(first)[0], only_reply(second)[0]) == (DELIVERED, DELIVERED)
    assert server.verbs() == ["EHLO"] + ["MAIL", "RCPT", "DATA"] * 2
    assert len({c.read for c in server.commands}) == len(server.commands)  # one read per command


def test_without_connection_reuse_follow_is_not_asked(
    smtp_server: SMTPTestServer, transports: Callable[..., SMTPTransport]
):
    transport = transports(reuse_seconds=0)
    follow = Followers(letter(2))
    delivery = transport.deliver(letter(1), route=MX, hosts=[mx(smtp_server)], follow=follow)
    assert only_reply(delivery)[0] is DELIVERED
    assert follow.calls == 0
    assert smtp_server.verbs()[-1] == "QUIT"


def test_a_refused_rcpt_in_the_followers_group_decides_that_recipient_alone(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(rcpt_replies={"bad@example.org": "550 5.1.1 No such user"})
    first, second = chain(transport, server, letter(1), letter(2, "a@example.org", "bad@example.org", "b@example.org"))

    assert only_reply(first)[0] is DELIVERED
    outcomes = {r: (o.status, o.reply.code) for r, o in second.outcomes.items()}
    assert outcomes == {
        "a@example.org": (DELIVERED, 250),
        "bad@example.org": (FAILED, 550),
        "b@example.org": (DELIVERED, 250),
    }
    assert server.messages[1].rcpt_tos == ["a@example.org", "b@example.org"]
    rcpts = [c for c in server.commands if c.verb == "RCPT"][1:]
    assert {c.read for c in rcpts} == {server.messages[0].read}


def test_a_refused_mail_in_the_followers_group_decides_every_recipient_and_the_next_begins_with_rset(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(mail_reply=[None, "553 5.7.1 Sender refused", None])
    first, second, third = chain(transport, server, letter(1), letter(2, "a@example.org", "b@example.org"), letter(3))

    assert only_reply(first)[0] is DELIVERED
    # The RCPT and DATA replies after the refused MAIL were read (503s), and the MAIL
    # reply decided: the next reply read was the next transaction's own.
    assert only_reply(second) == (FAILED, 553, "5.7.1", "5.7.1 Sender refused")
    assert only_reply(third)[0] is DELIVERED
    assert [m.rcpt_tos for m in server.messages] == [["r1@example.org"], ["r3@example.org"]]
    assert server.connections == 1
    # No final dot ended the refused transaction: the next one is not pipelined with
    # one, and begins with RSET, in the same write as its MAIL, RCPT and DATA.
    assert server.verbs()[-5:] == ["DATA", "RSET", "MAIL", "RCPT", "DATA"]
    assert len({c.read for c in server.commands[-4:]}) == 1


@pytest.mark.parametrize(("reply", "status"), [("451 4.3.0 Not now", DEFERRED), ("554 5.5.0 No DATA for you", FAILED)])
def test_a_refused_data_in_the_followers_group_decides_its_accepted_recipients(
    smtp_servers: Servers, transport: SMTPTransport, reply, status
):
    server = smtp_servers(data_reply=[None, reply, None])
    first, second, third = chain(transport, server, letter(1), letter(2), letter(3))

    assert only_reply(first)[0] is DELIVERED
    assert only_reply(second) == (status, int(reply[:3]), reply[4:9], reply[4:])
    assert only_reply(third)[0] is DELIVERED
    assert [m.rcpt_tos for m in server.messages] == [["r1@example.org"], ["r3@example.org"]]
    assert server.verbs().count("RSET") == 1  # the refused DATA left a transaction open


def test_a_421_after_the_dot_defers_that_message_and_the_follower_takes_a_new_connection(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(message_reply=["421 4.3.2 Shutting down", "250 2.0.0 Queued"])
    first, second = chain(transport, server, letter(1), letter(2))

    assert only_reply(first) == (DEFERRED, 421, "4.3.2", "4.3.2 Shutting down")
    # The follower's commands went with the dot, but no reply to them was read: nothing
    # was decided on that connection, and the follower is sent on a new one.
    assert only_reply(second)[0] is DELIVERED
    assert server.connections == 2
    assert [(m.rcpt_tos, m.connection) for m in server.messages] == [(["r2@example.org"], 2)]


def test_a_follower_delivered_to_other_hosts_drops_the_transaction_begun_for_it(
    smtp_servers: Servers, transport: SMTPTransport
):
    first_server, other = smtp_servers(), smtp_servers()
    follow = Followers(letter(2))
    transport.deliver(letter(1), route=MX, hosts=[mx(first_server)], follow=follow)
    delivery = transport.deliver(letter(2), route=MX, hosts=[mx(other, "mx2.test")])

    assert only_reply(delivery)[0] is DELIVERED
    assert [m.rcpt_tos for m in other.messages] == [["r2@example.org"]]
    # The first server had the follower's MAIL, RCPT and DATA, then the connection closed
    # before any message: it delivered nothing for it.
    assert [m.rcpt_tos for m in first_server.messages] == [["r1@example.org"]]
    assert transport.pooled_count() == 1  # the other server's session; the first one is closed


def test_a_follower_never_delivered_is_dropped_when_the_transport_closes(
    smtp_server: SMTPTestServer, transport: SMTPTransport
):
    transport.deliver(letter(1), route=MX, hosts=[mx(smtp_server)], follow=Followers(letter(2)))
    assert transport.pooled_count() == 0  # the session is the follower's, not the pool's
    assert wait_until(lambda: smtp_server.verbs()[-3:] == ["MAIL", "RCPT", "DATA"])  # the server waits for a message
    transport.close()
    assert wait_until(lambda: smtp_server.open_connections() == 0)
    assert [m.rcpt_tos for m in smtp_server.messages] == [["r1@example.org"]]


def test_close_idle_leaves_a_session_whose_dot_is_still_waiting_for_its_reply(
    smtp_server: SMTPTestServer, transports: Callable[..., SMTPTransport]
):
    clock = FakeClock()
    transport = transports(reuse_seconds=10, clock=clock)
    smtp_server.hold_dots = True  # the first message's reply takes longer than reuse_seconds
    first: list[SMTPDelivery] = []
    follow = Followers(letter(2))
    sending = threading.Thread(
        target=lambda: first.append(transport.deliver(letter(1), route=MX, hosts=[mx(smtp_server)], follow=follow))
    )
    sending.start()
    try:
        assert wait_until(lambda: smtp_server.held == 1)
        clock.now += 11
        transport.close_idle()  # the worker's loop, between claims
    finally:
        smtp_server.hold_dots = False
        sending.join(30)

    assert only_reply(first[0])[0] is DELIVERED
    assert only_reply(transport.deliver(letter(2), route=MX, hosts=[mx(smtp_server)]))[0] is DELIVERED
    assert smtp_server.connections == 1


def test_a_follower_that_does_not_come_within_reuse_seconds_is_dropped(
    smtp_server: SMTPTestServer, transports: Callable[..., SMTPTransport]
):
    clock = FakeClock()
    transport = transports(reuse_seconds=10, clock=clock)
    transport.deliver(letter(1), route=MX, hosts=[mx(smtp_server)], follow=Followers(letter(2)))
    assert wait_until(lambda: smtp_server.verbs()[-3:] == ["MAIL", "RCPT", "DATA"])
    clock.now += 5
    transport.close_idle()
    assert smtp_server.open_connections() == 1
    clock.now += 6
    transport.close_idle()
    assert wait_until(lambda: smtp_server.open_connections() == 0)
    # Its delivery, late, goes on a new connection; the dropped one delivered nothing.
    assert only_reply(transport.deliver(letter(2), route=MX, hosts=[mx(smtp_server)]))[0] is DELIVERED
    assert [(m.rcpt_tos, m.connection) for m in smtp_server.messages] == [
        (["r1@example.org"], 1),
        (["r2@example.org"], 2),
    ]


def test_a_follower_that_cannot_be_sent_at_all_is_not_begun(smtp_server: SMTPTestServer, transport: SMTPTransport):
    unsendable = envelope("bad\r\naddress@example.org", item_id="item-2")
    first, second = chain(transport, smtp_server, letter(1), unsendable)

    assert only_reply(first)[0] is DELIVERED
    assert only_reply(second)[:3] == (FAILED, None, "5.1.3")
    assert smtp_server.verbs() == ["EHLO", "MAIL", "RCPT", "DATA"]
    assert transport.pooled_count() == 1


def test_a_follower_is_signed_and_encoded_as_any_message(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(eightbitmime=False)
    eight_bit = MESSAGE.replace(b"Hello.", "Grüße.".encode())
    plain = envelope("r2@example.org", item_id="item-2", message=eight_bit)
    first, second = chain(transport, server, letter(1), plain)

    assert (only_reply(first)[0], only_reply(second)[0]) == (DELIVERED, DELIVERED)
    received = server.messages[1].data
    assert received.isascii() and b"Content-Transfer-Encoding: quoted-printable" in received
    assert server.commands[-1].read == server.messages[0].read  # it followed the first dot all the same


def test_a_follower_through_another_host_object_of_the_same_server_goes_on(
    smtp_server: SMTPTestServer, transport: SMTPTransport
):
    follow = Followers(letter(2))
    transport.deliver(letter(1), route=MX, hosts=[mx(smtp_server)], follow=follow)
    same = Host(name="MX.test", address="127.0.0.1", port=smtp_server.port)  # the name's case does not matter
    delivery = transport.deliver(letter(2), route=MX, hosts=[same])
    assert only_reply(delivery)[0] is DELIVERED
    assert smtp_server.connections == 1


# -- connection reuse: its lifetime, and QUIT ----------------------------------------------


def test_a_connection_is_not_reused_once_it_has_been_open_300_seconds(
    smtp_server: SMTPTestServer, transports: Callable[..., SMTPTransport]
):
    clock = FakeClock()
    transport = transports(reuse_seconds=1000, clock=clock)
    transport.deliver(letter(1), route=MX, hosts=[mx(smtp_server)])
    clock.now += 299
    transport.deliver(letter(2), route=MX, hosts=[mx(smtp_server)])
    assert smtp_server.connections == 1
    clock.now += 2  # Postfix's smtp_connection_reuse_time_limit: a new connection, whatever the traffic
    transport.deliver(letter(3), route=MX, hosts=[mx(smtp_server)])
    assert smtp_server.connections == 2
    assert smtp_server.verbs(1)[-1] == "QUIT"
    assert [m.connection for m in smtp_server.messages] == [1, 1, 2]


def test_closing_sends_every_quit_before_reading_a_reply(hostile_smtp: Hostile, transport: SMTPTransport):
    second_heard_quit = threading.Event()

    def first(peer: Peer) -> None:
        peer.send(GREETING)
        peer.serve_until("QUIT")
        # Answer only once the other connection has its QUIT: a client that waited for
        # this reply before saying QUIT there would time out here.
        second_heard_quit.wait(30)
        peer.send(b"221 2.0.0 Bye\r\n")

    def second(peer: Peer) -> None:
        peer.send(GREETING)
        peer.serve_until("QUIT")
        second_heard_quit.set()
        peer.send(b"221 2.0.0 Bye\r\n")

    servers = hostile_smtp(first), hostile_smtp(second)
    for n, server in enumerate(servers, 1):
        assert only_reply(transport.deliver(letter(n), route=MX, hosts=[mx(server)]))[0] is DELIVERED
    assert transport.pooled_count() == 2
    transport.close()
    peers = [server.peers[0] for server in servers]
    assert wait_until(lambda: all(p.finished or p.hung_up for p in peers))
    assert [(p.finished, p.hung_up) for p in peers] == [(True, False), (True, False)]


# -- hostile servers stay bounded ------------------------------------------------------------

GREETING = b"220 hostile.test ESMTP\r\n"


def serve_one_pipelined(peer: Peer) -> None:
    """Greet, offer PIPELINING, take one transaction of one recipient up to its final dot."""
    peer.send(GREETING)
    peer.read_line()
    peer.send(b"250-hostile.test\r\n250-PIPELINING\r\n250 8BITMIME\r\n")
    assert [peer.read_line().split(" ")[0] for _ in range(3)] == ["MAIL", "RCPT", "DATA"]
    peer.send(b"250 2.1.0 OK\r\n250 2.1.5 OK\r\n354 Go ahead\r\n")
    while peer.read_line() != ".":
        pass


def test_extra_replies_after_the_dot_are_read_in_order_and_the_follower_is_not_sent(
    hostile_smtp: Hostile, transports: Callable[..., SMTPTransport]
):
    def script(peer: Peer) -> None:
        serve_one_pipelined(peer)
        peer.send(b"250 2.0.0 Queued\r\n250 2.0.0 Extra\r\n250 2.0.0 Extra\r\n")
        peer.serve_until("QUIT")  # the follower's MAIL, RCPT and DATA, answered as they come

    server = hostile_smtp(script)
    transport = transports(timeouts=timeouts(mail=0.5, rcpt=0.5, data=0.5, data_end=0.5))
    first, second = chain(transport, server, letter(1), letter(2))

    assert only_reply(first)[:2] == (DELIVERED, 250)
    # Each reply went to the next command: the follower's DATA got the reply to its MAIL,
    # a 250 where only 354 sends the message. Nothing was sent, and the connection dropped.
    status, code, enhanced, text = only_reply(second)
    assert (status, code, enhanced) == (DEFERRED, None, "4.5.0")
    assert "replied out of step (250 to DATA)" in text
    [peer] = server.peers
    assert wait_until(lambda: peer.hung_up or peer.finished)
    assert peer.commands.count(".") == 1
    assert transport.pooled_count() == 0


def test_a_server_silent_to_the_followers_commands_is_left_within_the_mail_timeout(
    hostile_smtp: Hostile, transports: Callable[..., SMTPTransport]
):
    def script(peer: Peer) -> None:
        serve_one_pipelined(peer)
        peer.send(b"250 2.0.0 Queued\r\n")
        if peer.number == 1:
            peer.hold()  # no reply to the follower's MAIL, RCPT or DATA
        peer.serve_until("QUIT")

    server = hostile_smtp(script)
    transport = transports(timeouts=timeouts(mail=0.5))
    first, second = chain(transport, server, letter(1), letter(2))

    assert only_reply(first)[0] is DELIVERED
    # No reply came to anything of the follower's: nothing was decided there, and it was
    # sent on a new connection once TIMEOUTS["MAIL"] ran out.
    assert only_reply(second)[0] is DELIVERED
    assert len(server.peers) == 2
    assert wait_until(lambda: server.peers[0].hung_up)


def test_a_server_silent_after_the_dot_defers_that_message_and_the_follower_takes_a_new_connection(
    hostile_smtp: Hostile, transports: Callable[..., SMTPTransport]
):
    def script(peer: Peer) -> None:
        serve_one_pipelined(peer)
        if peer.number == 1:
            peer.hold()  # no reply to the dot, nor to the follower's commands
        peer.send(b"250 2.0.0 Queued\r\n")
        peer.serve_until("QUIT")

    server = hostile_smtp(script)
    transport = transports(timeouts=timeouts(data_end=0.5))
    first, second = chain(transport, server, letter(1), letter(2))

    status, code, enhanced, text = only_reply(first)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert 'TIMEOUTS["DATA_END"]' in text
    assert only_reply(second)[0] is DELIVERED
    assert len(server.peers) == 2
