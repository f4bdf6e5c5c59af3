"""What reaches the wire fits the server: 8-bit content only where 8BITMIME was offered
(RFC 6152 §3), no line over 998 octets anywhere (RFC 5321 §4.5.3.1.6), and every part
re-encoded for it decodes to the octets it held."""

from __future__ import annotations

import email
import email.policy
import random
import re
from collections.abc import Callable
from email.message import Message

import pytest
from django.core.mail import EmailMessage, EmailMultiAlternatives, send_mail
from django.test import override_settings

from bumail_queue import queue
from bumail_queue.conf import Route
from bumail_queue.delivery.smtp import SMTPTransport
from bumail_queue.delivery.transfer_encoding import UnconvertibleError, needs_conversion, seven_bit_safe
from bumail_queue.items import RecipientStatus
from tests.helpers import as_wire_bytes, envelope, mx, only_reply, smarthost, use_queue_backend
from tests.servers.smtp import SMTPTestServer

DELIVERED, FAILED = RecipientStatus.DELIVERED, RecipientStatus.FAILED
MX = Route(type="mx")
Servers = Callable[..., SMTPTestServer]
LONGEST = 998


@pytest.fixture
def transport(transports: Callable[..., SMTPTransport]) -> SMTPTransport:
    return transports()


def django_message(message: EmailMessage) -> bytes:
    return as_wire_bytes(message.message())


def leaves(data: bytes) -> list[Message]:
    parsed = email.message_from_bytes(data, policy=email.policy.compat32)
    return [part for part in parsed.walk() if not part.is_multipart()]


def contents(data: bytes) -> list[bytes]:
    """Return what each body part decodes to, as a reader sees it."""
    return [part.get_payload(decode=True) for part in leaves(data)]


def longest_line(data: bytes) -> int:
    return max(len(line) for line in data.split(b"\r\n"))


def sent(server: SMTPTestServer) -> bytes:
    assert len(server.messages) == 1
    return server.messages[0].data


def deliver(transport: SMTPTransport, server: SMTPTestServer, message: bytes) -> RecipientStatus:
    delivery = transport.deliver(envelope(message=message), route=MX, hosts=[mx(server)])
    return only_reply(delivery)[0]


GRUSSE = django_message(EmailMessage("Grüße", "Grüße aus Köln.\n", "app@example.com", ["ann@example.org"]))


# -- 8BITMIME ------------------------------------------------------------------------------


def test_django_sends_8bit_text_and_so_the_test_means_something():
    assert b"Content-Transfer-Encoding: 8bit" in GRUSSE
    assert not GRUSSE.isascii()


def test_an_8bit_mail_to_a_server_without_8bitmime_goes_as_quoted_printable(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(eightbitmime=False)

    assert deliver(transport, server, GRUSSE) is DELIVERED

    data = sent(server)
    assert data.isascii()
    assert b"Content-Transfer-Encoding: quoted-printable" in data
    assert b"Gr=C3=BC=C3=9Fe aus K=C3=B6ln." in data
    assert contents(data) == contents(GRUSSE)
    assert "BODY=8BITMIME" not in server.messages[0].mail_options


def test_the_same_mail_to_a_server_with_8bitmime_goes_byte_for_byte_with_body_8bitmime(
    smtp_servers: Servers, transport: SMTPTransport
):
    server = smtp_servers(eightbitmime=True)

    assert deliver(transport, server, GRUSSE) is DELIVERED

    assert sent(server) == GRUSSE
    assert "BODY=8BITMIME" in server.messages[0].mail_options


def test_after_a_helo_fallback_8bit_content_is_converted(smtp_servers: Servers, transport: SMTPTransport):
    server = smtp_servers(ehlo_reply="502 5.5.2 EHLO not implemented")

    assert deliver(transport, server, GRUSSE) is DELIVERED

    assert "HELO" in server.verbs()
    assert sent(server).isascii()
    assert contents(sent(server)) == contents(GRUSSE)


def test_text_in_a_non_latin_script_goes_as_base64_where_that_is_shorter(
    smtp_servers: Servers, transport: SMTPTransport
):
    russian = django_message(
        EmailMessage("Привет", "Привет, это письмо на русском языке.\n" * 5, "app@example.com", ["ann@example.org"])
    )
    server = smtp_servers(eightbitmime=False)

    assert deliver(transport, server, russian) is DELIVERED

    data = sent(server)
    assert b"Content-Transfer-Encoding: base64" in data
    assert contents(data) == contents(russian)


def test_a_multipart_mail_keeps_its_ascii_parts_and_boundaries_byte_for_byte(
    smtp_servers: Servers, transport: SMTPTransport
):
    message = EmailMultiAlternatives("Hi", "Grüße.\n", "app@example.com", ["ann@example.org"])
    message.attach_alternative("<p>Plain ASCII</p>", "text/html")
    message.attach("notes.txt", "Straße\n", "text/plain")
    original = django_message(message)
    server = smtp_servers(eightbitmime=False)

    assert deliver(transport, server, original) is DELIVERED

    data = sent(server)
    assert data.isascii()
    assert contents(data) == contents(original)
    html = next(p for p in leaves(data) if p.get_content_type() == "text/html")
    assert html["Content-Transfer-Encoding"] == "7bit"  # the ASCII part as it was
    boundaries = re.findall(rb"^--=+\d+==(?:--)?\r$", original, re.MULTILINE)
    assert boundaries == re.findall(rb"^--=+\d+==(?:--)?\r$", data, re.MULTILINE)


def test_an_8bit_attachment_that_is_not_text_goes_as_base64(smtp_servers: Servers, transport: SMTPTransport):
    payload = bytes(range(1, 256)).replace(b"\r", b"").replace(b"\n", b"")
    raw = (
        b"From: app@example.com\r\nTo: ann@example.org\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="b1"\r\n\r\n'
        b"--b1\r\nContent-Type: text/plain\r\n\r\nSee the file.\r\n"
        b"--b1\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
        + payload
        + b"\r\n--b1--\r\n"
    )
    server = smtp_servers(eightbitmime=False)

    assert deliver(transport, server, raw) is DELIVERED

    part = leaves(sent(server))[1]
    assert part["Content-Transfer-Encoding"] == "base64"
    assert part.get_payload(decode=True) == payload


def test_a_forwarded_message_is_converted_inside_and_its_part_says_7bit(
    smtp_servers: Servers, transport: SMTPTransport
):
    raw = (
        b"From: app@example.com\r\nTo: ann@example.org\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="outer"\r\n\r\n'
        b"--outer\r\nContent-Type: text/plain\r\n\r\nForwarded below.\r\n"
        b"--outer\r\nContent-Type: message/rfc822\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
        b"From: jo@example.net\r\nSubject: old\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"
        + "Schöne Grüße\r\n".encode()
        + b"--outer--\r\n"
    )
    server = smtp_servers(eightbitmime=False)

    assert deliver(transport, server, raw) is DELIVERED

    data = sent(server)
    assert data.isascii()
    forwarded = email.message_from_bytes(data, policy=email.policy.compat32).get_payload()[1]
    assert forwarded["Content-Transfer-Encoding"] == "7bit"
    inner = forwarded.get_payload()[0]
    assert inner.get_payload(decode=True).decode() == "Schöne Grüße"  # its CRLF is the delimiter's


def test_8bit_octets_in_a_part_header_fail_5_6_3_without_data(smtp_servers: Servers, transport: SMTPTransport):
    raw = (
        b"From: app@example.com\r\nTo: ann@example.org\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="b1"\r\n\r\n'
        b"--b1\r\nContent-Type: text/plain\r\n"
        + 'Content-Disposition: attachment; filename="Grüße.txt"\r\n\r\n'.encode()
        + b"hello\r\n--b1--\r\n"
    )
    server = smtp_servers(eightbitmime=False, smtputf8=False)

    status, code, enhanced, text = only_reply(transport.deliver(envelope(message=raw), route=MX, hosts=[mx(server)]))

    assert (status, code, enhanced) == (FAILED, None, "5.6.3")
    assert "does not offer 8BITMIME" in text
    assert "the header fields of a MIME part hold 8-bit octets" in text
    assert "DATA" not in server.verbs()


# -- lines over 998 octets ---------------------------------------------------------------


LONG_RAW = b"From: app@example.com\r\nTo: ann@example.org\r\nSubject: report\r\n\r\n" + b"x" * 3000 + b"\r\nend\r\n"


def test_a_conforming_server_refuses_a_long_line_so_the_test_means_something(smtp_servers: Servers):
    import smtplib

    server = smtp_servers()
    with smtplib.SMTP("127.0.0.1", server.port) as client, pytest.raises(smtplib.SMTPDataError) as refused:
        client.sendmail("app@example.com", ["ann@example.org"], LONG_RAW)
    assert refused.value.smtp_code == 500


@pytest.mark.parametrize("eightbitmime", [True, False])
def test_a_raw_message_with_a_long_line_is_re_encoded_and_delivered(
    smtp_servers: Servers, transport: SMTPTransport, eightbitmime: bool
):
    server = smtp_servers(eightbitmime=eightbitmime)

    assert deliver(transport, server, LONG_RAW) is DELIVERED

    data = sent(server)
    assert longest_line(data) <= LONGEST
    parsed = email.message_from_bytes(data, policy=email.policy.compat32)
    assert parsed["MIME-Version"] == "1.0"  # without it, the encoding would not be read
    assert parsed.get_content_type() == "text/plain"
    assert parsed["Content-Transfer-Encoding"] == "quoted-printable"
    assert parsed.get_payload(decode=True) == b"x" * 3000 + b"\r\nend\r\n"


def test_a_line_of_998_octets_starting_with_a_dot_is_re_encoded_as_stuffing_would_make_it_999(
    smtp_servers: Servers, transport: SMTPTransport
):
    line = b"." + b"y" * 997
    raw = b"From: app@example.com\r\nTo: ann@example.org\r\n\r\n" + line + b"\r\n"
    server = smtp_servers()

    assert deliver(transport, server, raw) is DELIVERED

    assert line not in sent(server)
    assert leaves(sent(server))[0].get_payload(decode=True) == line + b"\r\n"


def test_a_line_of_exactly_998_octets_goes_as_it_is(smtp_servers: Servers, transport: SMTPTransport):
    raw = b"From: app@example.com\r\nTo: ann@example.org\r\n\r\n" + b"z" * 998 + b"\r\n"
    server = smtp_servers()

    assert deliver(transport, server, raw) is DELIVERED

    assert sent(server) == raw


def test_a_stored_message_with_a_long_header_line_fails_5_6_3_without_data(
    smtp_servers: Servers, transport: SMTPTransport
):
    # Enqueue refuses such a message now; one stored before that still meets this.
    raw = b"From: app@example.com\r\nX-Token: " + b"t" * 1200 + b"\r\n\r\nHello.\r\n"
    server = smtp_servers()

    status, _, enhanced, text = only_reply(transport.deliver(envelope(message=raw), route=MX, hosts=[mx(server)]))

    assert (status, enhanced) == (FAILED, "5.6.3")
    assert "a line of the message's header fields is longer than 998 octets" in text
    assert "DATA" not in server.verbs()


# -- the converter on its own: what any message becomes --------------------------------


def _random_part(rng: random.Random, boundary_seed: int) -> bytes:
    kind = rng.choice(["text", "binary", "qp", "base64"])
    text = "".join(rng.choice(["a", "ü", " ", "€", "\t", "=", ".", "Я"]) for _ in range(rng.randint(0, 1500)))
    lines = "\r\n".join(text[i : i + rng.randint(1, 1200)] for i in range(0, len(text), 700)).encode()
    if kind == "text":
        return b"Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n" + lines
    if kind == "binary":
        payload = bytes(rng.randrange(256) for _ in range(rng.randint(0, 400))).replace(b"\r", b"").replace(b"\n", b"")
        return b"Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: 8bit\r\n\r\n" + payload
    if kind == "qp":
        return b"Content-Type: text/plain\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n" + b"q=3D" * 400
    return b"Content-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n\r\n" + b"QUJD" * 300


@pytest.mark.parametrize("eight_bit", [True, False])
def test_any_message_comes_out_fit_and_reads_the_same(eight_bit: bool):
    rng = random.Random(6152)
    for n in range(150):
        parts = [_random_part(rng, n) for _ in range(rng.randint(1, 4))]
        body = b"".join(b"--bnd" + str(n).encode() + b"\r\n" + part + b"\r\n" for part in parts)
        raw = (
            b"From: app@example.com\r\nMIME-Version: 1.0\r\n"
            b'Content-Type: multipart/mixed; boundary="bnd' + str(n).encode() + b'"\r\n\r\n'
            b"preamble \xc3\xbc\r\n" + body + b"--bnd" + str(n).encode() + b"--\r\n"
        )

        out = seven_bit_safe(raw, eight_bit=eight_bit, utf8_headers=False)

        assert longest_line(out) <= LONGEST, n
        assert out.isascii() or eight_bit, n
        assert contents(out) == contents(raw), n


def test_a_multipart_without_its_boundary_cannot_be_converted():
    raw = b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed\r\n\r\n\xc3\xbc\r\n"
    with pytest.raises(UnconvertibleError, match="no boundary"):
        seven_bit_safe(raw, eight_bit=False, utf8_headers=False)


def test_a_non_mime_8bit_message_is_named_utf_8_when_it_is_and_unknown_8bit_when_not():
    utf8 = seven_bit_safe(b"Subject: x\r\n\r\nGr\xc3\xbc\xc3\x9fe\r\n", eight_bit=False, utf8_headers=False)
    latin1 = seven_bit_safe(b"Subject: x\r\n\r\nGr\xfc\xdfe\r\n", eight_bit=False, utf8_headers=False)

    assert b"Content-Type: text/plain; charset=utf-8\r\n" in utf8
    assert b"Content-Type: text/plain; charset=unknown-8bit\r\n" in latin1
    assert leaves(latin1)[0].get_payload(decode=True) == b"Gr\xfc\xdfe\r\n"


# -- through the queue ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_send_mail_with_umlauts_reaches_a_server_without_8bitmime_readable(smtp_servers: Servers):
    server = smtp_servers(eightbitmime=False)
    with override_settings(BUMAIL_QUEUE=smarthost(server)), use_queue_backend():
        send_mail("Grüße", "Grüße aus Köln.", "app@example.com", ["ann@example.org"])
        stats = queue.deliver_due()

    assert stats.delivered == 1
    data = sent(server)
    assert data.isascii()
    text = email.message_from_bytes(data, policy=email.policy.default).get_content()
    assert text.strip() == "Grüße aus Köln."


@pytest.mark.parametrize(
    ("text", "too_long"),
    [
        (b"x" * 998, False),
        (b"x" * 999, True),
        (b"." + b"x" * 996 + b"\r\n", False),
        (b"." + b"x" * 997, True),  # 999 once stuffed
        (b"a\r\n" + b"x" * 998 + b"\r\nb\r\n", False),
        (b"a\r\n" + b"x" * 999 + b"\r\nb\r\n", True),
        (b"a\r\n." + b"x" * 996 + b"\r\n", False),
        (b"a\r\n." + b"x" * 997 + b"\r\n", True),
        (b"a\r\n" + b"x" * 998, False),  # a part's last line, its CRLF the delimiter's
        (b"a\r\n" + b"x" * 999, True),
    ],
)
def test_a_line_is_too_long_past_998_octets_on_the_wire(text: bytes, too_long: bool):
    assert needs_conversion(text, eight_bit=True) is too_long
