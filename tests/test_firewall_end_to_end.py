"""The staging firewall from ``send_mail()`` to a real SMTP server on loopback: what it
holds waits for ``queue_release``, what it redirects reaches ``REDIRECT_TO`` alone."""

from __future__ import annotations

import email
import email.policy
from io import StringIO

import dkim
import dns.exception
import pytest
from django.core.mail import EmailMessage, send_mail
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.conf import DKIMSigner
from bumail_queue.delivery.dkim import load_key, public_key_record
from bumail_queue.delivery.dns import make_resolver
from bumail_queue.queries import ItemState, state_of
from tests.helpers import running_worker, smarthost, use_queue_backend, wait_until
from tests.servers.dns import DNSZone

pytestmark = pytest.mark.django_db(transaction=True)

ALLOW = ["example.com", "qa+*@example.net"]


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    return request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": "orm"}


def held_items():
    return queue.search(state=ItemState.HELD)


def test_a_worker_delivers_the_allowed_mail_and_the_held_mail_only_once_released(smtp_server, store_settings):
    settings = smarthost(smtp_server, POLL_SECONDS=0.2, ALLOW_RECIPIENTS=ALLOW, **store_settings)
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend():
        send_mail("Order 1", "Thanks.", "shop@example.com", ["ann@example.com", "real.customer@gmail.test"])
        send_mail("Order 2", "Thanks.", "shop@example.com", ["someone@elsewhere.test"])
        (first_held, second_held) = sorted(held_items(), key=lambda item: item.recipients[0].address)
        with running_worker(settings) as (_worker, _lines):
            assert wait_until(lambda: len(smtp_server.messages) == 1), "the allowed mail was not delivered"
            assert wait_until(lambda: queue.count() == 2), "the allowed item was not recorded as delivered"
            assert [m.rcpt_tos for m in smtp_server.messages] == [["ann@example.com"]]
            assert {item.id for item in held_items()} == {first_held.id, second_held.id}
            out = StringIO()
            call_command("queue_release", "--recipient", "*@gmail.test", stdout=out)
            assert out.getvalue().startswith("1 item released.")
            assert wait_until(lambda: len(smtp_server.messages) == 2), "the released mail was not delivered"
            assert wait_until(lambda: queue.count() == 1), "the released item was not recorded as delivered"
        assert smtp_server.messages[1].rcpt_tos == ["real.customer@gmail.test"]
        assert b"Subject: Order 1" in smtp_server.messages[1].data
        (still_held,) = held_items()
        assert still_held.id == second_held.id
        assert state_of(queue.get(second_held.id), timezone.now()) == ItemState.HELD
    delivered = {address for m in smtp_server.messages for address in m.rcpt_tos}
    assert "someone@elsewhere.test" not in delivered


def test_redirect_delivers_to_redirect_to_with_the_original_recipients_named(smtp_server, store_settings):
    settings = smarthost(smtp_server, ALLOW_RECIPIENTS=ALLOW, REDIRECT_TO="staging-inbox@example.com", **store_settings)
    originals = ["cust1@gmail.test", "cust2@yahoo.test", "qa@example.net"]
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend():
        message = EmailMessage("Your invoice", "Attached.", "billing@example.com", ["qa+7@example.net", *originals])
        message.bcc = ["auditor@partner.test"]
        assert message.send() == 1
        stats = queue.deliver_due()
    assert (stats.items, stats.delivered) == (2, 2)
    assert queue.count() == 0
    by_recipient = {tuple(m.rcpt_tos): m for m in smtp_server.messages}
    assert set(by_recipient) == {("qa+7@example.net",), ("staging-inbox@example.com",)}
    redirected = email.message_from_bytes(by_recipient[("staging-inbox@example.com",)].data, policy=email.policy.SMTP)
    named = [a.strip() for a in str(redirected["X-Bumail-Original-Recipients"]).split(",")]
    assert named == [*originals, "auditor@partner.test"]
    assert redirected["Subject"] == "Your invoice"
    allowed = by_recipient[("qa+7@example.net",)].data
    assert b"X-Bumail-Original-Recipients" not in allowed and b"auditor@partner.test" not in allowed
    delivered = {address for m in smtp_server.messages for address in m.rcpt_tos}
    assert delivered.isdisjoint([*originals, "auditor@partner.test"])


def test_a_redirected_message_is_dkim_signed_with_its_field_in_place(smtp_server, dkim_keys, dns_server):
    signer = DKIMSigner(domain="example.com", selector="rsa1", key=dkim_keys.rsa_pem, algorithm="rsa-sha256")
    dns_server.zone = DNSZone({"rsa1._domainkey.example.com": {"TXT": [public_key_record(load_key(signer))]}})
    settings = smarthost(
        smtp_server,
        ALLOW_RECIPIENTS=[],
        REDIRECT_TO="staging-inbox@example.com",
        DKIM=[{"DOMAIN": signer.domain, "SELECTOR": signer.selector, "KEY": signer.key}],
    )
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend():
        send_mail("Signed", "Hello.", "app@example.com", ["cust@gmail.test"])
        queue.deliver_due()
    (received,) = smtp_server.messages
    assert received.rcpt_tos == ["staging-inbox@example.com"]
    assert received.data.startswith(b"DKIM-Signature:")
    assert b"\r\nX-Bumail-Original-Recipients: cust@gmail.test\r\n" in received.data
    resolver = make_resolver(dns_server.nameservers)

    def lookup(name, timeout=5):
        try:
            answer = resolver.resolve(name.decode().rstrip("."), "TXT", lifetime=timeout)
        except dns.exception.DNSException:
            return b""
        return b"".join(b"".join(record.strings) for record in answer)

    assert dkim.DKIM(received.data).verify(dnsfunc=lookup)
