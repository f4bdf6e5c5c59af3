"""Mail to a domain whose MX hosts do not exist, through the worker, with real DNS and
SMTP servers on loopback: it fails at once with ``5.4.4`` and a DSN, as Postfix does,
rather than being deferred and retried until ``MAX_AGE``."""

from __future__ import annotations

import email
import email.message
import email.policy

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings

from bumail_queue import queue
from tests.servers.dns import DNSZone, LoopbackDNSServer
from tests.servers.smtp import SMTPTestServer

pytestmark = pytest.mark.django_db(transaction=True)


def test_mail_to_a_domain_whose_only_mx_host_does_not_exist_fails_with_a_544_dsn(
    smtp_server: SMTPTestServer, dns_server: LoopbackDNSServer
) -> None:
    dns_server.zone = DNSZone({
        # The domain's own address is the SMTP server: were it used as an implicit MX, mail would arrive.
        "gone.test": {"MX": [(10, "mx.gone.test")], "A": ["127.0.0.1"]},
        "sender.test": {"MX": [(10, "mx.sender.test")]},
        "mx.sender.test": {"A": ["127.0.0.1"]},
    })  # fmt: skip
    settings = {"HOSTNAME": "mta.example.com", **dns_server.queue_settings(smtp_server.port)}
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue(EmailMessage("Hi", "Body", "me@sender.test", ["ann@gone.test"]))
        stats = queue.deliver_due()
        assert queue.count() == 0
    assert (stats.failed, stats.deferred, stats.delivered) == (1, 0, 1)  # the one delivered is the DSN
    assert ("mx.gone.test", "A") in dns_server.queries
    assert ("gone.test", "A") not in dns_server.queries

    [dsn] = smtp_server.messages  # the report only: nothing went to gone.test
    assert (dsn.mail_from, dsn.rcpt_tos) == ("", ["me@sender.test"])
    report = email.message_from_bytes(dsn.data, policy=email.policy.default)
    assert isinstance(report, email.message.EmailMessage)
    human, status, _ = report.iter_parts()
    _, recipient = status.get_payload()
    assert (recipient["Final-Recipient"], recipient["Action"], recipient["Status"]) == (
        "rfc822; ann@gone.test",
        "failed",
        "5.4.4",
    )
    assert "Diagnostic-Code" not in recipient  # no server answered
    text = " ".join(human.get_content().split())
    assert "No MX host of gone.test has an address: mx.gone.test does not exist (NXDOMAIN)." in text
