"""The direct writer of plain ASCII text messages gives the octets Django's path gives.

Every case runs on the Django the test run has installed, so each tox env holds the
writer to that Django's own ``message()``.
"""

from __future__ import annotations

import re
import zoneinfo

import pytest
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.utils import timezone

from bumail_queue.mime import _flatten, finish_headers
from bumail_queue.plain_text import plain_text_octets

LINE = "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n"
# The two headers whose values differ on every call.
_VARYING = re.compile(rb"^(Date|Message-ID): [^\r\n]*", re.MULTILINE)


def django_octets(message: EmailMessage) -> bytes:
    """What the general path keeps for ``message``."""
    return finish_headers(_flatten(message.message()), hostname="mta.example.com", now=None)  # type: ignore[arg-type]


def same_but_varying(mine: bytes, theirs: bytes) -> None:
    assert _VARYING.sub(rb"\1: -", mine) == _VARYING.sub(rb"\1: -", theirs)
    assert len(_VARYING.findall(mine)) == 2


PLAIN = [
    pytest.param({}, id="the send_mail() shape"),
    pytest.param({"body": ""}, id="empty text"),
    pytest.param({"body": "no line end"}, id="no final line end"),
    pytest.param({"body": "a\r\nb\rc\n\n\n"}, id="mixed line ends and blank lines"),
    pytest.param({"body": "a\r\r\nb\n\rc\r"}, id="a CR before a CRLF, an LF before a CR"),
    pytest.param({"body": "tab\there  \n trailing spaces \n"}, id="tabs and spaces"),
    pytest.param({"body": LINE * 40}, id="lines of 86 characters"),
    pytest.param({"body": "x" * 78 + "\n"}, id="a line of 78"),
    pytest.param({"body": "x" * 998}, id="a line of 998"),
    pytest.param({"to": ["a@example.test", "b.c+tag@sub.example.test"], "cc": ["c@example.test"]}, id="to and cc"),
    pytest.param({"reply_to": ["r@example.test"], "bcc": ["hidden@example.test"]}, id="reply-to and bcc"),
    pytest.param({"subject": "Your order #12 (3 items) is on its way!"}, id="punctuation"),
]


def plain_message(kind: type[EmailMessage] = EmailMessage, **given: object) -> EmailMessage:
    fields: dict[str, object] = {
        "subject": "S1-000001",
        "body": "Hello,\n\nYour order is on its way.\n",
        "from_email": "bench-sender@example.test",
        "to": ["rcpt-000001@example.test"],
    }
    fields.update(given)
    return kind(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("given", PLAIN)
@pytest.mark.parametrize("kind", [EmailMessage, EmailMultiAlternatives])
def test_a_plain_text_message_is_written_as_django_writes_it(kind, given):
    message = plain_message(kind, **given)
    mine = plain_text_octets(message)
    if mine is None:
        # A text Django would not send as 7bit (lines over its limit) takes the general path.
        assert b"Content-Transfer-Encoding: 7bit" not in django_octets(message)
        return
    same_but_varying(mine, django_octets(message))


def test_the_send_mail_shape_takes_the_direct_path():
    assert plain_text_octets(plain_message(EmailMultiAlternatives, body="Hello.\n")) is not None


@pytest.mark.parametrize(
    "given",
    [
        pytest.param({"subject": "Grüße"}, id="non-ASCII subject"),
        pytest.param({"subject": "=?utf-8?q?x?="}, id="encoded-word subject"),
        pytest.param({"subject": "two  spaces"}, id="double space"),
        pytest.param({"subject": " leading"}, id="leading space"),
        pytest.param({"subject": "x" * 70}, id="subject needing folding"),
        pytest.param({"body": "Grüße\n"}, id="non-ASCII text"),
        pytest.param({"body": "form\x0cfeed\n"}, id="a control in the text"),
        pytest.param({"body": "nul\x00 and\n"}, id="a NUL in the text"),
        pytest.param({"body": "delete\x7f\n"}, id="a DEL in the text"),
        pytest.param({"body": "x" * 999}, id="a line over 998"),
        pytest.param({"from_email": "Shop <shop@example.test>"}, id="display name"),
        pytest.param({"to": ["jörg@bücher.example"]}, id="non-ASCII address"),
        pytest.param({"to": ["user@[192.0.2.1]"]}, id="domain literal"),
        pytest.param({"to": [f"r{i}@example.test" for i in range(6)]}, id="a To header needing folding"),
        pytest.param({"headers": {"X-Tag": "a"}}, id="headers of its own"),
        pytest.param({"subject": 7}, id="a subject that is not a str"),
    ],
)
def test_any_other_message_takes_the_general_path(given):
    assert plain_text_octets(plain_message(**given)) is None


def test_attachments_alternatives_html_and_other_charsets_take_the_general_path():
    attached = plain_message()
    attached.attach("a.txt", "text", "text/plain")
    alternative = plain_message(EmailMultiAlternatives)
    alternative.attach_alternative("<p>Hi</p>", "text/html")
    html = plain_message()
    html.content_subtype = "html"
    latin = plain_message()
    latin.encoding = "iso-8859-1"

    class Custom(EmailMessage):
        pass

    for message in (attached, alternative, html, latin, plain_message(Custom)):
        assert plain_text_octets(message) is None


def test_each_message_gets_its_own_message_id():
    message = plain_message()
    values = {re.search(rb"Message-ID: (\S+)", plain_text_octets(message) or b"").group(1) for _ in range(3)}
    assert len(values) == 3


@pytest.mark.parametrize("localtime", [False, True])
def test_the_date_is_written_as_django_writes_it(settings, localtime):
    settings.EMAIL_USE_LOCALTIME = localtime
    mine = re.search(rb"Date: ([^\r\n]*)", plain_text_octets(plain_message()) or b"")
    theirs = re.search(rb"Date: ([^\r\n]*)", django_octets(plain_message()))
    assert mine is not None and theirs is not None
    # The same zone and form; the seconds may differ by the time between the calls.
    assert mine.group(1)[-5:] == theirs.group(1)[-5:]
    assert mine.group(1)[:16] == theirs.group(1)[:16]


def test_a_date_written_in_the_same_second_follows_a_change_of_zone(settings):
    # The direct writer keeps the last Date it wrote for the second it is in.
    settings.EMAIL_USE_LOCALTIME = True
    for zone in ("UTC", "Asia/Kolkata", "America/St_Johns"):
        with timezone.override(zoneinfo.ZoneInfo(zone)):
            mine = re.search(rb"Date: ([^\r\n]*)", plain_text_octets(plain_message()) or b"")
            theirs = re.search(rb"Date: ([^\r\n]*)", django_octets(plain_message()))
        assert mine is not None and theirs is not None
        assert mine.group(1)[-5:] == theirs.group(1)[-5:]
