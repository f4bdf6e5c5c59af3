"""Fixtures of the SMTP client's tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bumail_queue.delivery.smtp import SMTPTransport
from tests.helpers import timeouts
from tests.servers.hostile_smtp import hostile_smtp  # noqa: F401 - the fixture, for this directory's tests
from tests.servers.smtp import TestTLS


@pytest.fixture
def transports(smtp_tls: TestTLS) -> Iterator[Callable[..., SMTPTransport]]:
    """Make ``SMTPTransport``s trusting the test CA, with ``timeouts()`` unless told;
    each is closed at the end of the test."""
    made: list[SMTPTransport] = []

    def make(**options: Any) -> SMTPTransport:
        options.setdefault("hostname", "client.example.com")
        options.setdefault("timeouts", timeouts())
        options.setdefault("reuse_seconds", 10)
        options.setdefault("ssl_context", smtp_tls.client_context)
        made.append(SMTPTransport(**options))
        return made[-1]

    yield make
    for transport in made:
        transport.close()


@pytest.fixture
def transport(transports: Callable[..., SMTPTransport]) -> SMTPTransport:
    """An ``SMTPTransport`` made by ``transports()`` with its defaults."""
    return transports()
