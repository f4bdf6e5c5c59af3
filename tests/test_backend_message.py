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
    # Django 6 writes a text part with a final line end; 5.2 without.
    assert message.alternatives[0][0].rstrip("\n") == "<p>HTML body</p>"


def test_extra_header_fields_come_back_unfolded_and_decoded():
    long_value = " ".join(f"word{n}" for n in range(40))  # folded on the wire
    message = queued(**{"X-Long": long_value, "X-Umlaut": "Grüße aus Köln", "List-Unsubscribe": "<https://e.x/u>"})
    headers = message.extra_headers
    assert headers["X-Long"] == long_value
    assert headers["X-Umlaut"] == "Grüße aus Köln"  # sent as encoded words, given back as text
    assert headers["List-Unsubscribe"] == "<https://e.x/u>"
    assert headers["Message-ID"].startswith("<") and "Date" in headers
    assert not {"Subject", "From", "To", "Cc", "Content-Type", "MIME-Version"} & set(headers)


def raw_message(headers: str) -> bytes:
    return (headers.strip().replace("\n", "\r\n") + "\r\nContent-Type: text/plain\r\n\r\nBody\r\n").encode()


def test_addresses_come_back_with_their_display_names_however_written():
    raw = raw_message(
        """
From: =?utf-8?q?J=C3=B6rg?= <app@example.com>
To: "Doe, Ann" <ann@example.org>, bob@example.org,
 =?utf-8?b?R3LDvMOfZQ==?= <cy@example.org>
Cc: team: dee@example.org, eve@example.org;
Reply-To: Help Desk <help@example.com>
Subject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=
"""
    )
    everyone = ["ann@example.org", "bob@example.org", "cy@example.org", "dee@example.org", "eve@example.org"]
    message = QueuedMessage(raw, sender="app@example.com", recipients=everyone)
    assert message.to == ['"Doe, Ann" <ann@example.org>', "bob@example.org", "Grüße <cy@example.org>"]
    assert message.cc == ["dee@example.org", "eve@example.org"]  # a group's members
    assert message.bcc == []
    assert (message.from_email, message.subject) == ("Jörg <app@example.com>", "Grüße")
    assert message.reply_to == ["Help Desk <help@example.com>"]
    assert not hasattr(message, "envelope_sender")  # the sender is the From address


def test_a_recipient_not_in_to_or_cc_goes_as_bcc_and_a_return_path_as_the_envelope_sender():
    raw = raw_message("From: app@example.com\nTo: ann@example.org\nSubject: hi")
    message = QueuedMessage(raw, sender="bounces@example.com", recipients=["ann@example.org", "hidden@example.org"])
    assert (message.to, message.bcc) == (["ann@example.org"], ["hidden@example.org"])
    assert message.envelope_sender == "bounces@example.com"
