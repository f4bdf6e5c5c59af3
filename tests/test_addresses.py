"""Envelope addresses: what an SMTP server would take in MAIL FROM and RCPT TO."""

from __future__ import annotations

import pytest

from bumail_queue.addresses import (
    a_labels,
    check_mailbox,
    check_sender,
    domain_of,
    envelope_form,
    mailbox_problem,
    needs_smtputf8,
)
from bumail_queue.errors import ErrorCode, QueueError

# 64 + 1 + 189 = 254 octets: the longest path (256 with the angle brackets).
LONGEST = "l" * 64 + "@" + "a" * 63 + "." + "b" * 63 + "." + "c" * 61

VALID = [
    pytest.param("user@example.org", id="simple"),
    pytest.param("first.last@mail.example.org", id="dots"),
    pytest.param("user+tag@example.org", id="plus-tag"),
    pytest.param("o'brien!#$%&*=?^_`{|}~-/@example.org", id="atext"),
    pytest.param('"john smith"@example.org', id="quoted-space"),
    pytest.param('"a@b"@example.org', id="quoted-at"),
    pytest.param('"say \\"hi\\""@example.org', id="quoted-pair"),
    pytest.param("user@[192.0.2.1]", id="ipv4-literal"),
    pytest.param("user@[IPv6:2001:db8::1]", id="ipv6-literal"),
    pytest.param("user@[ipv6:::ffff:192.0.2.1]", id="ipv6-literal-mapped"),
    pytest.param("jörg@example.org", id="utf8-local"),
    pytest.param("用户@例子.example", id="utf8-both"),
    pytest.param("user@bücher.example", id="idn-domain"),
    pytest.param("user@xn--bcher-kva.example", id="a-label-domain"),
    pytest.param("l" * 64 + "@example.org", id="local-64"),
    pytest.param("ö" * 32 + "@example.org", id="local-64-octets-utf8"),
    pytest.param("user@" + "d" * 63 + ".example", id="label-63"),
    pytest.param("user@a-b.example", id="inner-hyphen"),
    pytest.param(LONGEST, id="path-254"),
    pytest.param("postmaster@localhost", id="one-label"),
    pytest.param("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645@example.org", id="persian-zwnj"),
]

INVALID = [
    pytest.param("userexample.org", "no @", id="no-at"),
    pytest.param("@example.org", "local part before the @ is empty", id="empty-local"),
    pytest.param("user@", "domain after the @ is empty", id="empty-domain"),
    pytest.param("l" * 65 + "@example.org", "longer than 64 octets", id="local-65"),
    pytest.param("ö" * 32 + "l@example.org", "longer than 64 octets", id="local-65-octets-utf8"),
    pytest.param("first..last@example.org", "neither a dot-atom nor a quoted string", id="consecutive-dots"),
    pytest.param(".user@example.org", "neither a dot-atom nor a quoted string", id="leading-dot"),
    pytest.param("user.@example.org", "neither a dot-atom nor a quoted string", id="trailing-dot"),
    pytest.param("user@-example.org", "'-example'", id="label-leading-hyphen"),
    pytest.param("user@example-.org", "'example-'", id="label-trailing-hyphen"),
    pytest.param("user@example..org", "label ''", id="empty-label"),
    pytest.param("user@" + "d" * 64 + ".example", "longer than 63 characters", id="label-64"),
    pytest.param(
        "user@" + "ü" * 60 + ".example", "IDNA2008 refuses the domain (Label too long)", id="idn-label-too-long"
    ),
    # Valid in IDNA2003 (Python's "idna" codec), refused by IDNA2008 (RFC 5892).
    pytest.param("user@☃.example", "IDNA2008 refuses the domain", id="idna2008-symbol"),
    pytest.param("user@⑴.example", "IDNA2008 refuses the domain", id="idna2008-maps-to-non-ldh"),
    pytest.param("user@exa_mple.org", "'exa_mple'", id="underscore"),
    pytest.param(LONGEST + "c", "longer than 254 octets", id="path-255"),
    pytest.param("l" * 64 + "@" + ".".join(["d" * 63] * 4), "longer than 254 octets", id="path-way-over"),
    pytest.param("user\r\n@example.org", "control character", id="crlf-local"),
    pytest.param("user@example.org\r\nRCPT TO:<x@example.net>", "control character", id="crlf-injection"),
    pytest.param("user@exa\nmple.org", "control character", id="lf-domain"),
    pytest.param("us\ter@example.org", "control character", id="tab"),
    pytest.param("us\x7fer@example.org", "control character", id="del"),
    pytest.param("us\x00er@example.org", "NUL", id="nul"),
    pytest.param("\ud800@example.org", "lone surrogate", id="lone-surrogate"),
    pytest.param("a\x85b@example.org", "U+0085, an invisible control or format character", id="c1-nel"),
    pytest.param('"a\u2028b"@example.org', "U+2028", id="line-separator-quoted"),
    pytest.param("admin\u202egro.elpmaxe@example.org", "U+202E", id="bidi-override"),
    pytest.param("user@exa\u200bmple.org", "U+200B", id="zero-width-space-domain"),
    pytest.param("john smith@example.org", "neither a dot-atom nor a quoted string", id="unquoted-space"),
    pytest.param('"unterminated@example.org', "neither a dot-atom nor a quoted string", id="open-quote"),
    pytest.param("a(comment)@example.org", "neither a dot-atom nor a quoted string", id="comment"),
    pytest.param("Jane <jane@example.org>", "neither a dot-atom nor a quoted string", id="display-name"),
    pytest.param("user@[300.1.1.1]", "address literal", id="bad-ipv4-literal"),
    pytest.param("user@[IPv6:2001:db8::zz]", "IPv6 address literal", id="bad-ipv6-literal"),
    pytest.param("user@[IPv6:192.0.2.1]", "IPv6 address literal", id="ipv4-in-ipv6-tag"),
]


@pytest.mark.parametrize("address", VALID)
def test_valid_mailboxes_have_no_problem(address):
    assert mailbox_problem(address) is None
    assert check_mailbox(address, role="recipient") == address


@pytest.mark.parametrize(("address", "reason"), INVALID)
def test_invalid_mailboxes_say_what_is_wrong(address, reason):
    problem = mailbox_problem(address)

    assert problem is not None
    assert reason in problem


@pytest.mark.parametrize(("address", "reason"), INVALID)
def test_check_mailbox_refuses_invalid_mailboxes_naming_them(address, reason):
    with pytest.raises(QueueError) as info:
        check_mailbox(address, role="recipient")

    error = info.value
    assert error.code == ErrorCode.INVALID
    assert error.message.startswith(f"The recipient address {address!r} cannot be queued: ")
    assert reason in error.message
    assert error.recipient == address


def test_check_mailbox_names_the_role():
    with pytest.raises(QueueError) as info:
        check_mailbox("no-at-sign", role="sender")

    assert info.value.message == "The sender address 'no-at-sign' cannot be queued: it has no @."
    assert info.value.recipient is None
    assert str(info.value) == "INVALID: The sender address 'no-at-sign' cannot be queued: it has no @."


def test_the_empty_sender_is_the_null_sender():
    assert check_sender("") == ""


def test_check_sender_checks_a_non_empty_sender():
    assert check_sender("bounces+x@example.org") == "bounces+x@example.org"
    with pytest.raises(QueueError) as info:
        check_sender("first..last@example.org")

    assert info.value.code == ErrorCode.INVALID
    assert "The sender address 'first..last@example.org'" in info.value.message


def test_the_empty_recipient_is_not_a_mailbox():
    with pytest.raises(QueueError) as info:
        check_mailbox("", role="recipient")

    assert info.value.code == ErrorCode.INVALID


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("user@example.org", False),
        ("jörg@example.org", True),
        ("user@bücher.example", False),  # its domain travels as A-labels
        ('"a b"@example.org', False),
    ],
)
def test_needs_smtputf8(address, expected):
    assert needs_smtputf8(address) is expected


def test_domain_of_lowercases_the_domain_only():
    assert domain_of("User@Mail.EXAMPLE.org") == "mail.example.org"
    assert domain_of('"a@b"@Example.org') == "example.org"


@pytest.mark.parametrize(
    ("domain", "ascii_form"),
    [
        # IDNA2008 keeps ß and the final sigma (RFC 5892); IDNA2003 mapped them away: other domains.
        ("straße.example", "xn--strae-oqa.example"),
        ("STRAßE.Example", "xn--strae-oqa.example"),  # UTS #46 maps case
        ("ελληνικός.example", "xn--qxaegecap6byf.example"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("example.org", "example.org"),
        ("Example.ORG", "Example.ORG"),  # ASCII is left as written
    ],
)
def test_a_labels_are_idna2008_with_uts46_mapping(domain, ascii_form):
    assert a_labels(domain) == ascii_form


def test_a_labels_refuses_what_idna2008_refuses():
    with pytest.raises(UnicodeError):
        a_labels("☃.example")


@pytest.mark.parametrize(
    ("address", "on_the_wire"),
    [
        ("anna@straße.example", "anna@xn--strae-oqa.example"),
        ("jörg@bücher.example", "jörg@xn--bcher-kva.example"),
        ("user@example.org", "user@example.org"),
        ("user@[192.0.2.1]", "user@[192.0.2.1]"),
        ('"a@b"@bücher.example', '"a@b"@xn--bcher-kva.example'),
        ("", ""),
    ],
)
def test_the_envelope_form_has_its_domain_in_a_labels(address, on_the_wire):
    assert envelope_form(address) == on_the_wire
