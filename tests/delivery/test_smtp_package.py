"""The SMTP client's package: its public names, and one logger for all its steps."""

from __future__ import annotations

import logging

import pytest

import bumail_queue.delivery.smtp as smtp
from bumail_queue.conf import Route, Timeouts
from bumail_queue.delivery.envelope import Envelope, Host
from bumail_queue.items import RecipientStatus
from tests.servers.smtp import SMTPTestServer

MESSAGE = b"From: sender@example.com\r\nTo: ann@example.org\r\nSubject: Hello\r\n\r\nHello.\r\n"
STEPS = {"connect": 5, "greeting": 5, "mail": 5, "rcpt": 5, "data": 5, "data_block": 5, "data_end": 5, "session": 60}


def test_the_public_names_are_importable_from_the_package() -> None:
    for name in smtp.__all__:
        assert getattr(smtp, name) is not None, name
    assert smtp.SMTPTransport.__module__.startswith("bumail_queue.delivery.smtp.")
    assert smtp.RouteOptionError("The route is refused.").code == "INVALID_OPTION"


def test_every_smtp_step_logs_on_the_packages_logger(
    smtp_server: SMTPTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="bumail_queue")
    transport = smtp.SMTPTransport(hostname="client.example.com", timeouts=Timeouts(**STEPS), reuse_seconds=0)
    try:
        delivery = transport.deliver(
            Envelope(item_id="item-1", sender="sender@example.com", recipients=("ann@example.org",), message=MESSAGE),
            route=Route(type="mx"),
            hosts=[Host(name="mx.test", address="127.0.0.1", port=smtp_server.port)],
        )
    finally:
        transport.close()
    assert delivery.outcomes["ann@example.org"].status is RecipientStatus.DELIVERED
    names = {r.name for r in caplog.records if r.name.startswith("bumail_queue.delivery")}
    assert names == {"bumail_queue.delivery.smtp"}
    assert any("greeting -> 220" in r.getMessage() for r in caplog.records)
