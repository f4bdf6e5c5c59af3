"""One-click unsubscribe from the wire back, on every store: a channel's mail reaches a
loopback SMTP server with each recipient's own ``List-Unsubscribe`` and
``List-Unsubscribe-Post``, DKIM-signed and verified by dkimpy against the key the
loopback DNS server publishes; the URL in the header, posted as a mailbox provider
posts it, suppresses that recipient for that channel, and the channel's next mail to
it fails suppressed while the other channels' mail still goes."""

from __future__ import annotations

import email
import email.policy
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import dkim
import dns.exception
import pytest
from django.core import mail
from django.test import Client, override_settings

from bumail_queue.conf import DKIMSigner
from bumail_queue.delivery.dkim import load_key, public_key_record
from bumail_queue.delivery.dns import make_resolver
from bumail_queue.list_unsubscribe import read_token
from bumail_queue.service import QueueService, queue
from bumail_queue.suppression import SuppressionReason
from tests.helpers import signals_told
from tests.servers.dns import DNSZone

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
URL = "https://www.example.com/mail/unsubscribe/"
SENDER = "news@example.com"
ANN, BOB, CY = "ann@example.org", "bob@example.org", "cy@example.org"


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


@pytest.fixture
def signer(dkim_keys, dns_server):
    """example.com's RSA signer, its key published by the loopback DNS server."""
    made = DKIMSigner(domain="example.com", selector="rsa1", key=dkim_keys.rsa_pem, algorithm="rsa-sha256")
    dns_server.zone = DNSZone({"rsa1._domainkey.example.com": {"TXT": [public_key_record(load_key(made))]}})
    return made


@pytest.fixture
def site(smtp_server, signer, store_settings, monkeypatch):
    """A site whose newsletter has one-click unsubscribe, delivering to the loopback server."""
    monkeypatch.setattr(queue, "clock", lambda: T0)  # the view's
    settings = {
        "HOSTNAME": "mta.example.com",
        "ROUTE": {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": smtp_server.port, "TLS": "none"},
        "DKIM": [{"DOMAIN": signer.domain, "SELECTOR": signer.selector, "KEY": signer.key}],
        "UNSUBSCRIBE": {"newsletter": {"URL": URL}},
        **store_settings,
    }
    with override_settings(BUMAIL_QUEUE=settings):
        yield smtp_server


def send(*recipients, channel, subject="Spring news", at=T0):
    message = (
        f"From: News <{SENDER}>\r\nTo: {', '.join(recipients)}\r\nSubject: {subject}\r\n"
        f"Date: Sun, 01 Mar 2026 09:00:00 +0000\r\n\r\nThe news.\r\n"
    ).encode()
    return QueueService(clock=lambda: at).enqueue(message, sender=SENDER, recipients=list(recipients), channel=channel)


def deliver(at):
    return QueueService(clock=lambda: at).deliver_due(now=at)


def received(server):
    """The messages the server took from the newsletter's sender (no DSN), parsed, with their bytes."""
    return [
        (m.rcpt_tos, m.data, email.message_from_bytes(m.data, policy=email.policy.default))
        for m in server.messages
        if m.mail_from == SENDER
    ]


def verifies(data, dns_server):
    resolver = make_resolver(dns_server.nameservers)

    def lookup(name, timeout=5):
        try:
            answer = resolver.resolve(name.decode().rstrip("."), "TXT", lifetime=timeout)
        except dns.exception.DNSException:
            return b""
        return b"".join(b"".join(record.strings) for record in answer)

    return bool(dkim.DKIM(data).verify(dnsfunc=lookup))


def signed_fields(data):
    [(_, value)] = [(n, v) for n, v in dkim.rfc822_parse(data)[0] if n.lower() == b"dkim-signature"]
    return [name.strip() for name in dkim.util.parse_tag_value(value)[b"h"].split(b":")]


def token_of(parsed):
    link = str(parsed["List-Unsubscribe"]).strip()
    assert link.startswith(f"<{URL}") and link.endswith("/>")
    return link[1:-1]


def test_each_recipient_gets_its_own_signed_one_click_header_and_posting_it_unsubscribes(site, dns_server):
    smtp_server = site
    send(ANN, BOB, channel="newsletter")
    send(ANN, channel="default", subject="Your receipt")
    deliver(T0)

    got = received(smtp_server)
    newsletters = {tuple(rcpts): (data, parsed) for rcpts, data, parsed in got if parsed["Subject"] == "Spring news"}
    assert sorted(newsletters) == [(ANN,), (BOB,)]  # a transaction a recipient
    for (recipient,), (data, parsed) in newsletters.items():
        url = token_of(parsed)
        named = read_token(url.removeprefix(URL).removesuffix("/"))
        assert (named.channel, named.address) == ("newsletter", recipient)
        assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        assert {b"list-unsubscribe", b"list-unsubscribe-post"} <= set(signed_fields(data))  # RFC 8058 §4
        assert verifies(data, dns_server)
        assert parsed.get_content().strip() == "The news."
    [(receipt_rcpts, receipt, parsed_receipt)] = [g for g in got if g[2]["Subject"] == "Your receipt"]
    assert receipt_rcpts == [ANN] and "List-Unsubscribe" not in parsed_receipt  # another channel: nothing added
    assert verifies(receipt, dns_server)

    # Ann's mailbox provider posts her URL, without a cookie or a CSRF token.
    ann_url = token_of(newsletters[(ANN,)][1])
    with signals_told("unsubscribed") as told:
        response = Client(enforce_csrf_checks=True).post(
            urlsplit(ann_url).path, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
        )
    assert response.status_code == 200
    assert [(k["recipient"], k["channel"]) for _, k in told] == [(ANN, "newsletter")]

    # The newsletter's next mail: Ann fails at once, suppressed; Bob gets it; Ann's receipts still go.
    with signals_told("failed", "delivered") as outcomes:
        second = send(ANN, BOB, channel="newsletter", subject="Summer news", at=T0 + timedelta(minutes=1))
        receipt = send(ANN, channel="default", subject="Another receipt", at=T0 + timedelta(minutes=1))
        deliver(T0 + timedelta(minutes=1))
        third = send(ANN, channel="newsletter", subject="Autumn news", at=T0 + timedelta(minutes=2))
        deliver(T0 + timedelta(minutes=2))  # a delivery of another channel took nothing off

    said = {(k["item_id"], k["recipient"]): (name, k["reply"]) for name, k in outcomes if k["envelope_sender"]}
    assert said[(second.id, BOB)][0] == "delivered"
    assert said[(receipt.id, ANN)][0] == "delivered"
    for item in (second, third):
        name, reply = said[(item.id, ANN)]
        assert (name, reply.code, reply.status) == ("failed", None, "5.7.1")
        assert "its recipient unsubscribed" in reply.text
    subjects = [(rcpts, parsed["Subject"]) for rcpts, _, parsed in received(smtp_server)]
    assert ([ANN], "Summer news") not in subjects and ([ANN], "Autumn news") not in subjects
    assert ([BOB], "Summer news") in subjects and ([ANN], "Another receipt") in subjects
    [entry] = QueueService(clock=lambda: T0).store.search_suppressions(now=T0)
    assert (entry.address, entry.reason, entry.scope) == (ANN, SuppressionReason.UNSUBSCRIBED, "channel:newsletter")


def test_items_of_one_recipient_each_get_their_own_header_on_a_shared_session(site, dns_server):
    smtp_server = site
    items = {address: send(address, channel="newsletter") for address in (ANN, BOB, CY)}
    stats = deliver(T0)

    assert stats.delivered == 3
    got = received(smtp_server)
    assert sorted(rcpts[0] for rcpts, _, _ in got) == sorted(items)
    for (recipient,), data, parsed in got:
        assert read_token(token_of(parsed).removeprefix(URL).removesuffix("/")).address == recipient
        assert verifies(data, dns_server)


def test_a_message_with_its_own_list_unsubscribe_keeps_it(site, dns_server):
    smtp_server = site
    message = (
        f"From: {SENDER}\r\nTo: {ANN}\r\nSubject: Own\r\nList-Unsubscribe: <mailto:leave@example.com>\r\n\r\nHi.\r\n"
    )
    QueueService(clock=lambda: T0).enqueue(message.encode(), sender=SENDER, recipients=[ANN], channel="newsletter")
    deliver(T0)

    [(_, data, parsed)] = received(smtp_server)
    assert parsed.get_all("List-Unsubscribe") == ["<mailto:leave@example.com>"]
    assert "List-Unsubscribe-Post" not in parsed
    assert verifies(data, dns_server)


def test_a_dsn_of_the_channel_gets_no_list_unsubscribe(smtp_servers, signer, store_settings):
    recipients = smtp_servers(rcpt_replies={ANN: "550 5.1.1 <ann@example.org>: User unknown"})
    senders = smtp_servers()

    def to(server):
        return {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": server.port, "TLS": "none"}

    settings = {
        "HOSTNAME": "mta.example.com",
        "ROUTE": to(recipients),
        "ROUTES": {"example.com": to(senders)},
        "UNSUBSCRIBE": {"newsletter": {"URL": URL}},
        **store_settings,
    }
    with override_settings(BUMAIL_QUEUE=settings):
        send(ANN, channel="newsletter")
        deliver(T0)
        deliver(T0 + timedelta(seconds=1))

    [dsn] = [m for m in senders.messages if m.mail_from == ""]
    assert b"List-Unsubscribe" not in dsn.data.partition(b"\r\n\r\n")[0]


def test_a_backend_route_gets_each_recipients_header_too(store_settings):
    mail.outbox = []
    route = {"TYPE": "backend", "BACKEND": "anymail.backends.test.EmailBackend", "NAME": "test-esp"}
    settings = {"ROUTE": route, "UNSUBSCRIBE": {"newsletter": {"URL": URL}}, **store_settings}
    with override_settings(BUMAIL_QUEUE=settings):
        send(ANN, BOB, channel="newsletter")
        stats = deliver(T0)

    assert (stats.items, stats.delivered) == (1, 2)
    headers = {}
    for sent in mail.outbox:
        params = sent.anymail_test_params
        [recipient] = [a.addr_spec for a in params["to"] + params.get("cc", []) + params.get("bcc", [])]
        headers[recipient] = params["extra_headers"]
    assert sorted(headers) == [ANN, BOB]
    for recipient, fields in headers.items():
        link = fields["List-Unsubscribe"]
        assert read_token(link[1:-1].removeprefix(URL).removesuffix("/")).address == recipient
        assert fields["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"


def test_a_channel_without_unsubscribe_keeps_one_transaction_and_gets_no_header(site):
    smtp_server = site
    send(ANN, BOB, channel="offers")
    deliver(T0)

    [(rcpts, _, parsed)] = received(smtp_server)
    assert sorted(rcpts) == [ANN, BOB]  # one transaction, as before
    assert "List-Unsubscribe" not in parsed
