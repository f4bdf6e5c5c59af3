"""A queued message read back as a Django ``EmailMessage`` for a backend route: the
fields an ESP's API takes are the ones the sender gave."""

from __future__ import annotations

from django.core.mail import EmailMultiAlternatives

from bumail_queue.delivery.backend.message import QueuedMessage
from tests.helpers import as_wire_bytes


def queued(**headers):
    sent = EmailMultiAlternatives(
        "Prüfung: the subject",
        "Plain body\n",
        "Sender <app@example.com>",
        ["Ann <ann@example.org>"],
        cc=["cc@example.org"],
        headers=headers,
    )
    sent.attach_alternative("<p>HTML body</p>", "text/html")
    raw = as_wire_bytes(sent.message())
    return QueuedMessage(raw, sender="app@example.com", recipients=["ann@example.org", "cc@example.org", "b@x.org"])


def test_the_fields_come_back_as_given():
    message = queued()
    assert message.subject == "Prüfung: the subject"
    assert message.from_email == "Sender <app@example.com>"
    assert (message.to, message.cc, message.bcc) == (["Ann <ann@example.org>"], ["cc@example.org"], ["b@x.org"])
    assert message.body == "Plain body\n"
    assert message.alternatives[0][0] == "<p>HTML body</p>"


def test_extra_header_fields_come_back_unfolded_and_decoded():
    long_value = " ".join(f"word{n}" for n in range(40))  # folded on the wire
    message = queued(**{"X-Long": long_value, "X-Umlaut": "Grüße aus Köln", "List-Unsubscribe": "<https://e.x/u>"})
    headers = message.extra_headers
    assert headers["X-Long"] == long_value
    assert headers["X-Umlaut"] == "Grüße aus Köln"  # sent as encoded words, given back as text
    assert headers["List-Unsubscribe"] == "<https://e.x/u>"
    assert headers["Message-ID"].startswith("<") and "Date" in headers
    assert not {"Subject", "From", "To", "Cc", "Content-Type", "MIME-Version"} & set(headers)
