"""VERP return paths (``RETURN_PATH``): the tokens, the settings, and what a receiving
server sees, on every store: a transaction a recipient, each from an address that names
its item and recipient."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings

from bumail_queue.conf import validate
from bumail_queue.service import QueueService
from bumail_queue.verp import read_return_path, return_path
from tests.helpers import smarthost

TEMPLATE = "bounces+{token}@example.com"
ITEM = str(uuid.UUID("0c9b6c36-8d2f-4b4e-9f5e-2a7d2f1c3b4a"))
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def test_a_return_path_names_its_item_and_is_signed_for_its_recipient():
    sender = return_path(TEMPLATE, ITEM, "ann@example.org")
    assert sender is not None
    local, _, domain = sender.rpartition("@")
    assert domain == "example.com" and local.startswith("bounces+") and len(local) <= 64
    assert local == local.lower()  # lowercase: some MTAs change a local part's case
    returned = read_return_path(TEMPLATE, sender)
    assert returned is not None and returned.item_id == ITEM
    assert returned.names("ann@example.org")
    assert returned.names("ann@EXAMPLE.org")  # the domain in its normal form
    assert not returned.names("bob@example.org")
    assert return_path(TEMPLATE, ITEM, "bob@example.org") != sender  # each recipient its own


def test_a_return_path_read_back_in_another_case_or_in_brackets_still_names_its_recipient():
    sender = return_path(TEMPLATE, ITEM, "ann@example.org")
    for seen in (sender.upper(), f"<{sender}>"):
        returned = read_return_path(TEMPLATE, seen)
        assert returned is not None and returned.names("ann@example.org")


@pytest.mark.parametrize(
    "tamper",
    [
        lambda s: s.replace("@example.com", "@example.net"),  # another domain
        lambda s: s.replace("bounces+", "returns+"),  # another template
        lambda s: s[: s.index(".") - 1] + ("b" if s[s.index(".") - 1] != "b" else "c") + s[s.index(".") :],  # item
        lambda s: s.replace("bounces+", "bounces+x"),  # a token of the wrong length
    ],
)
def test_an_altered_return_path_names_nobody(tamper):
    sender = return_path(TEMPLATE, ITEM, "ann@example.org")
    returned = read_return_path(TEMPLATE, tamper(sender))
    assert returned is None or not returned.names("ann@example.org")


def test_a_forged_signature_names_nobody():
    sender = return_path(TEMPLATE, ITEM, "ann@example.org")
    local, _, domain = sender.rpartition("@")
    forged = f"{local[:-16]}{'a' * 16}@{domain}"
    returned = read_return_path(TEMPLATE, forged)
    assert returned is not None and not returned.names("ann@example.org")


def test_a_return_path_made_before_the_key_was_rotated_still_names_its_recipient(settings):
    settings.SECRET_KEY = "tests-only-not-a-secret-old"
    sender = return_path(TEMPLATE, ITEM, "ann@example.org")
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "tests-only-not-a-secret-new", [settings.SECRET_KEY]
    assert read_return_path(TEMPLATE, sender).names("ann@example.org")
    settings.SECRET_KEY_FALLBACKS = []
    assert not read_return_path(TEMPLATE, sender).names("ann@example.org")


def test_an_item_id_that_is_no_uuid_has_no_return_path():
    assert return_path(TEMPLATE, "item-1", "ann@example.org") is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("bounces@example.com", "with {token} once in its local part"),
        ("b+{token}+{token}@example.com", "with {token} once in its local part"),
        ("bounces@{token}.example.com", "must be an address with {token} in its local part"),
        ("bounces+{token}@", "the domain after the @ is empty"),
        ("a-very-long-prefix-for-the-bounces+{token}@example.com", "would be 78 octets with its token"),
        (["bounces+{token}@example.com"], "with {token} once in its local part"),
    ],
)
def test_a_wrong_return_path_is_e032_saying_what_is_wrong(value, says):
    problems = validate({"RETURN_PATH": value})
    assert [p.id for p in problems] == ["bumail_queue.E032"]
    assert says in problems[0].message


# -- what the receiving server sees -----------------------------------------------------


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


@pytest.mark.django_db(transaction=True)
def test_each_recipient_gets_a_transaction_from_a_return_path_naming_it(smtp_servers, store_settings):
    server = smtp_servers(rcpt_replies={"gone@example.org": "550 5.1.1 <gone@example.org>: No such user"})
    recipients = ["ann@example.org", "bob@example.org", "gone@example.org", "cy@example.net"]
    with override_settings(BUMAIL_QUEUE=smarthost(server, RETURN_PATH=TEMPLATE, **store_settings)):
        service = QueueService(clock=lambda: T0)
        item = service.enqueue(EmailMessage("Hi", "Body", "app@sender.test", recipients))
        stats = service.deliver_due(now=T0)
    assert stats.failed == 1  # (delivered counts the report to the sender too)
    sent = [m for m in server.messages if m.mail_from != ""]
    assert sorted(rcpt for m in sent for rcpt in m.rcpt_tos) == sorted(r for r in recipients if r != "gone@example.org")
    for message in sent:
        (rcpt,) = message.rcpt_tos  # one recipient a transaction
        returned = read_return_path(TEMPLATE, message.mail_from)
        assert returned is not None and returned.item_id == item.id and returned.names(rcpt)
    assert len({m.mail_from for m in sent}) == 3
    # The queue's own report goes from the null sender to the item's sender, as always.
    (report,) = [m for m in server.messages if m.mail_from == ""]
    assert report.rcpt_tos == ["app@sender.test"]


@pytest.mark.django_db(transaction=True)
def test_without_a_return_path_the_recipients_of_a_destination_share_one_transaction(smtp_server):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, STORE="memory")):
        service = QueueService(clock=lambda: T0)
        service.enqueue(EmailMessage("Hi", "Body", "app@sender.test", ["ann@example.org", "bob@example.org"]))
        service.deliver_due(now=T0)
    [message] = smtp_server.messages
    assert (message.mail_from, sorted(message.rcpt_tos)) == ("app@sender.test", ["ann@example.org", "bob@example.org"])


@pytest.mark.django_db(transaction=True)
def test_followers_on_one_connection_each_keep_their_own_return_path(smtp_server):
    # One session at a time: each item after the first follows on its predecessor's
    # connection (its commands sent with the final dot), but one of two recipients.
    settings = smarthost(smtp_server, STORE="memory", RETURN_PATH=TEMPLATE, CONCURRENCY=1, DOMAIN_CONCURRENCY=1)
    with override_settings(BUMAIL_QUEUE=settings):
        service = QueueService(clock=lambda: T0)
        items = [
            service.enqueue(EmailMessage("Hi", "Body", "app@sender.test", [f"u{n}@example.org"])) for n in range(5)
        ]
        pair = service.enqueue(EmailMessage("Hi", "Body", "app@sender.test", ["p1@example.org", "p2@example.org"]))
        stats = service.deliver_due(now=T0)
    assert stats.delivered == 7
    by_recipient = {m.rcpt_tos[0]: m for m in smtp_server.messages if len(m.rcpt_tos) == 1}
    assert len(by_recipient) == len(smtp_server.messages) == 7
    owners = {**{f"u{n}@example.org": item.id for n, item in enumerate(items)}, "p1@example.org": pair.id}
    owners["p2@example.org"] = pair.id
    for rcpt, message in by_recipient.items():
        returned = read_return_path(TEMPLATE, message.mail_from)
        assert returned.item_id == owners[rcpt] and returned.names(rcpt)
    assert len({m.connection for m in smtp_server.messages}) < 7  # connections were kept and followed on
