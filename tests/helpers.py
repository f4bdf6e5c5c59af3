"""Helpers shared by the tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import django.core.mail
from django.test import override_settings

from bumail_queue.delivery.envelope import Delivery
from bumail_queue.items import Outcome, RecipientStatus, Reply

BACKEND = "bumail_queue.backends.QueueEmailBackend"


def use_queue_backend() -> override_settings:
    """Make Django's mail API use the queue again (the test runner swaps in locmem).

    Django 6.1 reads ``MAILERS``; older versions read ``EMAIL_BACKEND``.
    """
    if hasattr(django.core.mail, "mailers"):
        return override_settings(MAILERS={"default": {"BACKEND": BACKEND}})
    return override_settings(EMAIL_BACKEND=BACKEND)


def wait_until(predicate: Callable[[], object], seconds: float = 20) -> bool:
    """Wait for ``predicate()`` to hold, up to a bound generous enough for a busy machine.

    Returns whether it held; tests assert on that, never on how long it took.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


class ScriptedTransport:
    """A worker's transport that answers each recipient from ``replies`` (address ->
    ``Reply``) and ``default`` for the rest, as ``remote_host``; it records each envelope."""

    def __init__(self, replies=None, *, on_deliver=None, default=None, remote_host="relay.example.net"):
        self.replies = replies or {}
        self.default = default or Reply(code=250, status="2.0.0", text="OK queued")
        self.remote_host = remote_host
        self.envelopes = []
        self.on_deliver = on_deliver
        self.lock = threading.Lock()

    def deliver(self, envelope, *, route, hosts):
        with self.lock:
            self.envelopes.append((envelope, route, tuple(hosts)))
        if self.on_deliver:
            self.on_deliver(envelope)
        outcomes = {}
        for address in envelope.recipients:
            reply = self.replies.get(address, self.default)
            status = {2: RecipientStatus.DELIVERED, 4: RecipientStatus.DEFERRED, 5: RecipientStatus.FAILED}[reply.code // 100]
            outcomes[address] = Outcome(status=status, reply=reply)
        return Delivery(outcomes=outcomes, remote_host=self.remote_host)

    def close_idle(self):
        pass

    def close(self):
        pass
