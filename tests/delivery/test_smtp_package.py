"""The SMTP client's package: its public names, and one logger for all its steps."""

from __future__ import annotations

import logging

import pytest

import bumail_queue.delivery.smtp as smtp
from bumail_queue.conf import Route
from bumail_queue.items import RecipientStatus
from tests.helpers import envelope, mx, timeouts
from tests.servers.smtp import SMTPTestServer


def test_the_public_names_are_importable_from_the_package() -> None:
    for name in smtp.__all__:
        assert getattr(smtp, name) is not None, name
    assert smtp.SMTPTransport.__module__.startswith("bumail_queue.delivery.smtp.")
    assert smtp.RouteOptionError("The route is refused.").code == "INVALID_OPTION"


def test_every_smtp_step_logs_on_the_packages_logger(
    smtp_server: SMTPTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="bumail_queue")
    transport = smtp.SMTPTransport(hostname="client.example.com", timeouts=timeouts(), reuse_seconds=0)
    try:
        delivery = transport.deliver(envelope(), route=Route(type="mx"), hosts=[mx(smtp_server)])
    finally:
        transport.close()
    assert delivery.outcomes["ann@example.org"].status is RecipientStatus.DELIVERED
    names = {r.name for r in caplog.records if r.name.startswith("bumail_queue.delivery")}
    assert names == {"bumail_queue.delivery.smtp"}
    assert any("greeting -> 220" in r.getMessage() for r in caplog.records)
