"""The SMTP client against real SMTP servers on loopback (aiosmtpd), scripted per test."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import Host
from bumail_queue.delivery.smtp import (
    MAX_REPLY_TEXT,
    RouteOptionError,
    SMTPDelivery,
    SMTPTransport,
    clean_reply_text,
    reply_from,
)
from bumail_queue.errors import ErrorCode
from bumail_queue.items import RecipientStatus, Reply
from tests.helpers import MESSAGE, PASSWORD, USER, FakeClock, envelope, mx, only_reply, timeouts
from tests.servers.smtp import (
    SMTPTestServer,
    TestTLS,
    closed_port,
    make_tls,
    unanswered_port,
)

DELIVERED, DEFERRED, FAILED = RecipientStatus.DELIVERED, RecipientStatus.DEFERRED, RecipientStatus.FAILED
MX = Route(type="mx")
Servers = Callable[..., SMTPTestServer]


def smarthost(server: SMTPTestServer, **options: Any) -> Route:
    options.setdefault("tls", "starttls")
    return Route(type="smarthost", host="127.0.0.1", port=server.port, tls_required=options["tls"] != "none", **options)


def statuses(delivery: SMTPDelivery) -> dict[str, RecipientStatus]:
    return {address: outcome.status for address, outcome in delivery.outcomes.items()}


# -- a transaction --------------------------------------------------------------------


def test_delivers_to_every_recipient(smtp_server: SMTPTestServer, transport: SMTPTransport):
    delivery = transport.deliver(envelope("ann@example.org", "bob@example.org"), route=MX, hosts=[mx(smtp_server)])
    assert statuses(delivery) == {"ann@example.org": DELIVERED, "bob@example.org": DELIVERED}
    assert only_reply(delivery) == (DELIVERED, 250, "2.0.0", "2.0.0 Queued")
    assert delivery.remote_host == "mx.test"
    assert delivery.option_error is None
    [received] = smtp_server.messages
    assert received.mail_from == "sender@example.com"
    assert received.rcpt_tos == ["ann@example.org", "bob@example.org"]
    assert received.data == MESSAGE
    assert smtp_server.commands[0].verb == "EHLO"
    assert smtp_server.commands[0].arg == "client.example.com"


def test_lines_end_in_crlf_and_dots_are_stuffed(smtp_server: SMTPTestServer, transport: SMTPTransport):
    message = b"Subject: dots\n\n.one\r..two\r\nthree\n.\nlast"
    delivery = transport.deliver(envelope(message=message), route=MX, hosts=[mx(smtp_server)])
    assert only_reply(delivery)[0] is DELIVERED
    # The server undoes the dot-stuffing: a lone "." line would have ended the message.
    assert smtp_server.messages[0].data == b"Subject: dots\r\n\r\n.one\r\n..two\r\nthree\r\n.\r\nlast\r\n"


def test_the_null_sender_and_a_quoted_local_part_go_as_they_are(smtp_server: SMTPTestServer, transport: SMTPTransport):
    delivery = transport.deliver(envelope('"john doe"@example.org', sender=""), route=MX, hosts=[mx(smtp_server)])
    assert only_reply(delivery)[0] is DELIVERED
    mail, rcpt = [c.arg for c in smtp_server.commands if c.verb in ("MAIL", "RCPT")]
    assert mail.startswith("FROM:<> ")
    assert rcpt == 'TO:<"john doe"@example.org>'
    assert smtp_server.messages[0].mail_from == ""


def test_a_duplicate_recipient_is_sent_once(smtp_server: SMTPTestServer, transport: SMTPTransport):
    delivery = transport.deliver(envelope("ann@example.org", "ann@example.org"), route=MX, hosts=[mx(smtp_server)])
    assert list(delivery.outcomes) == ["ann@example.org"]
    assert smtp_server.verbs().count("RCPT") == 1


def test_each_rcpt_reply_is_kept(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(
        rcpt_replies={"bad@example.org": "550 5.1.1 No such user", "later@example.org": "451 4.3.0 Try later"}
    )
    delivery = transport.deliver(
        envelope("ann@example.org", "bad@example.org", "later@example.org"), route=MX, hosts=[mx(server)]
    )
    bad, later = delivery.outcomes["bad@example.org"], delivery.outcomes["later@example.org"]
    assert (bad.status, bad.reply.code, bad.reply.status, bad.reply.text) == (
        FAILED,
        550,
        "5.1.1",
        "5.1.1 No such user",
    )
    assert (later.status, later.reply.code, later.reply.status) == (DEFERRED, 451, "4.3.0")
    assert delivery.outcomes["ann@example.org"].status is DELIVERED
    assert server.messages[0].rcpt_tos == ["ann@example.org"]


def test_no_data_when_no_recipient_is_accepted(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(rcpt_replies={"bad@example.org": "550 5.1.1 No such user"}, pipelining=False)
    delivery = transport.deliver(envelope("bad@example.org"), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[:2] == (FAILED, 550)
    assert server.verbs() == ["EHLO", "MAIL", "RCPT", "RSET"]
    assert server.messages == []
    assert transport.pooled_count() == 1


def test_452_too_many_recipients_continues_in_new_transactions(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(max_recipients=2, pipelining=False)
    recipients = [f"r{i}@example.org" for i in range(5)]
    delivery = transport.deliver(envelope(*recipients), route=MX, hosts=[mx(server)])
    assert statuses(delivery) == dict.fromkeys(recipients, DELIVERED)
    assert [m.rcpt_tos for m in server.messages] == [recipients[:2], recipients[2:4], recipients[4:]]
    assert server.connections == 1
    verbs = server.verbs()
    assert verbs.count("MAIL") == 3
    assert verbs.count("RCPT") == 7  # 3 recipients heard 452 once and were asked again
    # The final dot ended the transaction (RFC 5321 §4.1.1.4): the next one needs no RSET.
    assert verbs[verbs.index("DATA") + 1] == "MAIL"
    assert "RSET" not in verbs


def test_452_to_the_first_rcpt_of_a_transaction_defers_the_rest(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(rcpt_replies={"c@example.org": "452 4.5.3 Too many recipients"}, pipelining=False)
    delivery = transport.deliver(
        envelope("a@example.org", "b@example.org", "c@example.org", "d@example.org"), route=MX, hosts=[mx(server)]
    )
    assert statuses(delivery) == {
        "a@example.org": DELIVERED, "b@example.org": DELIVERED, "c@example.org": DEFERRED, "d@example.org": DEFERRED,
    }  # fmt: skip
    assert delivery.outcomes["d@example.org"].reply.code == 452
    assert [m.rcpt_tos for m in server.messages] == [["a@example.org", "b@example.org"]]
    assert server.verbs().count("MAIL") == 2


@pytest.mark.parametrize(
    ("reply", "status"), [("451 4.3.2 System not accepting messages", DEFERRED), ("553 5.7.1 Sender refused", FAILED)]
)
def test_a_mail_reply_decides_every_recipient(smtp_servers: Servers, transport: SMTPTransport, reply, status):
    server = smtp_servers(mail_reply=reply, pipelining=False)
    delivery = transport.deliver(envelope("a@example.org", "b@example.org"), route=MX, hosts=[mx(server)])
    assert only_reply(delivery) == (status, int(reply[:3]), reply[4:9], reply[4:])
    assert "RCPT" not in server.verbs()


# -- pipelining (RFC 2920): MAIL, every RCPT and DATA in one write -----------------------


def test_a_pipelining_server_gets_mail_rcpt_and_data_in_one_write(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(rcpt_replies={"bad@example.org": "550 5.1.1 No such user"})
    delivery = transport.deliver(
        envelope("a@example.org", "bad@example.org", "b@example.org"), route=MX, hosts=[mx(server)]
    )
    assert statuses(delivery) == {"a@example.org": DELIVERED, "bad@example.org": FAILED, "b@example.org": DELIVERED}
    assert delivery.outcomes["bad@example.org"].reply.code == 550
    assert [m.rcpt_tos for m in server.messages] == [["a@example.org", "b@example.org"]]
    assert server.verbs() == ["EHLO", "MAIL", "RCPT", "RCPT", "RCPT", "DATA"]


def test_pipelined_data_is_refused_when_no_recipient_is_accepted(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(rcpt_replies={"bad@example.org": "550 5.1.1 No such user"})
    delivery = transport.deliver(envelope("bad@example.org"), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[:2] == (FAILED, 550)
    assert server.messages == []
    again = transport.deliver(envelope("a@example.org"), route=MX, hosts=[mx(server)])
    assert only_reply(again)[0] is DELIVERED  # the refused DATA left the connection usable
    assert server.connections == 1
    assert server.verbs() == ["EHLO", "MAIL", "RCPT", "DATA", "RSET", "MAIL", "RCPT", "DATA"]


def test_pipelined_452_leaves_each_refused_recipient_for_the_next_transaction(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(max_recipients=2)
    recipients = [f"r{i}@example.org" for i in range(5)]
    delivery = transport.deliver(envelope(*recipients), route=MX, hosts=[mx(server)])
    assert statuses(delivery) == dict.fromkeys(recipients, DELIVERED)
    assert [m.rcpt_tos for m in server.messages] == [recipients[:2], recipients[2:4], recipients[4:]]
    assert server.connections == 1
    assert server.verbs().count("RCPT") == 5 + 3 + 1  # each 452 asked again in the next transaction


def test_pipelined_452_to_every_rcpt_of_a_transaction_defers_them(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(rcpt_replies={"c@example.org": "452 4.5.3 Too many recipients"})
    delivery = transport.deliver(
        envelope("a@example.org", "b@example.org", "c@example.org", "d@example.org"), route=MX, hosts=[mx(server)]
    )
    # d was accepted beside the 452 to c; c, alone in the next transaction, heard 452 again.
    assert statuses(delivery) == {
        "a@example.org": DELIVERED, "b@example.org": DELIVERED, "c@example.org": DEFERRED, "d@example.org": DELIVERED,
    }  # fmt: skip
    assert delivery.outcomes["c@example.org"].reply.code == 452
    assert [m.rcpt_tos for m in server.messages] == [["a@example.org", "b@example.org", "d@example.org"]]
    assert server.verbs().count("MAIL") == 2


@pytest.mark.parametrize(
    ("reply", "status"), [("451 4.3.2 System not accepting messages", DEFERRED), ("553 5.7.1 Sender refused", FAILED)]
)
def test_a_pipelined_mail_reply_decides_every_recipient(smtp_servers: Servers, transport: SMTPTransport, reply, status):
    server = smtp_servers(mail_reply=reply)
    delivery = transport.deliver(envelope("a@example.org", "b@example.org"), route=MX, hosts=[mx(server)])
    assert only_reply(delivery) == (status, int(reply[:3]), reply[4:9], reply[4:])
    assert server.messages == []


@pytest.mark.parametrize(("reply", "status"), [("451 4.3.0 Later", DEFERRED), ("554 5.5.0 No DATA for you", FAILED)])
def test_the_reply_to_data_decides_the_accepted_recipients(
    smtp_servers: Servers, transport: SMTPTransport, reply, status
):
    server = smtp_servers(data_reply=reply, rcpt_replies={"bad@example.org": "550 5.1.1 No such user"})
    delivery = transport.deliver(envelope("a@example.org", "bad@example.org"), route=MX, hosts=[mx(server)])
    assert delivery.outcomes["a@example.org"].status is status
    assert delivery.outcomes["a@example.org"].reply.text == reply[4:]
    assert delivery.outcomes["bad@example.org"].reply.code == 550
    assert server.messages == []


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("250 2.0.0 Ok: queued as 12345", DELIVERED),
        ("452 4.3.1 Insufficient storage", DEFERRED),
        ("554 5.6.0 Spam", FAILED),
    ],
)
def test_the_reply_after_the_dot_decides_the_accepted_recipients(
    smtp_servers: Servers, transport: SMTPTransport, reply, status
):
    server = smtp_servers(message_reply=reply, rcpt_replies={"later@example.org": "450 4.2.1 Busy"})
    delivery = transport.deliver(
        envelope("a@example.org", "b@example.org", "later@example.org"), route=MX, hosts=[mx(server)]
    )
    for address in ("a@example.org", "b@example.org"):
        outcome = delivery.outcomes[address]
        assert (outcome.status, outcome.reply.code, outcome.reply.text) == (status, int(reply[:3]), reply[4:])
    assert delivery.outcomes["later@example.org"].reply.code == 450


@pytest.mark.parametrize("pipelining", [False, True])
def test_a_421_defers_what_is_undecided_and_drops_the_connection(
    smtp_servers: Servers, transport: SMTPTransport, pipelining
):
    server = smtp_servers(rcpt_replies={"b@example.org": "421 4.3.2 Shutting down"}, pipelining=pipelining)
    delivery = transport.deliver(
        envelope("a@example.org", "b@example.org", "c@example.org"), route=MX, hosts=[mx(server)]
    )
    assert only_reply(delivery) == (DEFERRED, 421, "4.3.2", "4.3.2 Shutting down")
    if not pipelining:
        assert "DATA" not in server.verbs()
    assert server.messages == []  # pipelined, DATA went out with the RCPTs, but no message followed
    assert transport.pooled_count() == 0


def test_a_reply_without_a_valid_code_defers_as_a_protocol_error(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(rcpt_replies={"a@example.org": "hello there"})
    delivery = transport.deliver(envelope("a@example.org", "b@example.org"), route=MX, hosts=[mx(server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.5.0")
    assert "Unexpected reply" in text
    assert transport.pooled_count() == 0


def test_a_multiline_reply_becomes_one_line(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(rcpt_replies={"a@example.org": "550-5.1.1 The mailbox\r\n550 5.1.1 does not exist"})
    delivery = transport.deliver(envelope("a@example.org"), route=MX, hosts=[mx(server)])
    assert only_reply(delivery) == (FAILED, 550, "5.1.1", "5.1.1 The mailbox 5.1.1 does not exist")


# -- hosts ---------------------------------------------------------------------------


def test_hosts_are_tried_in_order(smtp_servers: Servers, transport: SMTPTransport):
    busy = smtp_servers(greeting="421 4.3.2 Too busy")
    refusing = smtp_servers(greeting="554 5.3.2 No service")
    good = smtp_servers()
    hosts = [
        Host(name="mx0.test", address="127.0.0.1", port=closed_port()),
        mx(busy, "mx1.test"), mx(refusing, "mx2.test"), mx(good, "mx3.test"),
    ]  # fmt: skip
    delivery = transport.deliver(envelope(), route=MX, hosts=hosts)
    assert only_reply(delivery)[0] is DELIVERED
    assert delivery.remote_host == "mx3.test"
    assert busy.connections == refusing.connections == good.connections == 1
    assert refusing.verbs() == ["QUIT"]


def test_an_ehlo_4xx_moves_to_the_next_host(smtp_servers: Servers, transport: SMTPTransport):
    first = smtp_servers(ehlo_reply="451 4.3.0 Not now")
    second = smtp_servers()
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(first, "mx1.test"), mx(second, "mx2.test")])
    assert only_reply(delivery)[0] is DELIVERED
    assert delivery.remote_host == "mx2.test"


def test_every_host_refused_defers_441(transport: SMTPTransport):
    hosts = [Host(name=f"mx{i}.test", address="127.0.0.1", port=closed_port()) for i in range(2)]
    delivery = transport.deliver(envelope("a@example.org", "b@example.org"), route=MX, hosts=hosts)
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.1")
    assert "refused" in text
    assert delivery.remote_host is None


@pytest.mark.parametrize(
    ("greeting", "status"), [("554 5.7.1 You are not welcome", FAILED), ("421 4.7.0 Try again later", DEFERRED)]
)
def test_the_last_hosts_greeting_decides_when_every_host_failed(
    smtp_servers: Servers, transport: SMTPTransport, greeting, status
):
    hosts = [
        Host(name="mx1.test", address="127.0.0.1", port=closed_port()),
        mx(smtp_servers(greeting=greeting), "mx2.test"),
    ]
    delivery = transport.deliver(envelope(), route=MX, hosts=hosts)
    assert only_reply(delivery) == (status, int(greeting[:3]), greeting[4:9], greeting[4:])
    assert delivery.remote_host == "mx2.test"


def test_no_host_defers_444(transport: SMTPTransport):
    delivery = transport.deliver(envelope(), route=MX, hosts=[])
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.4.4")


def test_helo_when_ehlo_is_refused(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(ehlo_reply="502 5.5.2 Command not recognized")
    delivery = transport.deliver(
        envelope(message=b"Subject: x\r\n\r\n\xc3\xa9t\xc3\xa9\r\n"), route=MX, hosts=[mx(server)]
    )
    assert only_reply(delivery)[0] is DELIVERED
    assert server.verbs() == ["EHLO", "HELO", "MAIL", "RCPT", "DATA"]
    assert server.messages[0].mail_options == []  # no SIZE, no BODY without ESMTP


# -- TLS -----------------------------------------------------------------------------


def test_mx_uses_starttls_when_offered_without_verifying(
    smtp_servers: Servers, transports: Callable[..., SMTPTransport]
):
    stranger = make_tls("mx.test")  # a CA the client does not trust
    server = smtp_servers(tls=stranger.server_context)
    transport = transports(ssl_context=None)
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[0] is DELIVERED
    assert server.verbs() == ["EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT", "DATA"]


def test_mx_stays_plain_when_starttls_is_not_offered(smtp_server: SMTPTestServer, transport: SMTPTransport):
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    assert only_reply(delivery)[0] is DELIVERED
    assert "STARTTLS" not in smtp_server.verbs()


def test_mx_falls_back_to_plain_text_when_the_handshake_fails(
    smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport
):
    server = smtp_servers(tls=smtp_tls.server_context, drop_at="STARTTLS")
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[0] is DELIVERED
    assert server.connections == 2
    assert server.verbs(2) == ["EHLO", "MAIL", "RCPT", "DATA"]


def test_mx_opportunistic_goes_on_in_plain_text_when_starttls_is_refused(
    smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport
):
    server = smtp_servers(tls=smtp_tls.server_context, starttls_reply="454 4.7.0 TLS not available")
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[0] is DELIVERED
    assert server.verbs() == ["EHLO", "STARTTLS", "MAIL", "RCPT", "DATA"]


def test_mx_with_tls_required_defers_when_starttls_is_not_offered(
    smtp_server: SMTPTestServer, transport: SMTPTransport
):
    delivery = transport.deliver(envelope(), route=Route(type="mx", tls_required=True), hosts=[mx(smtp_server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.7.0")
    assert "STARTTLS" in text
    assert "MAIL" not in smtp_server.verbs()
    assert delivery.remote_host == "mx.test"


def test_smarthost_starttls_verifies_the_certificate(
    smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport
):
    server = smtp_servers(tls=smtp_tls.server_context)
    delivery = transport.deliver(envelope(), route=smarthost(server), hosts=[Host(name="127.0.0.1", port=server.port)])
    assert only_reply(delivery)[0] is DELIVERED
    assert "STARTTLS" in server.verbs()


def test_smarthost_starttls_defers_on_a_certificate_that_does_not_verify(
    smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport
):
    server = smtp_servers(tls=smtp_tls.server_context)
    wrong_name = Host(name="other.test", address="127.0.0.1", port=server.port)
    delivery = transport.deliver(envelope(), route=smarthost(server), hosts=[wrong_name])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.7.5")
    assert "certificate" in text.lower()
    assert "MAIL" not in server.verbs()
    # Without verification the same host is fine.
    delivery = transport.deliver(envelope(), route=smarthost(server, tls_verify=False), hosts=[wrong_name])
    assert only_reply(delivery)[0] is DELIVERED


def test_smarthost_starttls_is_required(smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport):
    plain = smtp_servers()
    delivery = transport.deliver(envelope(), route=smarthost(plain), hosts=[Host(name="127.0.0.1", port=plain.port)])
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.7.0")
    refusing = smtp_servers(tls=smtp_tls.server_context, starttls_reply="454 4.7.0 TLS not available")
    delivery = transport.deliver(
        envelope(), route=smarthost(refusing), hosts=[Host(name="127.0.0.1", port=refusing.port)]
    )
    status, _, enhanced, text = only_reply(delivery)
    assert (status, enhanced) == (DEFERRED, "4.7.0")
    assert "454" in text
    failing = smtp_servers(tls=smtp_tls.server_context, drop_at="STARTTLS")
    delivery = transport.deliver(
        envelope(), route=smarthost(failing), hosts=[Host(name="127.0.0.1", port=failing.port)]
    )
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.7.5")
    assert failing.connections == 1  # never again in plain text
    assert not any("MAIL" in s.verbs() for s in (plain, refusing, failing))


def test_smarthost_implicit_tls(smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport):
    server = smtp_servers(tls=smtp_tls.server_context, implicit_tls=True)
    delivery = transport.deliver(
        envelope(),
        route=smarthost(server, tls="implicit"),
        hosts=[Host(name="localhost", address="127.0.0.1", port=server.port)],
    )
    assert only_reply(delivery)[0] is DELIVERED
    assert server.verbs() == ["EHLO", "MAIL", "RCPT", "DATA"]


def test_smarthost_implicit_tls_with_an_untrusted_certificate(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(tls=make_tls().server_context, implicit_tls=True)
    delivery = transport.deliver(
        envelope(), route=smarthost(server, tls="implicit"), hosts=[Host(name="127.0.0.1", port=server.port)]
    )
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.7.5")
    assert server.verbs() == []


def test_smarthost_without_tls_ignores_starttls(smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport):
    server = smtp_servers(tls=smtp_tls.server_context)
    delivery = transport.deliver(
        envelope(), route=smarthost(server, tls="none"), hosts=[Host(name="127.0.0.1", port=server.port)]
    )
    assert only_reply(delivery)[0] is DELIVERED
    assert "STARTTLS" not in server.verbs()


# -- AUTH ----------------------------------------------------------------------------


def bumail_log(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("bumail_queue"))


def assert_secret_kept(password: str, caplog: pytest.LogCaptureFixture, *texts: str) -> None:
    secrets = [password, base64.b64encode(f"\0{USER}\0{password}".encode()).decode()]
    for text in (bumail_log(caplog), *texts):
        for secret in secrets:
            assert secret not in text


def test_auth_after_starttls(smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport, caplog):
    caplog.set_level(logging.DEBUG, logger="bumail_queue")
    server = smtp_servers(tls=smtp_tls.server_context, auth=(USER, PASSWORD), auth_require_tls=True)
    route = smarthost(server, username=USER, password=PASSWORD)
    delivery = transport.deliver(envelope(), route=route, hosts=[Host(name="127.0.0.1", port=server.port)])
    assert only_reply(delivery)[0] is DELIVERED
    assert server.logins == [USER]
    assert server.verbs() == ["EHLO", "STARTTLS", "EHLO", "AUTH", "MAIL", "RCPT", "DATA"]
    assert_secret_kept(PASSWORD, caplog, repr(delivery), repr(route), repr(transport))


def test_wrong_credentials_defer_478(smtp_servers: Servers, transport: SMTPTransport, caplog):
    caplog.set_level(logging.DEBUG, logger="bumail_queue")
    server = smtp_servers(auth=(USER, "another password"))
    route = smarthost(server, tls="none", username=USER, password=PASSWORD)
    delivery = transport.deliver(envelope(), route=route, hosts=[Host(name="127.0.0.1", port=server.port)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, 535, "4.7.8")
    assert "Authentication" in text
    assert delivery.option_error is None
    assert "MAIL" not in server.verbs()
    assert_secret_kept(PASSWORD, caplog, repr(delivery))


def test_a_4xx_auth_reply_defers_with_it(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(auth=(USER, PASSWORD), auth_reply="454 4.7.0 Temporary authentication failure")
    route = smarthost(server, tls="none", username=USER, password=PASSWORD)
    delivery = transport.deliver(envelope(), route=route, hosts=[Host(name="127.0.0.1", port=server.port)])
    assert only_reply(delivery)[:3] == (DEFERRED, 454, "4.7.0")


def test_auth_not_offered_is_a_route_option_error(smtp_server: SMTPTestServer, transport: SMTPTransport):
    route = smarthost(smtp_server, tls="none", username=USER, password=PASSWORD)
    delivery = transport.deliver(
        envelope(item_id="item-9"), route=route, hosts=[Host(name="127.0.0.1", port=smtp_server.port)]
    )
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.3.5")
    error = delivery.option_error
    assert isinstance(error, RouteOptionError)
    assert error.code is ErrorCode.INVALID_OPTION
    assert error.item_id == "item-9"
    assert "AUTH" in str(error)
    assert "MAIL" not in smtp_server.verbs()


def test_a_password_smtplib_cannot_send_is_a_route_option_error(
    smtp_servers: Servers, transport: SMTPTransport, caplog
):
    caplog.set_level(logging.DEBUG, logger="bumail_queue")
    password = "test-pässwörd-sécret"
    server = smtp_servers(auth=(USER, password))
    route = smarthost(server, tls="none", username=USER, password=password)
    delivery = transport.deliver(envelope(), route=route, hosts=[Host(name="127.0.0.1", port=server.port)])
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.3.5")
    error = delivery.option_error
    assert error is not None
    assert error.__cause__ is None and error.__context__ is None
    assert_secret_kept(password, caplog, str(error), repr(error), repr(delivery))
    for fragment in ("ä", "ö", "é", "\\xe4"):
        assert fragment not in str(error)
        assert fragment not in bumail_log(caplog)


def test_a_route_smtplib_cannot_use_is_a_route_option_error(transport: SMTPTransport):
    route = Route(type="smarthost", host="127.0.0.1", port=1, tls="sometimes")
    delivery = transport.deliver(envelope(), route=route, hosts=[Host(name="127.0.0.1", port=closed_port())])
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.3.5")
    assert delivery.option_error is not None
    assert delivery.remote_host is None


# -- what MAIL says ------------------------------------------------------------------


def test_mail_says_the_size_when_size_is_offered(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers()
    transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    assert server.messages[0].mail_options == [f"SIZE={len(MESSAGE)}"]
    quiet = smtp_servers(size_limit=None)
    transport.deliver(envelope(), route=MX, hosts=[mx(quiet)])
    assert quiet.messages[0].mail_options == []


def test_a_message_larger_than_the_servers_size_fails_534(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(size_limit=1000)
    delivery = transport.deliver(
        envelope("a@example.org", "b@example.org", message=b"x" * 2000), route=MX, hosts=[mx(server)]
    )
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (FAILED, None, "5.3.4")
    assert "1000" in text
    assert server.verbs() == ["EHLO"]


def test_smtputf8_when_an_address_needs_it(smtp_server: SMTPTestServer, transport: SMTPTransport):
    delivery = transport.deliver(
        envelope("élodie@example.org", sender="jörg@bücher.example"), route=MX, hosts=[mx(smtp_server)]
    )
    assert only_reply(delivery)[0] is DELIVERED
    received = smtp_server.messages[0]
    assert "SMTPUTF8" in received.mail_options
    # The local part as written, the domain as A-labels (docs/delivery.md).
    assert (received.mail_from, received.rcpt_tos) == ("jörg@xn--bcher-kva.example", ["élodie@example.org"])


def test_without_smtputf8_a_utf8_recipient_fails_567_alone(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(smtputf8=False)
    delivery = transport.deliver(envelope("élodie@example.org", "ann@example.org"), route=MX, hosts=[mx(server)])
    utf8 = delivery.outcomes["élodie@example.org"]
    assert (utf8.status, utf8.reply.code, utf8.reply.status) == (FAILED, None, "5.6.7")
    assert delivery.outcomes["ann@example.org"].status is DELIVERED
    assert server.messages[0].rcpt_tos == ["ann@example.org"]
    assert "SMTPUTF8" not in server.messages[0].mail_options


def test_without_smtputf8_a_utf8_sender_fails_everyone_567(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(smtputf8=False)
    delivery = transport.deliver(
        envelope("ann@example.org", "bob@example.org", sender="jörg@bücher.example"), route=MX, hosts=[mx(server)]
    )
    assert only_reply(delivery)[:3] == (FAILED, None, "5.6.7")
    assert "MAIL" not in server.verbs()


def test_body_8bitmime_for_an_8bit_message(smtp_servers: Servers, transport: SMTPTransport):
    eight_bit = b"Subject: x\r\nContent-Transfer-Encoding: 8bit\r\n\r\n\xc3\xa9t\xc3\xa9\r\n"
    server = smtp_servers()
    transport.deliver(envelope(message=eight_bit), route=MX, hosts=[mx(server)])
    transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    assert [m.mail_options for m in server.messages] == [
        [f"SIZE={len(eight_bit)}", "BODY=8BITMIME"],
        [f"SIZE={len(MESSAGE)}"],
    ]
    old = smtp_servers(eightbitmime=False)
    delivery = transport.deliver(envelope(message=eight_bit), route=MX, hosts=[mx(old)])
    assert only_reply(delivery)[0] is DELIVERED
    # RFC 6152 §3: re-encoded for a server without 8BITMIME, its SIZE that of what is sent.
    converted = old.messages[0].data
    assert b"=C3=A9t=C3=A9" in converted
    assert old.messages[0].mail_options == [f"SIZE={len(converted)}"]


# -- addresses smtplib would refuse --------------------------------------------------


@pytest.mark.parametrize(
    "bad", ["bad\r\nRCPT TO:<x@example.org>@example.org", "nul\x00@example.org", "tab\t@example.org", "no-at-sign"]
)
def test_a_recipient_that_cannot_be_sent_fails_513_alone(smtp_server: SMTPTestServer, transport: SMTPTransport, bad):
    delivery = transport.deliver(envelope("ann@example.org", bad), route=MX, hosts=[mx(smtp_server)])
    outcome = delivery.outcomes[bad]
    assert (outcome.status, outcome.reply.code, outcome.reply.status) == (FAILED, None, "5.1.3")
    assert "\x00" not in outcome.reply.text and "\n" not in outcome.reply.text
    assert delivery.outcomes["ann@example.org"].status is DELIVERED
    assert [c.arg for c in smtp_server.commands if c.verb == "RCPT"] == ["TO:<ann@example.org>"]


def test_a_sender_that_cannot_be_sent_fails_every_recipient_517(smtp_server: SMTPTestServer, transport: SMTPTransport):
    delivery = transport.deliver(
        envelope("a@example.org", "b@example.org", sender="me\r\n@example.com"), route=MX, hosts=[mx(smtp_server)]
    )
    assert only_reply(delivery)[:3] == (FAILED, None, "5.1.7")
    assert delivery.remote_host is None
    assert smtp_server.connections == 0


# -- timeouts and dropped connections -------------------------------------------------


@pytest.mark.parametrize(
    ("step", "timeout"),
    [
        ("greeting", "greeting"),
        ("EHLO", "greeting"),
        ("MAIL", "mail"),
        ("RCPT", "rcpt"),
        ("DATA", "data"),
        ("DATA_END", "data_end"),
    ],
)
def test_a_stalled_step_times_out_with_its_own_timeout(
    smtp_servers: Servers, transports: Callable[..., SMTPTransport], step, timeout
):
    server = smtp_servers(stall_at=step)
    transport = transports(timeouts=timeouts(**{timeout: 0.5}))
    started = time.monotonic()
    delivery = transport.deliver(envelope("a@example.org", "b@example.org"), route=MX, hosts=[mx(server)])
    assert time.monotonic() - started < 4
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert "Timed out" in text
    assert transport.pooled_count() == 0
    assert server.messages == []


def test_a_stalled_message_block_times_out(smtp_servers: Servers, transports: Callable[..., SMTPTransport]):
    server = smtp_servers(stall_at="MESSAGE", size_limit=None)
    transport = transports(timeouts=timeouts(data_block=0.5))
    big = b"Subject: big\r\n\r\n" + (b"x" * 998 + b"\r\n") * 16 * 1024  # 16 MiB: more than the socket buffers hold
    started = time.monotonic()
    delivery = transport.deliver(envelope(message=big), route=MX, hosts=[mx(server)])
    assert time.monotonic() - started < 10
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert "sending the message" in text


def test_a_connection_that_is_never_accepted_times_out(transports: Callable[..., SMTPTransport]):
    transport = transports(timeouts=timeouts(connect=0.5))
    with unanswered_port() as port:
        delivery = transport.deliver(envelope(), route=MX, hosts=[Host(name="mx.test", address="127.0.0.1", port=port)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert "connecting" in text


def test_the_session_timeout_bounds_the_whole_delivery(smtp_servers: Servers, transports: Callable[..., SMTPTransport]):
    server = smtp_servers(stall_at="RCPT", stall_seconds=10)
    transport = transports(timeouts=timeouts(rcpt=30, session=1.0))
    started = time.monotonic()
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(server)])
    assert time.monotonic() - started < 3
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.4.2")


def test_a_session_past_its_deadline_stops_before_the_next_step(
    smtp_server: SMTPTestServer, transports: Callable[..., SMTPTransport]
):
    clock = FakeClock()

    def ticking() -> float:
        clock.now += 25
        return clock.now

    transport = transports(timeouts=timeouts(session=60), clock=ticking)
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert "time limit" in text


def test_a_stalled_first_host_moves_to_the_next(smtp_servers: Servers, transports: Callable[..., SMTPTransport]):
    stalled, good = smtp_servers(stall_at="greeting"), smtp_servers()
    transport = transports(timeouts=timeouts(greeting=0.5))
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(stalled, "mx1.test"), mx(good, "mx2.test")])
    assert only_reply(delivery)[0] is DELIVERED
    assert delivery.remote_host == "mx2.test"


@pytest.mark.parametrize("step", ["MAIL", "RCPT", "DATA", "MESSAGE", "DATA_END"])
def test_a_dropped_connection_defers_442(smtp_servers: Servers, transport: SMTPTransport, step):
    server = smtp_servers(drop_at=step)
    delivery = transport.deliver(envelope("a@example.org", "b@example.org"), route=MX, hosts=[mx(server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (DEFERRED, None, "4.4.2")
    assert "dropped" in text
    assert transport.pooled_count() == 0


def test_a_connection_dropped_before_the_greeting_moves_to_the_next_host(
    smtp_servers: Servers, transport: SMTPTransport
):
    dropping, good = smtp_servers(drop_at="greeting"), smtp_servers()
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(dropping, "mx1.test")])
    assert only_reply(delivery)[:3] == (DEFERRED, None, "4.4.2")
    assert delivery.remote_host is None
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(dropping, "mx1.test"), mx(good, "mx2.test")])
    assert only_reply(delivery)[0] is DELIVERED


# -- connection reuse -----------------------------------------------------------------


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_connection_is_reused_without_rset_after_a_message(
    smtp_server: SMTPTestServer, transport: SMTPTransport, pipelining
):
    smtp_server.pipelining = pipelining
    for item in ("item-1", "item-2"):
        delivery = transport.deliver(envelope(item_id=item), route=MX, hosts=[mx(smtp_server)])
        assert only_reply(delivery)[0] is DELIVERED
    assert smtp_server.connections == 1
    # The reply to the final dot left the session between transactions: no RSET, which
    # Postfix's smtpd counts as a junk command (smtpd_junk_command_limit).
    assert smtp_server.verbs() == ["EHLO", "MAIL", "RCPT", "DATA", "MAIL", "RCPT", "DATA"]
    assert transport.pooled_count() == 1
    transport.close()
    assert transport.pooled_count() == 0
    assert smtp_server.verbs()[-1] == "QUIT"


def test_no_reuse_quits_after_each_envelope(smtp_server: SMTPTestServer, transports: Callable[..., SMTPTransport]):
    transport = transports(reuse_seconds=0)
    for _ in range(2):
        transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    assert smtp_server.connections == 2
    assert smtp_server.verbs(1)[-1] == smtp_server.verbs(2)[-1] == "QUIT"
    assert transport.pooled_count() == 0


def test_a_connection_idle_too_long_is_not_reused(
    smtp_server: SMTPTestServer, transports: Callable[..., SMTPTransport]
):
    clock = FakeClock()
    transport = transports(reuse_seconds=10, clock=clock)
    transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    clock.now += 11
    transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    assert smtp_server.connections == 2
    assert smtp_server.verbs(1)[-1] == "QUIT"


def test_close_idle_closes_only_what_idled_too_long(smtp_servers: Servers, transports: Callable[..., SMTPTransport]):
    clock = FakeClock()
    old, fresh = smtp_servers(), smtp_servers()
    transport = transports(reuse_seconds=10, clock=clock)
    transport.deliver(envelope(), route=MX, hosts=[mx(old)])
    clock.now += 6
    transport.deliver(envelope(), route=MX, hosts=[mx(fresh)])
    clock.now += 6
    transport.close_idle()
    assert transport.pooled_count() == 1
    assert old.verbs()[-1] == "QUIT"
    assert "QUIT" not in fresh.verbs()


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_connection_left_inside_a_transaction_is_reused_after_rset(
    smtp_server: SMTPTestServer, transport: SMTPTransport, pipelining
):
    smtp_server.pipelining = pipelining
    smtp_server.data_reply = "451 4.3.0 Not now"  # MAIL and RCPT accepted, DATA refused: a transaction is open
    assert only_reply(transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)]))[0] is DEFERRED
    smtp_server.data_reply = None
    assert only_reply(transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)]))[0] is DELIVERED
    assert smtp_server.connections == 1
    assert smtp_server.verbs() == ["EHLO", "MAIL", "RCPT", "DATA", "RSET", "MAIL", "RCPT", "DATA"]
    if pipelining:  # RSET went with MAIL, RCPT and DATA
        assert len({c.read for c in smtp_server.commands[4:]}) == 1


@pytest.mark.parametrize("pipelining", [True, False])
@pytest.mark.parametrize("last_words", [None, "421 4.4.2 Idle for too long"])
def test_a_kept_connection_the_server_closed_is_replaced_silently(
    smtp_server: SMTPTestServer, transport: SMTPTransport, last_words, pipelining
):
    smtp_server.pipelining = pipelining
    transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    smtp_server.hang_up(last_words)  # an idle timeout, silent or said as Postfix says it
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    assert only_reply(delivery)[0] is DELIVERED
    assert smtp_server.connections == 2
    assert len(smtp_server.messages) == 2


@pytest.mark.parametrize("pipelining", [True, False])
@pytest.mark.parametrize("knobs", [{"drop_at": "RSET"}, {"rset_reply": "421 4.4.2 Idle for too long"}])
def test_a_kept_connection_that_fails_rset_is_replaced_silently(
    smtp_server: SMTPTestServer, transport: SMTPTransport, knobs, pipelining
):
    smtp_server.pipelining = pipelining
    smtp_server.data_reply = "451 4.3.0 Not now"  # leaves a transaction open: the next one starts with RSET
    transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    smtp_server.data_reply = None
    for name, value in knobs.items():
        setattr(smtp_server, name, value)
    delivery = transport.deliver(envelope(), route=MX, hosts=[mx(smtp_server)])
    assert only_reply(delivery)[0] is DELIVERED
    assert smtp_server.connections == 2
    assert len(smtp_server.messages) == 1


def test_connections_are_pooled_per_policy(smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport):
    server = smtp_servers(auth=(USER, PASSWORD))
    transport.deliver(envelope(), route=MX, hosts=[mx(server)])  # MX: no AUTH, so MAIL is refused
    route = smarthost(server, tls="none", username=USER, password=PASSWORD)
    delivery = transport.deliver(
        envelope(), route=route, hosts=[Host(name="mx.test", address="127.0.0.1", port=server.port)]
    )
    assert only_reply(delivery)[0] is DELIVERED
    assert server.connections == 2
    assert transport.pooled_count() == 2


def test_deliver_from_several_threads_at_once(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers()
    barrier = threading.Barrier(6)

    def work(n: int) -> list[SMTPDelivery]:
        barrier.wait()
        return [
            transport.deliver(envelope(f"r{n}-{i}@example.org", item_id=f"item-{n}-{i}"), route=MX, hosts=[mx(server)])
            for i in range(4)
        ]

    with ThreadPoolExecutor(6) as pool:
        results = [d for batch in pool.map(work, range(6)) for d in batch]
    assert all(only_reply(d)[0] is DELIVERED for d in results)
    assert sorted(r for m in server.messages for r in m.rcpt_tos) == sorted(
        f"r{n}-{i}@example.org" for n in range(6) for i in range(4)
    )
    assert all(len(m.rcpt_tos) == 1 for m in server.messages)
    assert server.connections <= 6
    assert transport.pooled_count() == server.connections


# -- replies -------------------------------------------------------------------------


def test_reply_text_is_cleaned():
    assert clean_reply_text("a\x00b\r\nc\n\nd") == "ab c d"
    assert clean_reply_text("lone \ud800 surrogate") == "lone \ufffd surrogate"
    long = "é" * (MAX_REPLY_TEXT + 10)
    assert clean_reply_text(long) == "é" * MAX_REPLY_TEXT


def test_reply_from_reads_the_enhanced_status_code():
    assert reply_from(550, b"5.1.1 No such user") == Reply(code=550, status="5.1.1", text="5.1.1 No such user")
    assert reply_from(451, b"Try later").status == "4.0.0"
    assert reply_from(250, b"Ok").status == "2.0.0"
    assert reply_from(550, b"4.1.1 class does not match").status == "5.0.0"
    assert reply_from(550, b"5.1.1234 too many digits").status == "5.0.0"
    assert reply_from(552, b"5.3.4\nmore").status == "5.3.4"
    garbled = reply_from(550, b"caf\xe9 \xff\xfe\x00 end")
    assert garbled.text == "caf\ufffd \ufffd\ufffd end"
    assert reply_from(550, b"x" * 2000).text == "x" * MAX_REPLY_TEXT


def test_a_tls_deferral_says_which_setting_would_change_it(
    smtp_servers: Servers, smtp_tls: TestTLS, transport: SMTPTransport
):
    plain = smtp_servers()
    to_sink = transport.deliver(envelope(), route=smarthost(plain), hosts=[Host(name="127.0.0.1", port=plain.port)])
    direct = transport.deliver(envelope(), route=Route(type="mx", tls_required=True), hosts=[mx(plain)])

    assert "a local server without TLS (a development sink) 'TLS': 'none'" in only_reply(to_sink)[3]
    assert "The route says 'TLS_REQUIRED': True" in only_reply(direct)[3]
