"""RFC 3461 on the wire: where a server offers DSN, MAIL asks for the headers only in
a bounce and names the item (``RET=HDRS ENVID=``), and each RCPT asks for failures
and delays (``NOTIFY=``) and gives the recipient as written (``ORCPT=``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import override_settings

from bumail_queue import queue
from bumail_queue.conf import Route
from bumail_queue.delivery.smtp import SMTPTransport
from bumail_queue.items import RecipientStatus
from tests.helpers import MESSAGE, envelope, mx, only_reply, smarthost
from tests.servers.smtp import SMTPTestServer

DELIVERED = RecipientStatus.DELIVERED
MX = Route(type="mx")
Servers = Callable[..., SMTPTestServer]


@pytest.fixture
def transport(transports: Callable[..., SMTPTransport]) -> SMTPTransport:
    return transports()


def args(server: SMTPTestServer, verb: str) -> list[str]:
    return [c.arg for c in server.commands if c.verb == verb]


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_server_that_offers_dsn_is_asked_for_failures_and_delays_with_the_headers(
    smtp_servers: Servers, transport: SMTPTransport, pipelining: bool
):
    server = smtp_servers(dsn=True, pipelining=pipelining)

    delivery = transport.deliver(
        envelope("ann@example.org", "bob@example.org", item_id="0b7c-item"), route=MX, hosts=[mx(server)]
    )

    assert only_reply(delivery)[0] is DELIVERED
    assert args(server, "MAIL") == [f"FROM:<sender@example.com> SIZE={len(MESSAGE)} RET=HDRS ENVID=0b7c-item"]
    assert args(server, "RCPT") == [
        "TO:<ann@example.org> NOTIFY=FAILURE,DELAY ORCPT=rfc822;ann@example.org",
        "TO:<bob@example.org> NOTIFY=FAILURE,DELAY ORCPT=rfc822;bob@example.org",
    ]


def test_a_server_without_dsn_gets_none_of_its_parameters(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(dsn=False)

    transport.deliver(envelope(), route=MX, hosts=[mx(server)])

    assert args(server, "MAIL") == [f"FROM:<sender@example.com> SIZE={len(MESSAGE)}"]
    assert args(server, "RCPT") == ["TO:<ann@example.org>"]


def test_a_report_sent_from_the_null_sender_asks_for_no_report_of_its_own(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(dsn=True)

    transport.deliver(envelope(sender=""), route=MX, hosts=[mx(server)])

    assert args(server, "RCPT") == ["TO:<ann@example.org> NOTIFY=NEVER ORCPT=rfc822;ann@example.org"]


def test_orcpt_and_envid_are_xtext(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(dsn=True)

    transport.deliver(envelope("ann+news@example.org", "a=b@example.org", item_id="id+1"), route=MX, hosts=[mx(server)])

    assert args(server, "MAIL")[0].endswith(" ENVID=id+2B1")
    assert args(server, "RCPT") == [
        "TO:<ann+news@example.org> NOTIFY=FAILURE,DELAY ORCPT=rfc822;ann+2Bnews@example.org",
        "TO:<a=b@example.org> NOTIFY=FAILURE,DELAY ORCPT=rfc822;a+3Db@example.org",
    ]


def test_a_utf8_local_part_goes_without_orcpt_and_an_idn_with_its_a_labels(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(dsn=True, smtputf8=True)

    transport.deliver(envelope("élodie@example.org", "anna@straße.example"), route=MX, hosts=[mx(server)])

    assert args(server, "RCPT") == [
        "TO:<élodie@example.org> NOTIFY=FAILURE,DELAY",
        "TO:<anna@xn--strae-oqa.example> NOTIFY=FAILURE,DELAY ORCPT=rfc822;anna@xn--strae-oqa.example",
    ]


def test_an_envid_longer_than_100_characters_is_left_out(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(dsn=True)

    transport.deliver(envelope(item_id="x" * 101), route=MX, hosts=[mx(server)])

    assert args(server, "MAIL")[0].endswith(" RET=HDRS")


@pytest.mark.django_db(transaction=True)
def test_the_envid_a_server_further_on_would_report_is_the_items_id(smtp_servers: Servers):
    server = smtp_servers(dsn=True)
    with override_settings(BUMAIL_QUEUE=smarthost(server)):
        item = queue.enqueue(b"From: app@example.com\r\nTo: ann@example.org\r\nSubject: x\r\n\r\nHello.\r\n")
        assert queue.deliver_due().delivered == 1

    assert args(server, "MAIL")[0].endswith(f" RET=HDRS ENVID={item.id}")
