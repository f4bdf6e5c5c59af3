"""DSNs as the sender's server receives them, on every store: sent by the worker after
real SMTP sessions on loopback, parsed back with ``email`` and with ``flufl.bounce``.
"""

from __future__ import annotations

import email
import email.message
import email.policy
from datetime import UTC, datetime, timedelta

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings
from flufl.bounce import all_failures

from bumail_queue.service import QueueService
from tests.helpers import smarthost
from tests.servers.dns import DNSZone

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
MESSAGE_ID = "<quarterly-1@app.example.com>"
SUBJECT = "Quarterly numbers"
BODY = "The figures, never returned in a report."
#: MAX_AGE short enough to reach in two attempts; no delay DSN before it.
EXPIRY = {"MAX_AGE": timedelta(days=1), "DELAY_WARNING": timedelta(days=2), "RETRY_JITTER": 0}


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    """The ``BUMAIL_QUEUE`` keys of each store."""
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


def send(recipients, *, sender="app@sender.test"):
    service = QueueService(clock=lambda: T0)
    message = EmailMessage(SUBJECT, BODY, sender, recipients, headers={"Message-ID": MESSAGE_ID})
    return service.enqueue(message)


def deliver_at(now):
    return QueueService(clock=lambda: now).deliver_due(now=now)


def received_dsn(server, *, to="app@sender.test") -> tuple[email.message.EmailMessage, bytes]:
    """The one report the server received from the null sender, parsed, and its bytes."""
    [report] = [m for m in server.messages if m.mail_from == ""]
    assert report.rcpt_tos == [to]
    parsed = email.message_from_bytes(report.data, policy=email.policy.default)
    assert isinstance(parsed, email.message.EmailMessage)
    return parsed, report.data


def parts(report):
    return list(report.iter_parts())


def recipient_block(report) -> dict[str, str]:
    _, block = parts(report)[1].get_payload()
    return {name: str(value) for name, value in block.items()}


def assert_returns_the_original_headers(report, data):
    assert [p.get_content_type() for p in parts(report)] == [
        "text/plain",
        "message/delivery-status",
        "text/rfc822-headers",
    ]
    returned = email.message_from_string(parts(report)[2].get_content() + "\n", policy=email.policy.default)
    assert (returned["Message-ID"], returned["Subject"]) == (MESSAGE_ID, SUBJECT)
    assert BODY.encode() not in data
    assert "could not read" not in parts(report)[0].get_content()


def test_a_bounce_returns_the_original_headers_and_the_servers_reply(smtp_servers, store_settings):
    server = smtp_servers(rcpt_replies={"gone@example.org": "550 5.1.1 <gone@example.org>: No such user"})
    with override_settings(BUMAIL_QUEUE=smarthost(server, **store_settings)):
        send(["gone@example.org"])
        stats = deliver_at(T0)
    assert stats.failed == 1
    report, data = received_dsn(server)

    assert_returns_the_original_headers(report, data)
    block = recipient_block(report)
    assert (block["Action"], block["Status"]) == ("failed", "5.1.1")
    assert block["Diagnostic-Code"] == "smtp; 550 5.1.1 <gone@example.org>: No such user"
    temporary, permanent = all_failures(report)
    assert (set(temporary), set(permanent)) == (set(), {b"gone@example.org"})


def test_a_recipient_deferred_until_max_age_is_reported_with_the_last_reply_it_had(smtp_servers, store_settings):
    server = smtp_servers(rcpt_replies={"later@example.org": "451 4.3.0 Mailbox busy, try later"})
    with override_settings(BUMAIL_QUEUE=smarthost(server, **store_settings, **EXPIRY)):
        item = send(["ok@example.org", "later@example.org"])
        assert deliver_at(T0).deferred == 1
        assert [m for m in server.messages if m.mail_from == ""] == []
        stats = deliver_at(T0 + timedelta(days=1))
        assert QueueService().get(item.id) is None
    assert stats.failed == 1
    report, data = received_dsn(server)

    block = recipient_block(report)
    assert block["Final-Recipient"] == "rfc822; later@example.org"
    # RFC 3463's 4.4.7 in Status; RFC 3464 §2.3.6: the remote's own reply, as sent.
    assert (block["Action"], block["Status"]) == ("failed", "4.4.7")
    assert block["Diagnostic-Code"] == "smtp; 451 4.3.0 Mailbox busy, try later"
    text = " ".join(parts(report)[0].get_content().split())
    assert "Delivery time expired after 1 day. The server 127.0.0.1 replied: 451 4.3.0 Mailbox busy" in text
    temporary, permanent = all_failures(report)  # Action: failed, whatever the status's class
    assert (set(temporary), set(permanent)) == (set(), {b"later@example.org"})
    assert_returns_the_original_headers(report, data)


def test_an_expiry_where_no_server_answered_has_no_diagnostic_code(smtp_servers, dns_server, store_settings):
    server = smtp_servers()
    dns_server.zone = DNSZone({
        "down.test": "SERVFAIL",
        "sender.test": {"MX": [(10, "mx.sender.test")]},
        "mx.sender.test": {"A": ["127.0.0.1"]},
    })  # fmt: skip
    settings = {"HOSTNAME": "mta.example.com", **dns_server.queue_settings(server.port), **store_settings, **EXPIRY}
    with override_settings(BUMAIL_QUEUE=settings):
        send(["ann@down.test"])
        deliver_at(T0)
        deliver_at(T0 + timedelta(days=1))
    report, data = received_dsn(server)

    block = recipient_block(report)
    assert (block["Action"], block["Status"]) == ("failed", "4.4.7")
    # RFC 3464 §2.3.6: the field is the remote MTA's; none answered, so there is none.
    assert "Diagnostic-Code" not in block
    assert "Remote-MTA" not in block
    text = " ".join(parts(report)[0].get_content().split())
    assert "Delivery time expired after 1 day. No server answered (status 4.4.7)" in text
    assert all_failures(report)[1] == {b"ann@down.test"}
    assert_returns_the_original_headers(report, data)
