"""Turning an ``EmailMessage`` or raw bytes into the envelope and the bytes to keep."""

from __future__ import annotations

import email
import email.policy
import email.utils
import re
from datetime import UTC, datetime

import pytest
from django.core.mail import EmailMessage, EmailMultiAlternatives

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.mime import from_bytes, from_email_message

HOSTNAME = "mta.example.com"
NOW = datetime(2024, 3, 5, 6, 7, 8, tzinfo=UTC)
NOW_HEADER = b"Date: Tue, 05 Mar 2024 06:07:08 +0000"
MSGID = re.compile(rb"^Message-ID: <[^<>@\s]+@mta\.example\.com>\r?$", re.MULTILINE)


def prepare_message(message: EmailMessage, *, sender: str | None = None, recipients: list[str] | None = None):
    return from_email_message(message, sender=sender, recipients=recipients, hostname=HOSTNAME, now=NOW)


def prepare_bytes(data: bytes, *, sender: str | None = None, recipients: list[str] | None = None):
    return from_bytes(data, sender=sender, recipients=recipients, hostname=HOSTNAME, now=NOW)


def head_and_body(data: bytes) -> tuple[bytes, bytes]:
    eol = b"\r\n" if b"\r\n" in data else b"\n"
    head, _, body = data.partition(eol + eol)
    return head, body


def header_names(data: bytes) -> list[bytes]:
    head, _ = head_and_body(data)
    return [line.partition(b":")[0].lower() for line in re.split(rb"\r?\n", head) if line[:1] not in (b" ", b"\t")]


# -- EmailMessage ---------------------------------------------------------------------


def test_to_cc_and_bcc_are_all_envelope_recipients_and_bcc_is_not_in_the_bytes():
    message = EmailMessage(
        "Quarterly report",
        "See attached.",
        "reports@example.com",
        to=["to@example.org"],
        cc=["cc@example.org"],
        bcc=["hidden@example.net"],
    )

    prepared = prepare_message(message)

    assert prepared.sender == "reports@example.com"
    assert prepared.recipients == ["to@example.org", "cc@example.org", "hidden@example.net"]
    assert b"bcc" not in header_names(prepared.data)
    assert b"hidden@example.net" not in prepared.data
    parsed = email.message_from_bytes(prepared.data, policy=email.policy.default)
    assert parsed["To"] == "to@example.org"
    assert parsed["Cc"] == "cc@example.org"
    assert parsed["Subject"] == "Quarterly report"


def test_display_names_reduce_to_the_addr_spec():
    message = EmailMessage(
        "Hi",
        "Hello",
        "Jane Doe <jane@example.org>",
        to=["Bob <bob@example.org>", '"Smith, Carol" <carol@example.org>'],
        bcc=["Hidden Person <hidden@example.net>"],
    )

    prepared = prepare_message(message)

    assert prepared.sender == "jane@example.org"
    assert prepared.recipients == ["bob@example.org", "carol@example.org", "hidden@example.net"]


def test_duplicate_recipients_are_dropped_in_order():
    message = EmailMessage(
        "Hi",
        "Hello",
        "app@example.com",
        to=["b@example.org", "a@example.org"],
        cc=["Bee <b@example.org>", "c@example.org"],
        bcc=["a@example.org", "d@example.org"],
    )

    assert prepare_message(message).recipients == ["b@example.org", "a@example.org", "c@example.org", "d@example.org"]


def test_the_envelope_may_be_given_instead_of_taken_from_the_message():
    message = EmailMessage("Hi", "Hello", "app@example.com", to=["to@example.org"])

    prepared = prepare_message(message, sender="", recipients=["other@example.net"])

    assert prepared.sender == ""
    assert prepared.recipients == ["other@example.net"]


def test_non_ascii_addresses_stay_utf8_in_the_envelope():
    message = EmailMessage("Hi", "Hello", "app@example.com", to=["jörg@example.org", "user@bücher.example"])

    assert prepare_message(message).recipients == ["jörg@example.org", "user@bücher.example"]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"headers": {"X-Tag": "a\r\nBcc: victim@example.net"}}, id="crlf-extra-header"),
        pytest.param({"headers": {"X-Tag": "a\nb"}}, id="lf-extra-header"),
        pytest.param({"headers": {"X-Tag": "a\rb"}}, id="cr-extra-header"),
        pytest.param({"subject": "Hello\r\nBcc: victim@example.net"}, id="crlf-subject"),
        pytest.param({"subject": "Hello\nworld"}, id="lf-subject"),
    ],
)
def test_a_header_with_cr_or_lf_is_invalid(kwargs):
    fields = {"subject": "Hi", "body": "Hello", "from_email": "app@example.com", "to": ["to@example.org"], **kwargs}

    with pytest.raises(QueueError) as info:
        prepare_message(EmailMessage(**fields))

    assert info.value.code == ErrorCode.INVALID
    assert info.value.message.startswith("The message cannot be queued: ")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("to", ["first..last@example.org"]),
        ("cc", ["ok@example.org", "no-at-sign"]),
        ("bcc", ["a@example.org, b@example.org"]),
        ("to", []),
    ],
)
def test_a_bad_or_missing_recipient_is_invalid(field, value):
    fields = {"subject": "Hi", "body": "Hello", "from_email": "app@example.com", field: value}

    with pytest.raises(QueueError) as info:
        prepare_message(EmailMessage(**fields))

    assert info.value.code == ErrorCode.INVALID


def test_a_bad_recipient_is_named():
    with pytest.raises(QueueError) as info:
        prepare_message(
            EmailMessage("Hi", "Hello", "app@example.com", to=["ok@example.org", "first..last@example.org"])
        )

    assert "'first..last@example.org'" in info.value.message
    assert info.value.recipient == "first..last@example.org"


def test_a_bad_sender_is_invalid():
    with pytest.raises(QueueError) as info:
        prepare_message(EmailMessage("Hi", "Hello", "not an address", to=["to@example.org"]))

    assert info.value.code == ErrorCode.INVALID
    assert "sender" in info.value.message


def test_an_email_message_gets_one_message_id_and_one_date():
    prepared = prepare_message(EmailMultiAlternatives("Hi", "Hello", "app@example.com", ["to@example.org"]))

    names = header_names(prepared.data)
    assert names.count(b"message-id") == 1
    assert names.count(b"date") == 1


def test_an_email_message_keeps_its_own_message_id_and_date():
    message = EmailMessage(
        "Hi",
        "Hello",
        "app@example.com",
        ["to@example.org"],
        headers={"Message-ID": "<given@app.example.com>", "Date": "Mon, 01 Jan 2024 00:00:00 +0000"},
    )

    prepared = prepare_message(message)

    names = header_names(prepared.data)
    assert names.count(b"message-id") == 1
    assert names.count(b"date") == 1
    assert b"Message-ID: <given@app.example.com>\r\n" in prepared.data
    assert b"Date: Mon, 01 Jan 2024 00:00:00 +0000\r\n" in prepared.data


def test_an_email_message_is_kept_with_crlf_line_endings():
    prepared = prepare_message(EmailMessage("Hi", "line one\nline two\n", "app@example.com", ["to@example.org"]))

    assert b"\n" not in prepared.data.replace(b"\r\n", b"")
    assert prepared.data.endswith(b"line one\r\nline two\r\n")


# -- raw bytes ------------------------------------------------------------------------

RAW_HEAD = b"From: Jane <jane@example.org>\r\nTo: bob@example.org\r\nSubject: raw\r\n"


def test_raw_bytes_keep_the_body_byte_for_byte():
    body = b"caf\xe9 \x80\x81\xfe\xff\r\n.\r\n..leading dots\r\nFrom the start\r\n\r\n\r\ntrailing   \r\n"
    data = (
        b"From: jane@example.org\r\nTo: bob@example.org\r\nSubject: 8bit\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=latin-1\r\n"
        b"Content-Transfer-Encoding: 8bit\r\n\r\n" + body
    )

    prepared = prepare_bytes(data)

    assert head_and_body(prepared.data)[1] == body
    assert prepared.data.endswith(b"\r\n\r\n" + body)


def test_raw_bytes_keep_their_header_lines_as_given():
    data = (
        RAW_HEAD
        + b"X-Folded: one\r\n\ttwo\r\nMessage-ID: <raw@example.org>\r\nDate: Mon, 01 Jan 2024 00:00:00 +0000\r\n\r\nbody\r\n"
    )

    assert prepare_bytes(data).data == data


@pytest.mark.parametrize("eol", [b"\r\n", b"\n"])
def test_bcc_is_stripped_with_its_continuation_lines(eol):
    lines = [
        b"From: jane@example.org",
        b"To: bob@example.org",
        b"Bcc: hidden@example.net,",
        b' "Other Hidden" <other@example.net>,',
        b"\tthird@example.net",
        b"Subject: with bcc",
        b"X-After: kept",
    ]
    data = eol.join(lines) + eol + eol + b"body" + eol

    prepared = prepare_bytes(data)

    assert prepared.recipients == ["bob@example.org", "hidden@example.net", "other@example.net", "third@example.net"]
    assert b"bcc" not in header_names(prepared.data)
    for hidden in (b"hidden@example.net", b"other@example.net", b"third@example.net", b"Other Hidden"):
        assert hidden not in prepared.data
    assert prepared.data.startswith(eol.join([lines[0], lines[1], lines[5], lines[6]]) + eol)
    assert prepared.data.endswith(eol + eol + b"body" + eol)


def test_bcc_is_stripped_whatever_its_case_and_place():
    data = b"BCC: hidden@example.net\r\nFrom: jane@example.org\r\nbcc: second@example.net\r\nTo: bob@example.org\r\n\r\nbody\r\n"

    prepared = prepare_bytes(data)

    assert prepared.recipients == ["bob@example.org", "hidden@example.net", "second@example.net"]
    assert b"hidden@example.net" not in prepared.data
    assert b"second@example.net" not in prepared.data


def test_message_id_and_date_are_added_when_missing():
    prepared = prepare_bytes(RAW_HEAD + b"\r\nbody\r\n")

    assert len(MSGID.findall(prepared.data)) == 1
    assert prepared.data.count(NOW_HEADER + b"\r\n") == 1
    assert prepared.data.startswith(RAW_HEAD)
    assert prepared.data.endswith(b"\r\n\r\nbody\r\n")
    parsed = email.message_from_bytes(prepared.data, policy=email.policy.default)
    assert parsed["Date"].datetime == NOW
    assert parsed["Message-ID"].endswith("@mta.example.com>")


def test_each_added_message_id_is_new():
    first = prepare_bytes(RAW_HEAD + b"\r\nbody\r\n").data
    second = prepare_bytes(RAW_HEAD + b"\r\nbody\r\n").data

    assert MSGID.findall(first) != MSGID.findall(second)


@pytest.mark.parametrize(
    ("present", "added"),
    [
        (b"Message-ID: <given@example.org>\r\n", b"date"),
        (b"message-id: <given@example.org>\r\n", b"date"),
        (b"Date: Mon, 01 Jan 2024 00:00:00 +0000\r\n", b"message-id"),
        (b"DATE: Mon, 01 Jan 2024 00:00:00 +0000\r\n", b"message-id"),
    ],
)
def test_a_present_message_id_or_date_is_not_duplicated(present, added):
    prepared = prepare_bytes(RAW_HEAD + present + b"\r\nbody\r\n")

    names = header_names(prepared.data)
    assert names.count(b"message-id") == 1
    assert names.count(b"date") == 1
    assert present in prepared.data
    assert added in names


def test_preparing_twice_adds_nothing_the_second_time():
    once = prepare_bytes(RAW_HEAD + b"\r\nbody\r\n").data

    assert prepare_bytes(once).data == once


def test_lf_line_endings_are_kept_and_used_for_added_headers():
    data = b"From: jane@example.org\nTo: bob@example.org\nSubject: lf\n\nline one\nline two\n"

    prepared = prepare_bytes(data)

    assert b"\r" not in prepared.data
    assert prepared.data.startswith(b"From: jane@example.org\nTo: bob@example.org\nSubject: lf\n")
    assert prepared.data.endswith(b"\n\nline one\nline two\n")
    assert len(MSGID.findall(prepared.data)) == 1
    assert NOW_HEADER + b"\n" in prepared.data
    assert prepared.recipients == ["bob@example.org"]


def test_a_header_block_without_a_body_gets_an_empty_one():
    prepared = prepare_bytes(b"From: jane@example.org\r\nTo: bob@example.org")

    assert prepared.data.startswith(b"From: jane@example.org\r\nTo: bob@example.org\r\n")
    assert prepared.data.endswith(b"\r\n\r\n")
    assert prepared.recipients == ["bob@example.org"]


def test_raw_bytes_without_recipients_are_invalid():
    with pytest.raises(QueueError) as info:
        prepare_bytes(b"From: jane@example.org\r\nSubject: nobody\r\n\r\nbody\r\n")

    assert info.value.code == ErrorCode.INVALID
    assert "no recipient" in info.value.message


def test_empty_to_cc_and_bcc_give_no_recipient():
    with pytest.raises(QueueError) as info:
        prepare_bytes(b"From: jane@example.org\r\nTo: \r\nCc: undisclosed-recipients:;\r\nBcc:\r\n\r\nbody\r\n")

    assert info.value.code == ErrorCode.INVALID


@pytest.mark.parametrize(
    "line",
    [b"this line has no colon", b"From jane@example.org Mon Jan  1 00:00:00 2024", b"Bad Name: value", b": no name"],
)
def test_a_header_line_that_is_no_field_is_invalid(line):
    with pytest.raises(QueueError) as info:
        prepare_bytes(b"To: bob@example.org\r\n" + line + b"\r\nSubject: x\r\n\r\nbody\r\n")

    assert info.value.code == ErrorCode.INVALID
    assert "is not a header field" in info.value.message
    assert repr(line[:40]) in info.value.message


def test_a_bare_lf_in_a_crlf_header_block_is_invalid():
    with pytest.raises(QueueError) as info:
        prepare_bytes(b"To: bob@example.org\r\nSubject: a\nBcc: hidden@example.net\r\n\r\nbody\r\n")

    assert info.value.code == ErrorCode.INVALID


@pytest.mark.parametrize("data", ["To: bob@example.org\r\n\r\nbody", None, 42])
def test_a_message_must_be_bytes(data):
    with pytest.raises(QueueError) as info:
        prepare_bytes(data)  # type: ignore[arg-type]

    assert info.value.code == ErrorCode.INVALID
    assert "must be an EmailMessage or bytes" in info.value.message


def test_a_bytearray_is_taken_as_bytes():
    data = RAW_HEAD + b"Message-ID: <m@example.org>\r\nDate: Mon, 01 Jan 2024 00:00:00 +0000\r\n\r\nbody\r\n"

    assert prepare_bytes(bytearray(data)).data == data


# -- the envelope of raw bytes --------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "sender"),
    [
        (b"Sender: list-bounces@example.org\r\nFrom: Jane <jane@example.org>\r\n", "list-bounces@example.org"),
        (b"From: Jane <jane@example.org>\r\nSender: list-bounces@example.org\r\n", "list-bounces@example.org"),
        (b"From: Jane <jane@example.org>\r\n", "jane@example.org"),
        (b"From: =?utf-8?q?J=C3=A4ne?= <jane@example.org>\r\n", "jane@example.org"),
    ],
)
def test_the_envelope_sender_defaults_to_sender_then_from(head, sender):
    prepared = prepare_bytes(head + b"To: bob@example.org\r\n\r\nbody\r\n")

    assert prepared.sender == sender


@pytest.mark.parametrize("head", [b"From: <>\r\n", b""])
def test_raw_bytes_without_a_from_address_need_an_explicit_sender(head):
    with pytest.raises(QueueError) as info:
        prepare_bytes(head + b"To: bob@example.org\r\n\r\nbody\r\n")
    assert info.value.code == ErrorCode.INVALID
    assert "no Sender or From address" in info.value.message
    assert prepare_bytes(head + b"To: bob@example.org\r\n\r\nbody\r\n", sender="").sender == ""


def test_the_envelope_recipients_default_to_to_cc_and_bcc():
    data = (
        b"From: jane@example.org\r\n"
        b"To: Bob <bob@example.org>, carol@example.org\r\n"
        b'Cc: "Dave, D." <dave@example.org>,\r\n bob@example.org\r\n'
        b"Bcc: eve@example.net\r\n"
        b"To: frank@example.org\r\n"
        b"Reply-To: replies@example.org\r\n\r\nbody\r\n"
    )

    prepared = prepare_bytes(data)

    assert prepared.recipients == [
        "bob@example.org",
        "carol@example.org",
        "frank@example.org",
        "dave@example.org",
        "eve@example.net",
    ]


def test_a_given_envelope_wins_over_the_headers():
    prepared = prepare_bytes(RAW_HEAD + b"\r\nbody\r\n", sender="bounces@example.com", recipients=["x@example.net"])

    assert prepared.sender == "bounces@example.com"
    assert prepared.recipients == ["x@example.net"]
    assert b"To: bob@example.org\r\n" in prepared.data


@pytest.mark.parametrize("sender", ["", "<>"])
def test_a_given_null_sender_is_the_null_sender(sender):
    assert prepare_bytes(RAW_HEAD + b"\r\nbody\r\n", sender=sender).sender == ""


def test_a_bad_address_in_the_headers_is_invalid():
    with pytest.raises(QueueError) as info:
        prepare_bytes(b"From: jane@example.org\r\nTo: first..last@example.org\r\n\r\nbody\r\n")

    assert info.value.code == ErrorCode.INVALID
    assert "'first..last@example.org'" in info.value.message


def test_recipients_given_as_one_string_are_invalid():
    with pytest.raises(QueueError) as info:
        prepare_bytes(RAW_HEAD + b"\r\nbody\r\n", recipients="x@example.net")  # type: ignore[arg-type]

    assert info.value.code == ErrorCode.INVALID
    assert "not one string" in info.value.message


@pytest.mark.parametrize("address", ["jörg@example.org", "user@bücher.example"])
def test_utf8_recipients_in_raw_headers_reach_the_envelope_unchanged(address):
    # RFC 6532 headers hold UTF-8 addresses, as SMTPUTF8 (RFC 6531) carries them.
    data = f"From: app@example.com\r\nTo: {address}\r\nSubject: utf-8\r\n\r\nbody\r\n".encode()

    prepared = prepare_bytes(data)

    assert prepared.recipients == [address]


def test_a_utf8_sender_in_raw_headers_reaches_the_envelope_unchanged():
    data = "From: Jörg <jörg@example.org>\r\nTo: bob@example.org\r\nSubject: utf-8\r\n\r\nbody\r\n".encode()

    assert prepare_bytes(data).sender == "jörg@example.org"
