"""Replies are taken only in step: a reply that comes before what it answers was sent, or
one reply too many, ends the connection, and no reply of the transaction it broke
decides anything. Against scripted servers on loopback, on every path: messages that
follow on one connection, one message of several recipients, and the HELO fallback."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import Envelope
from bumail_queue.delivery.smtp import SMTPTransport
from bumail_queue.items import RecipientStatus
from tests.helpers import MESSAGE, FakeClock, Followers, chain, envelope, mx, only_reply, wait_until
from tests.servers.hostile_smtp import HostileSMTPServer, Peer
from tests.servers.out_of_step import STRATEGIES, OutOfStepMX

DELIVERED, DEFERRED, FAILED = RecipientStatus.DELIVERED, RecipientStatus.DEFERRED, RecipientStatus.FAILED
MX = Route(type="mx")
Hostile = Callable[[Callable[[Peer], None]], HostileSMTPServer]


def letter(n: int) -> Envelope:
    body = MESSAGE.replace(b"Subject: Hello", f"Subject: Letter {n}".encode())
    return envelope(f"r{n}@pipe.test", item_id=f"item-{n}", message=body)


def statuses(deliveries) -> dict[str, RecipientStatus]:
    return {r: o.status for d in deliveries for r, o in d.outcomes.items()}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_eight_messages_on_one_connection_each_take_only_the_reply_meant_for_them(
    strategy: str, hostile_smtp: Hostile, transport: SMTPTransport
):
    script = OutOfStepMX(strategy)
    server = hostile_smtp(script)
    deliveries = chain(transport, server, *(letter(n) for n in range(1, 9)))

    outcomes = {r: o for d in deliveries for r, o in d.outcomes.items()}
    for recipient, outcome in outcomes.items():
        if outcome.status is DEFERRED:
            continue  # a deferral is always allowed: it is tried again
        meant = script.meant[recipient]
        assert outcome.status.value == meant, (recipient, outcome)
        assert recipient in outcome.reply.text  # the reply taken names its own recipient
    refused = [r for r, o in outcomes.items() if o.status is FAILED]
    assert refused == (["r3@pipe.test"] if strategy == "550_then_250" else [])
    delivered_early = outcomes["r3@pipe.test"].reply.text.startswith("early-accept")
    assert not delivered_early
    if strategy == "honest":
        assert set(statuses(deliveries).values()) == {DELIVERED}
        assert len(server.peers) == 1
    else:
        # The reply in doubt defers one message, and the connection ends with it.
        deferred = [r for r, o in outcomes.items() if o.status is DEFERRED]
        assert len(deferred) == 1
        [(recipient, outcome)] = [(r, outcomes[r]) for r in deferred]
        assert (outcome.reply.code, outcome.reply.status) == (None, "4.5.0")
        assert "replied out of step" in outcome.reply.text
        assert not outcome.names_recipient
        assert recipient == ("r3@pipe.test" if strategy == "early" else "r4@pipe.test")
        assert len(server.peers) == 2  # the messages after it went on a new connection
        assert script.received.count((recipient,)) == 0  # its data never went
    # Every message the server took, it took once.
    assert len(script.received) == len(set(script.received))


def test_after_a_reply_out_of_step_the_host_gets_one_command_at_a_time_and_no_follower(
    hostile_smtp: Hostile, transport: SMTPTransport
):
    script = OutOfStepMX("extra_550", victim="r1@pipe.test")
    server = hostile_smtp(script)
    first, second = chain(transport, server, letter(1), letter(2))
    assert (first.outcomes["r1@pipe.test"].status, only_reply(second)[0]) == (DELIVERED, DEFERRED)

    follow = Followers(letter(4))
    third = transport.deliver(letter(3), route=MX, hosts=[mx(server)], follow=follow)

    assert only_reply(third)[0] is DELIVERED
    assert follow.calls == 0  # no follower's commands go with the dot
    assert len(server.peers) == 2
    # The first connection's MAIL went with its RCPT and DATA; the new one's alone.
    assert script.mail_grouped == [True, True, False]


def test_the_memory_of_a_host_out_of_step_lasts_an_hour(hostile_smtp: Hostile, transports):
    clock = FakeClock()
    transport = transports(clock=clock)
    server = hostile_smtp(OutOfStepMX("extra_250", victim="r1@pipe.test"))
    chain(transport, server, letter(1), letter(2))

    clock.now += 3599
    follow = Followers(letter(4))
    transport.deliver(letter(3), route=MX, hosts=[mx(server)], follow=follow)
    assert follow.calls == 0
    clock.now += 1
    follow = Followers(letter(6))
    transport.deliver(letter(5), route=MX, hosts=[mx(server)], follow=follow)
    assert follow.calls == 1  # pipelining again


def test_one_message_of_several_recipients_takes_no_rcpt_reply_out_of_its_place(
    hostile_smtp: Hostile, transport: SMTPTransport
):
    def script(peer: Peer) -> None:
        peer.send(b"220 pipe.test ESMTP\r\n")
        peer.read_line()
        peer.send(b"250-pipe.test\r\n250 PIPELINING\r\n")
        assert [peer.read_line().split(" ")[0] for _ in range(5)] == ["MAIL", "RCPT", "RCPT", "RCPT", "DATA"]
        # One reply too many, for b: every reply after it answers the command before.
        peer.send(
            b"250 2.1.0 ok\r\n250 2.1.5 <a@pipe.test> ok\r\n550 5.1.1 <b@pipe.test> unknown\r\n"
            b"250 2.1.5 <b@pipe.test> ok\r\n250 2.1.5 <c@pipe.test> ok\r\n354 go ahead\r\n"
        )
        peer.hold()

    server = hostile_smtp(script)
    delivery = transport.deliver(envelope("a@pipe.test", "b@pipe.test", "c@pipe.test"), route=MX, hosts=[mx(server)])

    status, code, enhanced, text = only_reply(delivery)  # b is not failed on a reply out of place
    assert (status, code, enhanced) == (DEFERRED, None, "4.5.0")
    assert "replied out of step (250 to DATA)" in text
    assert transport.pooled_count() == 0


def helo_only(extra: bytes) -> Callable[[Peer], None]:
    """A server without EHLO that answers RCPT a with ``extra`` in the same write."""

    def script(peer: Peer) -> None:
        peer.send(b"220 old.test SMTP\r\n")
        assert peer.read_line().upper().startswith("EHLO")
        peer.send(b"502 5.5.2 EHLO not understood\r\n")
        assert peer.read_line().upper().startswith("HELO")
        peer.send(b"250 old.test\r\n")
        assert peer.read_line().startswith("MAIL")
        peer.send(b"250 2.1.0 ok\r\n")
        assert peer.read_line().startswith("RCPT")
        peer.send(b"250 2.1.5 <a@pipe.test> ok\r\n" + extra)
        peer.serve_until("QUIT")

    return script


def test_after_helo_a_reply_with_no_command_outstanding_fails_nobody(hostile_smtp: Hostile, transport: SMTPTransport):
    server = hostile_smtp(helo_only(b"550 5.1.1 <b@pipe.test> unknown\r\n"))
    delivery = transport.deliver(envelope("a@pipe.test", "b@pipe.test"), route=MX, hosts=[mx(server)])

    status, _, enhanced, text = only_reply(delivery)
    assert (status, enhanced) == (DEFERRED, "4.5.0")
    assert "replied out of step (a reply came before RCPT was sent)" in text
    [peer] = server.peers
    assert wait_until(lambda: peer.hung_up or peer.finished)
    assert [c.split(" ")[0].upper() for c in peer.commands] == ["EHLO", "HELO", "MAIL", "RCPT"]  # b's RCPT never went


def test_an_early_reply_to_data_is_not_taken_and_the_message_is_not_sent(hostile_smtp: Hostile, transport):
    def script(peer: Peer) -> None:
        peer.send(b"220 old.test SMTP\r\n")
        peer.read_line()
        peer.send(b"250 old.test\r\n")  # EHLO, with no PIPELINING: one command at a time
        for _ in ("MAIL", "RCPT"):
            peer.read_line()
            peer.send(b"250 2.0.0 ok\r\n")
        assert peer.read_line() == "DATA"
        peer.send(b"354 go ahead\r\n250 2.0.0 early-accept <a@pipe.test>\r\n")
        peer.serve_until("QUIT")

    server = hostile_smtp(script)
    delivery = transport.deliver(envelope("a@pipe.test"), route=MX, hosts=[mx(server)])

    status, _, _, text = only_reply(delivery)
    assert status is DEFERRED
    assert "replied out of step (a reply came before the message was sent)" in text
    [peer] = server.peers
    assert wait_until(lambda: peer.hung_up or peer.finished)
    assert "." not in peer.commands


@pytest.mark.parametrize(
    ("said", "lockstep"), [(b"421 4.4.2 idle too long\r\n", False), (b"250 2.0.0 accepted again\r\n", True)]
)
def test_a_kept_connection_that_speaks_while_idle_is_closed_before_use(
    said: bytes, lockstep: bool, hostile_smtp: Hostile, transport: SMTPTransport
):
    def script(peer: Peer) -> None:
        peer.send(b"220 pipe.test ESMTP\r\n")
        peer.read_line()
        peer.send(b"250-pipe.test\r\n250 PIPELINING\r\n")
        if peer.number == 1:
            assert peer.serve_until("DATA_END") == "DATA_END"
            peer.send(b"250 2.0.0 accepted\r\n" + said)
        peer.serve_until("QUIT")

    server = hostile_smtp(script)
    assert only_reply(transport.deliver(envelope(item_id="one"), route=MX, hosts=[mx(server)]))[0] is DELIVERED
    assert transport.pooled_count() == 1
    follow = Followers(letter(9))
    second = transport.deliver(envelope(item_id="two"), route=MX, hosts=[mx(server)], follow=follow)

    assert only_reply(second)[0] is DELIVERED  # on a new connection: nothing was sent on the old
    assert len(server.peers) == 2
    assert server.peers[0].commands.count(".") == 1
    assert follow.calls == (0 if lockstep else 1)
