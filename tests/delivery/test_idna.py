"""Internationalized domains and UTF-8 header fields on the wire: IDNA2008 A-labels
(RFC 5891, UTS #46) where a server does not offer SMTPUTF8, and SMTPUTF8 (RFC 6531)
where a local part or a header field needs it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import override_settings

from bumail_queue import queue
from bumail_queue.conf import Route, load
from bumail_queue.delivery.routes import group_by_destination
from bumail_queue.delivery.smtp import SMTPTransport
from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import RecipientStatus
from tests.delivery.test_dns import host, resolver_for
from tests.helpers import envelope, mx, only_reply
from tests.servers.dns import DNSZone, LoopbackDNSServer
from tests.servers.smtp import SMTPTestServer

DELIVERED, FAILED = RecipientStatus.DELIVERED, RecipientStatus.FAILED
MX = Route(type="mx")
Servers = Callable[..., SMTPTestServer]

UTF8_SUBJECT = "From: news@example.com\r\nTo: ann@example.org\r\nSubject: Grüße aus Köln\r\n\r\nHello.\r\n".encode()
EIGHT_BIT_BODY = "From: news@example.com\r\nSubject: Hello\r\n\r\nGrüße.\r\n".encode()
HEADERS_REFUSED = "The message's header fields are UTF-8 and the server does not offer SMTPUTF8"


@pytest.fixture
def transport(transports: Callable[..., SMTPTransport]) -> SMTPTransport:
    return transports()


def rcpt_args(server: SMTPTestServer) -> list[str]:
    return [c.arg for c in server.commands if c.verb == "RCPT"]


def mail_args(server: SMTPTestServer) -> list[str]:
    return [c.arg for c in server.commands if c.verb == "MAIL"]


# -- addresses -----------------------------------------------------------------------


def test_without_smtputf8_a_utf8_domain_goes_as_idna2008_a_labels(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(smtputf8=False)
    delivery = transport.deliver(
        envelope("anna@straße.example", sender="news@bücher.example"), route=MX, hosts=[mx(server)]
    )
    assert only_reply(delivery)[0] is DELIVERED
    # Not "strasse.example", IDNA2003's answer: another domain.
    assert rcpt_args(server) == ["TO:<anna@xn--strae-oqa.example>"]
    assert mail_args(server)[0].startswith("FROM:<news@xn--bcher-kva.example>")
    assert "SMTPUTF8" not in server.messages[0].mail_options


def test_with_smtputf8_offered_a_utf8_domain_still_goes_as_a_labels(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(smtputf8=True)
    delivery = transport.deliver(envelope("anna@straße.example"), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[0] is DELIVERED
    assert server.messages[0].rcpt_tos == ["anna@xn--strae-oqa.example"]
    # Only a domain is UTF-8: nothing needs SMTPUTF8.
    assert "SMTPUTF8" not in server.messages[0].mail_options


def test_without_smtputf8_a_utf8_local_part_still_fails_567(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(smtputf8=False)
    delivery = transport.deliver(envelope("anna@straße.example", "jürgen@straße.example"), route=MX, hosts=[mx(server)])
    refused = delivery.outcomes["jürgen@straße.example"]
    assert (refused.status, refused.reply.status) == (FAILED, "5.6.7")
    assert "non-ASCII local part" in refused.reply.text
    assert delivery.outcomes["anna@straße.example"].status is DELIVERED
    assert rcpt_args(server) == ["TO:<anna@xn--strae-oqa.example>"]


def test_an_address_idna2008_refuses_fails_at_delivery_without_a_session(smtp_server, transport: SMTPTransport):
    # An item queued before IDNA2008 was checked at enqueue.
    delivery = transport.deliver(envelope("user@☃.example"), route=MX, hosts=[mx(smtp_server)])
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (FAILED, None, "5.1.3")
    assert "IDNA2008 refuses the domain" in text
    assert smtp_server.connections == 0


# -- header fields -------------------------------------------------------------------


def test_utf8_header_fields_send_smtputf8_when_offered(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(smtputf8=True)
    delivery = transport.deliver(envelope(message=UTF8_SUBJECT), route=MX, hosts=[mx(server)])
    assert only_reply(delivery)[0] is DELIVERED
    assert "SMTPUTF8" in server.messages[0].mail_options
    assert "Subject: Grüße aus Köln".encode() in server.messages[0].data


def test_utf8_header_fields_fail_567_where_smtputf8_is_not_offered(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(smtputf8=False)
    delivery = transport.deliver(
        envelope("ann@example.org", "bob@example.org", message=UTF8_SUBJECT), route=MX, hosts=[mx(server)]
    )
    status, code, enhanced, text = only_reply(delivery)
    assert (status, code, enhanced) == (FAILED, None, "5.6.7")
    assert text.startswith(HEADERS_REFUSED)
    assert "MAIL" not in server.verbs()
    assert server.messages == []


def test_an_8bit_body_alone_asks_no_smtputf8(smtp_servers: Servers, transport: SMTPTransport):
    offered, not_offered = smtp_servers(smtputf8=True), smtp_servers(smtputf8=False)
    for server in (offered, not_offered):
        delivery = transport.deliver(envelope(message=EIGHT_BIT_BODY), route=MX, hosts=[mx(server)])
        assert only_reply(delivery)[0] is DELIVERED
        assert "SMTPUTF8" not in server.messages[0].mail_options


# -- DNS and routes ------------------------------------------------------------------


def test_the_mx_of_an_idn_is_asked_for_in_idna2008_a_labels(dns_server: LoopbackDNSServer) -> None:
    dns_server.zone = DNSZone(
        {
            "xn--strae-oqa.example": {"MX": [(10, "mx.xn--strae-oqa.example")]},
            "mx.xn--strae-oqa.example": {"A": ["127.0.0.1"]},
            "strasse.example": {"MX": [(10, "mx.strasse.example")]},
            "mx.strasse.example": {"A": ["127.0.0.2"]},
        }
    )
    result = resolver_for(dns_server).destinations("Straße.example")
    assert dns_server.queries[0] == ("xn--strae-oqa.example", "MX")
    assert result.hosts == (host("mx.xn--strae-oqa.example", "127.0.0.1"),)


def test_a_routes_key_in_u_labels_is_matched_by_idna2008():
    smarthost = {"TYPE": "smarthost", "HOST": "relay.example.net"}
    settings = load({"ROUTES": {"straße.example": smarthost}})
    groups = group_by_destination(["anna@STRAßE.example", "anna@strasse.example"], settings)
    by_route = {d.route.type: addresses for d, addresses in groups.items()}
    assert by_route == {"smarthost": ["anna@STRAßE.example"], "mx": ["anna@strasse.example"]}
    assert set(settings.routes) == {"xn--strae-oqa.example"}


def test_a_routes_key_idna2008_refuses_is_reported():
    from bumail_queue.conf import validate

    problems = validate({"ROUTES": {"☃.example": {"TYPE": "mx"}}})
    assert [(p.id, p.key) for p in problems] == [("bumail_queue.E007", "ROUTES")]
    assert "'☃.example'" in problems[0].message


# -- end to end ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_refuses_a_domain_idna2008_refuses():
    with pytest.raises(QueueError) as info:
        queue.enqueue(b"Subject: hi\r\n\r\nx\r\n", sender="news@example.com", recipients=["user@☃.example"])
    assert info.value.code == ErrorCode.INVALID
    # The reason in parentheses is the idna package's own words.
    assert info.value.message.startswith(
        "The recipient address 'user@☃.example' cannot be queued: IDNA2008 refuses the domain ("
    )
    assert "U+2603" in info.value.message
    assert queue.count() == 0


@pytest.mark.django_db(transaction=True)
def test_mail_to_an_idn_reaches_its_mx_as_a_labels(smtp_servers: Servers, dns_server: LoopbackDNSServer):
    server = smtp_servers(smtputf8=False)
    dns_server.zone = DNSZone(
        {
            "xn--strae-oqa.example": {"MX": [(10, "mx.xn--strae-oqa.example")]},
            "mx.xn--strae-oqa.example": {"A": ["127.0.0.1"]},
        }
    )
    settings = {"HOSTNAME": "mta.example.com", **dns_server.queue_settings(server.port)}
    with override_settings(BUMAIL_QUEUE=settings):
        item = queue.enqueue(
            b"From: news@example.com\r\nSubject: hi\r\n\r\nx\r\n",
            sender="news@example.com",
            recipients=["anna@straße.example"],
        )
        stats = queue.deliver_due()
    assert stats.delivered == 1
    assert queue.get(item.id) is None
    assert ("xn--strae-oqa.example", "MX") in dns_server.queries
    assert ("strasse.example", "MX") not in dns_server.queries
    assert server.messages[0].rcpt_tos == ["anna@xn--strae-oqa.example"]
