"""The octets of the commonest message, written directly: plain ASCII text, no more.

Most of what a site sends is ``send_mail(subject, text, from, [to])``: one ASCII
``text/plain`` part, bare addresses, a short subject. For that message Django's
``EmailMessage.message()`` and the email package's generator (folding, charset
handling, address parsing) are most of an enqueue's time, and what they write is
fixed: each header as given, on one line, and the text with its line ends made CRLF.

``plain_text_octets`` writes exactly what Django's ``message()``, flattened, would
write for such a message, on the Django that is installed (5.2 and 6.x differ in the
order of two headers, the form of the date and the text's handling), and ``None``
for every other message, which then takes the general path. The tests hold the two
paths to the same octets on every supported Django.
"""

from __future__ import annotations

import email.utils
import re
import time
from datetime import UTC, datetime, tzinfo

import django
from django.conf import settings
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.core.mail.utils import DNS_NAME
from django.utils import timezone

# Django 6.0 builds with the email package's modern API (email.policy.default), which
# writes the text part differently from Django 5.2's compat32 messages.
_MODERN = django.VERSION >= (6, 0)
_KINDS = (EmailMessage, EmailMultiAlternatives)
# Printable ASCII words and single spaces: a header value no encoder or parser alters
# ("=?" could be read back as an RFC 2047 encoded word, and is left to the email package).
_PLAIN_VALUE = re.compile(r"[!-~]+(?: [!-~]+)*")
# A bare dot-atom address with an ASCII domain: Django's address handling writes it
# as it is (no display name to quote or encode, no IDNA to apply).
_PLAIN_ADDRESS = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+"
)
# Printable ASCII, TAB, CR and LF: the other controls are taken for line ends by
# str.splitlines(), and so by parts of the email package.
_TEXT_OCTETS = bytes(range(0x20, 0x7F)) + b"\t\r\n"
#: A line end as the email package's generator finds them (email.generator.NLCRE).
LINE_ENDS = re.compile(r"\r\n|\r|\n")
# A header that fits on one line is written unfolded by both of Django's generators.
_ONE_LINE = 76
# The longest text line each writes as 7bit: RFC 5322's 998 (Django 5.2), the modern
# policy's max_line_length (Django 6.x); a longer line is quoted-printable.
_MAX_7BIT_LINE = 78 if _MODERN else 998
_HEAD = (
    b'Content-Type: text/plain; charset="utf-8"\r\nContent-Transfer-Encoding: 7bit\r\nMIME-Version: 1.0\r\n'
    if _MODERN
    else b'Content-Type: text/plain; charset="utf-8"\r\nMIME-Version: 1.0\r\nContent-Transfer-Encoding: 7bit\r\n'
)


def plain_text_octets(message: EmailMessage) -> bytes | None:
    """Return ``message`` as Django would generate it, or ``None`` when it is not a
    plain ASCII text message with bare addresses and no headers of its own."""
    if not _is_plain_kind(message):
        return None
    lines = _header_lines(message)
    if lines is None:
        return None
    text = _text(message.body)
    if text is None:
        return None
    lines.append(f"Date: {_date()}")
    lines.append(f"Message-ID: {email.utils.make_msgid(domain=DNS_NAME)}")
    return b"".join([_HEAD, "\r\n".join(lines).encode("ascii"), b"\r\n\r\n", text])


def _is_plain_kind(message: EmailMessage) -> bool:
    # The exact classes only: a subclass may build its message otherwise.
    return (
        type(message) in _KINDS
        and not getattr(message, "alternatives", None)
        and not message.attachments
        and not message.extra_headers
        and message.content_subtype == "plain"
        and str(message.encoding or settings.DEFAULT_CHARSET).lower() == "utf-8"
    )


def _header_lines(message: EmailMessage) -> list[str] | None:
    subject = message.subject
    if type(subject) is not str or not _PLAIN_VALUE.fullmatch(subject) or "=?" in subject:
        return None
    if not _plain_addresses([message.from_email]):
        return None
    fields = [("Subject", subject), ("From", message.from_email)]
    for name, addresses in (("To", message.to), ("Cc", message.cc), ("Reply-To", message.reply_to)):
        if addresses:
            if not _plain_addresses(addresses):
                return None
            fields.append((name, ", ".join(addresses)))
    lines = [f"{name}: {value}" for name, value in fields]
    return None if any(len(line) > _ONE_LINE for line in lines) else lines


def _plain_addresses(addresses: object) -> bool:
    return isinstance(addresses, list | tuple) and all(
        type(address) is str and _PLAIN_ADDRESS.fullmatch(address) for address in addresses
    )


def _text(body: object) -> bytes | None:
    # On octets, where the check and the split are single passes in C: regular
    # expressions over the text took three times as long.
    if type(body) is not str or not body.isascii():
        return None
    octets = body.encode("ascii")
    if octets.translate(None, _TEXT_OCTETS):
        return None
    # The generator's line ends (LINE_ENDS) in the order it matches them: CRLF, then CR.
    lines = octets.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if max(map(len, lines)) > _MAX_7BIT_LINE:
        return None
    if _MODERN and lines[-1] == b"":
        # The modern API ends every line, the last included: that end is there already.
        lines.pop()
    return b"\r\n".join(lines) + (b"\r\n" if _MODERN else b"")


def _date() -> str:
    # The field counts whole seconds, and a loop of send_mail() writes many in each:
    # the last one written is kept, with the second and the zone it was written for.
    global _last_date
    second = int(time.time())
    zone: tzinfo | bool
    if _MODERN:
        zone = timezone.get_current_timezone() if settings.EMAIL_USE_LOCALTIME else UTC
    else:
        zone = bool(settings.EMAIL_USE_LOCALTIME)
    key, text = _last_date
    if key != (second, zone):
        text = _written_date(second, zone=zone)
        _last_date = ((second, zone), text)
    return text


def _written_date(second: int, *, zone: tzinfo | bool) -> str:
    # Django 5.2 writes formatdate(localtime=...), Django 6.x format_datetime(now(zone)).
    if isinstance(zone, bool):
        return email.utils.formatdate(second, localtime=zone)
    return email.utils.format_datetime(datetime.fromtimestamp(second, zone))


_last_date: tuple[tuple[int, tzinfo | bool], str] = ((-1, False), "")
