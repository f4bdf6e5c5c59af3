"""The suppression list's rules: which replies suppress, what a batch of outcomes changes,
the reply of a suppressed recipient, and the form addresses are compared in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bumail_queue.addresses import normal_address
from bumail_queue.items import Outcome, RecipientStatus, Reply
from bumail_queue.suppression import (
    Suppression,
    SuppressionReason,
    change_from,
    search_form,
    suppressed_reply,
    suppresses,
)

T0 = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
DAYS_30 = timedelta(days=30)


def failed(code, status, text="Refused"):
    return Outcome(status=RecipientStatus.FAILED, reply=Reply(code=code, status=status, text=text))


DELIVERED = Outcome(status=RecipientStatus.DELIVERED, reply=Reply(code=250, status="2.0.0", text="OK"))
DEFERRED = Outcome(status=RecipientStatus.DEFERRED, reply=Reply(code=451, status="4.3.0", text="Later"))
EXPIRED = failed(451, "4.4.7", "Delivery time expired after 5 days; last reply: 451 4.3.0 Later")


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (550, "5.1.1"),  # no such mailbox
        (550, "5.1.2"),  # no such domain
        (553, "5.1.3"),  # the address is not an address
        (550, "5.1.6"),  # moved, no forwarding address
        (556, "5.1.10"),  # null MX
        (550, "5.2.1"),  # disabled for good
        (550, "5.7.17"),  # RRVS: the mailbox's owner changed
        (550, "5.7.18"),  # RRVS: the domain's owner changed
        (None, "5.1.2"),  # our DNS: NXDOMAIN, or no mail host
        (None, "5.1.10"),  # our DNS: a null MX
    ],
)
def test_a_failure_that_says_the_mailbox_or_domain_does_not_exist_suppresses(code, status):
    assert suppresses(Reply(code=code, status=status, text="..."))


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (550, "5.7.1"),  # a policy block of our mail: the recipient is not to blame
        (554, "5.7.26"),  # unauthenticated mail (DMARC)
        (550, "5.0.0"),  # says nothing
        (550, "5.1.0"),  # vague
        (550, ""),  # no enhanced status: a policy block as likely as an unknown user
        (552, "5.2.2"),  # mailbox full
        (554, "5.4.4"),  # unroutable: a configuration that may be fixed in the hour
        (None, "5.1.3"),  # ours: smtplib could not write the address to this server
        (None, "5.1.1"),  # no server said so
        (451, "4.1.1"),  # temporary
        (421, "4.4.7"),
    ],
)
def test_other_failures_do_not_suppress(code, status):
    assert not suppresses(Reply(code=code, status=status, text="..."))


def test_a_suppressing_failure_puts_its_address_on_for_the_duration_in_its_normal_form():
    change = change_from(
        [("Ann@Bücher.example", failed(550, "5.1.1"), False), ("bob@example.org", DELIVERED, False)],
        now=T0,
        duration=DAYS_30,
        expiry_window=DAYS_30,
    )

    [entry] = change.add
    assert entry == Suppression(
        address="Ann@xn--bcher-kva.example",
        reason=SuppressionReason.FAILED,
        reply=Reply(code=550, status="5.1.1", text="Refused"),
        created_at=T0,
        expires_at=T0 + DAYS_30,
    )
    assert change.clear == ("bob@example.org",)
    assert change.expired == ()


def test_a_deferral_and_a_policy_failure_change_nothing_but_deliveries_clear():
    change = change_from(
        [("a@example.org", DEFERRED, False), ("b@example.org", failed(550, "5.7.1"), False)],
        now=T0,
        duration=DAYS_30,
        expiry_window=DAYS_30,
    )

    assert not change


def test_an_expiry_is_noted_until_the_window_ends_and_two_in_one_batch_suppress():
    change = change_from(
        [
            ("once@example.org", EXPIRED, True),
            ("twice@example.org", EXPIRED, True),
            ("twice@example.org", EXPIRED, True),
        ],
        now=T0,
        duration=DAYS_30,
        expiry_window=timedelta(days=7),
    )

    assert [(e.address, e.reason, e.reply.status) for e in change.add] == [
        ("twice@example.org", SuppressionReason.EXPIRED, "4.4.7")
    ]
    assert [(e.address, e.expires_at) for e in change.expired] == [("once@example.org", T0 + DAYS_30)]
    assert change.note_until == T0 + timedelta(days=7)


def test_without_a_window_an_expiry_changes_nothing():
    change = change_from([("a@example.org", EXPIRED, True)], now=T0, duration=DAYS_30, expiry_window=None)

    assert not change


def test_a_delivery_outweighs_a_failure_and_an_expiry_of_the_same_batch():
    change = change_from(
        [
            ("a@example.org", failed(550, "5.1.1"), False),
            ("a@example.org", DELIVERED, False),
            ("b@example.org", EXPIRED, True),
            ("b@EXAMPLE.org", DELIVERED, False),
        ],
        now=T0,
        duration=DAYS_30,
        expiry_window=DAYS_30,
    )

    assert (change.add, change.expired, change.clear) == ((), (), ("a@example.org", "b@example.org"))


@pytest.mark.parametrize(
    ("reason", "reply", "said"),
    [
        (
            SuppressionReason.FAILED,
            Reply(code=550, status="5.1.1", text="5.1.1 <gone@example.org>: No such user"),
            "an earlier delivery failed with 550 5.1.1 <gone@example.org>: No such user",
        ),
        (
            SuppressionReason.EXPIRED,
            Reply(code=451, status="4.4.7", text="Delivery time expired after 5 days"),
            "its delivery time expired twice; the last time: 451 4.4.7 Delivery time expired after 5 days",
        ),
        (
            SuppressionReason.MANUAL,
            Reply(code=None, status="", text="asked to stop"),
            "added by an operator (asked to stop)",
        ),
        (SuppressionReason.MANUAL, Reply(code=None, status="", text=""), "added by an operator"),
    ],
)
def test_a_suppressed_recipients_reply_says_suppressed_until_when_and_why(reason, reply, said):
    entry = Suppression(address="gone@example.org", reason=reason, reply=reply, created_at=T0, expires_at=T0 + DAYS_30)

    got = suppressed_reply(entry)

    # No server gave it; RFC 3463's X.7.1, the per-recipient filtering it is.
    assert (got.code, got.status) == (None, "5.7.1")
    assert got.text == f"Recipient address suppressed until 2026-06-03 09:30 UTC: {said}"


def test_a_reply_with_a_long_cause_is_cut_to_what_a_store_keeps():
    entry = Suppression(
        address="gone@example.org",
        reason=SuppressionReason.FAILED,
        reply=Reply(code=550, status="5.1.1", text="x" * 2000),
        created_at=T0,
        expires_at=T0 + DAYS_30,
    )

    assert len(suppressed_reply(entry).text) == 512


@pytest.mark.parametrize(
    ("address", "normal"),
    [
        ("ann@example.org", "ann@example.org"),
        ("Ann@EXAMPLE.org", "Ann@example.org"),  # RFC 5321 §2.4: the local part as written
        ("ann@example.org.", "ann@example.org"),
        ("ann@Bücher.example", "ann@xn--bcher-kva.example"),
        ("ann@XN--BCHER-KVA.example", "ann@xn--bcher-kva.example"),
        ("jörg@straße.example", "jörg@xn--strae-oqa.example"),  # IDNA2008, not 2003's strasse
        ('"a b"@example.org', '"a b"@example.org'),
        ("ann@[IPv6:2001:db8::1]", "ann@[ipv6:2001:db8::1]"),
    ],
)
def test_addresses_are_compared_with_their_domain_in_lowercase_a_labels(address, normal):
    assert normal_address(address) == normal


@pytest.mark.parametrize(
    ("text", "form"),
    [
        ("ANN@", "ann@"),
        ("Bücher", "xn--bcher-kva"),
        ("ann@BÜCHER.example", "ann@xn--bcher-kva.example"),
        ("Jörg@", "jörg@"),  # ASCII case only: what every store's query can do
    ],
)
def test_a_search_text_is_put_in_the_form_addresses_are_kept(text, form):
    assert search_form(text) == form
