"""A message re-encoded for a server that cannot take it as it is stored.

Two rules can stop a stored message from going out byte for byte: 8-bit content goes
only to a server that offered 8BITMIME (RFC 6152 §3), and no line may be longer than
998 octets (RFC 5321 §4.5.3.1.6). As Postfix does, the body parts at fault are
re-encoded: quoted-printable for text (base64 when that is a tenth shorter or more, as
for text in a non-Latin script), base64 for anything else. Decoded, each part gives the very octets
it held. Everything else (the header fields, the boundaries, the parts that need
nothing) goes on byte for byte, so a reader sees the same message.

The structure is walked here rather than with ``email``'s parser and generator: the
generator writes header fields and boundaries anew, and what goes out must differ
from what was stored only where a rule forces it. ``email`` still reads the header
fields of each part (their types, boundaries and encodings).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import email.policy
import re
from email.message import Message
from email.parser import HeaderParser

__all__ = ["MAX_LINE", "UnconvertibleError", "needs_conversion", "seven_bit_safe"]

#: RFC 5321 §4.5.3.1.6: a line of text is at most 998 octets before its CRLF.
MAX_LINE = 998

# Lines too long, after the LF that ends the line before them, counting the CR that
# ends their own. Each pattern starts with a literal that the regular expression
# engine finds at memchr's speed; a class without CR, or two patterns in one, would
# be tried at every octet and cost four to ten times as much.
_LINE_AFTER_LF = re.compile(rb"\n[^\n]{%d}" % (MAX_LINE + 2))
_DOT_LINE_AFTER_LF = re.compile(rb"\n\.[^\n]{%d}" % MAX_LINE)
_HEAD_END = b"\r\n\r\n"
# How deep parts may nest before the message is refused, as the admin's preview does.
_MAX_DEPTH = 100
# The encodings under which a part's octets are its content as it is (RFC 2045 §6.2).
_IDENTITY = frozenset({"", "7bit", "8bit", "binary"})
_BASE64_LINE = 76  # RFC 2045 §6.8: encoded lines of at most 76 characters
_CTE_FIELD = re.compile(rb"^content-transfer-encoding[ \t]*:.*\r\n(?:[ \t].*\r\n)*", re.IGNORECASE | re.MULTILINE)


class UnconvertibleError(ValueError):
    """The message cannot be made fit for the server without changing what it says."""


def needs_conversion(text: bytes, *, eight_bit: bool) -> bool:
    """Return whether ``text`` (CRLF lines) cannot go as it is to a server that does,
    or does not (``eight_bit``), take 8-bit content."""
    return (not eight_bit and not text.isascii()) or _has_long_line(text)


def _has_long_line(text: bytes) -> bool:
    """Return whether a line of ``text`` (CRLF lines) is too long for the wire: over
    998 octets, or 998 starting with "." (which dot-stuffing makes one longer)."""
    if len(text) < MAX_LINE:
        return False
    first_end, last_start = text.find(b"\n"), text.rfind(b"\n") + 1
    if first_end == -1:
        return _too_long(text)
    return (
        _too_long(text[:first_end].removesuffix(b"\r"))
        or _too_long(text[last_start:])  # a part's last line: its CRLF is the delimiter's
        or _LINE_AFTER_LF.search(text) is not None
        or _DOT_LINE_AFTER_LF.search(text) is not None
    )


def _too_long(line: bytes) -> bool:
    return len(line) > MAX_LINE or (len(line) == MAX_LINE and line.startswith(b"."))


def seven_bit_safe(text: bytes, *, eight_bit: bool, utf8_headers: bool) -> bytes:
    """Return ``text`` (CRLF lines) with every body part re-encoded that has a line too
    long for the wire or, unless ``eight_bit``, an 8-bit octet.

    ``utf8_headers`` says the server takes UTF-8 header fields (SMTPUTF8, RFC 6532).
    Raises :class:`UnconvertibleError` when a header field stands in the way: a line
    too long, or 8-bit octets the server does not take; re-encoding a header field
    would change what it says.
    """
    return _Converter(eight_bit=eight_bit, utf8_headers=utf8_headers).entity(text, "text/plain", depth=0, top=True)


@dataclasses.dataclass(frozen=True, slots=True)
class _Converter:
    """What the server takes: 8-bit content (8BITMIME), UTF-8 header fields (SMTPUTF8)."""

    eight_bit: bool
    utf8_headers: bool

    def unfit(self, text: bytes) -> bool:
        return needs_conversion(text, eight_bit=self.eight_bit)

    def entity(self, text: bytes, default_type: str, *, depth: int, top: bool) -> bytes:
        """Return one entity (a message or a body part: header fields, blank line, body) made fit."""
        if not self.unfit(text):
            return text
        if depth > _MAX_DEPTH:
            raise UnconvertibleError(f"its MIME parts nest more than {_MAX_DEPTH} levels deep")
        head, blank, body = _split(text)
        self._check_head(head, top=top)
        fields = _fields(head, default_type)
        ctype = fields.get_content_type()
        encoding = str(fields.get("content-transfer-encoding", "")).strip().lower()
        if fields.get_content_maintype() == "multipart":
            body = self._multipart(body, fields, ctype, depth=depth)
        elif ctype == "message/rfc822":
            # RFC 2046 §5.2.1: a message part is never encoded; the message inside is.
            body = self.entity(body, "text/plain", depth=depth + 1, top=False)
        elif self.unfit(body):
            return self._leaf(head, body, fields, encoding, top=top)
        if encoding not in ("", "7bit") and not self.eight_bit and body.isascii():
            head = _with_encoding(head, "7bit")  # RFC 2045 §6.4: a container says what it holds
        return head + blank + body

    def _check_head(self, head: bytes, *, top: bool) -> None:
        where = "the message's header fields" if top else "the header fields of a MIME part"
        if _has_long_line(head):
            raise UnconvertibleError(f"a line of {where} is longer than {MAX_LINE} octets")
        if not (self.eight_bit or self.utf8_headers) and not head.isascii():
            raise UnconvertibleError(f"{where} hold 8-bit octets, which no transfer encoding may carry")

    def _multipart(self, body: bytes, fields: Message, ctype: str, *, depth: int) -> bytes:
        """Return a multipart body with each part made fit, its delimiters as they were."""
        boundary = fields.get_boundary()
        if not boundary:
            raise UnconvertibleError(f"a {ctype} part has no boundary to find its parts by")
        marker = re.escape(boundary.encode("ascii", "surrogateescape"))
        delimiter = re.compile(rb"(?:\A|\r\n)--" + marker + rb"(--)?[ \t]*(?=\r\n|\Z)")
        default_type = "message/rfc822" if ctype == "multipart/digest" else "text/plain"
        pieces: list[bytes] = []
        position = 0  # where the delimiter before the part being read begins
        start: int | None = None  # where the part being read begins
        for found in delimiter.finditer(body):
            if start is None:
                pieces.append(self._ignored(body[: found.start()]))
            else:
                pieces += [
                    body[position:start],
                    self.entity(body[start : found.start()], default_type, depth=depth + 1, top=False),
                ]
            position, start = found.start(), min(found.end() + 2, len(body))
            if found.group(1):  # the close delimiter: what follows is the epilogue
                return b"".join([*pieces, body[position:start], self._ignored(body[start:])])
        if start is None:
            raise UnconvertibleError(f"a {ctype} part holds no part delimited by its boundary")
        # No close delimiter: the last part runs to the end, as readers take it.
        pieces += [body[position:start], self.entity(body[start:], default_type, depth=depth + 1, top=False)]
        return b"".join(pieces)

    def _ignored(self, text: bytes) -> bytes:
        # RFC 2046 §5.1.1: a preamble or epilogue is to be ignored; one that cannot
        # go is left out rather than encoded.
        return b"" if self.unfit(text) else text

    def _leaf(self, head: bytes, body: bytes, fields: Message, encoding: str, *, top: bool) -> bytes:
        """Return a part that is no container with its content re-encoded."""
        content = _decoded(body, encoding)
        if fields.get_content_maintype() == "text" or fields.get_content_type().startswith("message/"):
            quoted, base64ed = _quoted_printable(content), _base64(content)
            # Quoted-printable keeps Latin text legible to people and filters, so
            # base64 is taken only where it saves a tenth or more (other scripts).
            use_base64 = len(base64ed) * 10 <= len(quoted) * 9
            name, encoded = ("base64", base64ed) if use_base64 else ("quoted-printable", quoted)
        else:
            name, encoded = "base64", _base64(content)
        head = _with_encoding(head, name)
        if top and "mime-version" not in fields:
            # A message without MIME-Version is not MIME (RFC 2045 §4): its new
            # encoding would not be read. UTF-8 is named when the text is UTF-8, else
            # RFC 1428's unknown-8bit, which says that no character set was given.
            head += b"MIME-Version: 1.0\r\n"
            if "content-type" not in fields:
                head += b"Content-Type: text/plain; charset=" + _charset_of(content) + b"\r\n"
        return head + b"\r\n" + encoded


def _split(text: bytes) -> tuple[bytes, bytes, bytes]:
    """Return the header block (each field with its CRLF), the blank line, and the body."""
    if text.startswith(b"\r\n"):  # a part without header fields (RFC 2046 §5.1.1)
        return b"", b"\r\n", text[2:]
    end = text.find(_HEAD_END)
    if end == -1:
        return text, b"", b""
    return text[: end + 2], b"\r\n", text[end + 4 :]


def _fields(head: bytes, default_type: str) -> Message:
    fields = HeaderParser(policy=email.policy.compat32).parsestr(head.decode("ascii", "surrogateescape"))
    fields.set_default_type(default_type)
    return fields


def _decoded(body: bytes, encoding: str) -> bytes:
    """Return the octets ``body`` stands for under its transfer ``encoding``."""
    if encoding in _IDENTITY:
        return body
    if encoding == "quoted-printable":
        return binascii.a2b_qp(body)
    if encoding == "base64":
        # Characters outside the alphabet are skipped, as every reader skips them.
        return base64.b64decode(re.sub(rb"[^A-Za-z0-9+/=]", b"", body) + b"==")
    raise UnconvertibleError(f"a part's transfer encoding {encoding!r} is unknown")


def _quoted_printable(content: bytes) -> bytes:
    """Return ``content`` as quoted-printable, its CRLFs as hard line breaks (RFC 2045 §6.7)."""
    # b2a_qp wraps at 76 with soft breaks ("=" LF) and, not told it is text,
    # encodes no LF of the content: every LF in its output ends a soft break.
    lines = (
        binascii.b2a_qp(line, quotetabs=False, istext=False).replace(b"\n", b"\r\n") for line in content.split(b"\r\n")
    )
    return b"\r\n".join(lines)


def _base64(content: bytes) -> bytes:
    encoded = base64.b64encode(content)
    lines = [encoded[i : i + _BASE64_LINE] for i in range(0, len(encoded), _BASE64_LINE)]
    return b"\r\n".join(lines) + b"\r\n"


def _with_encoding(head: bytes, name: str) -> bytes:
    """Return ``head`` with its Content-Transfer-Encoding field (if any) replaced by ``name``."""
    return _CTE_FIELD.sub(b"", head) + b"Content-Transfer-Encoding: " + name.encode("ascii") + b"\r\n"


def _charset_of(content: bytes) -> bytes:
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return b"unknown-8bit"
    return b"utf-8"
