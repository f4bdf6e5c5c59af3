"""The staging firewall's rules: which recipients ``ALLOW_RECIPIENTS`` lets mail go to.

A pattern is a domain or an address, ``*`` standing for any text (as in the bulk
actions' address patterns), case ignored, a Unicode domain compared in IDNA2008
A-labels as ``addresses.normal_domain`` gives it:

- ``example.com``: every address at example.com (not at its subdomains);
- ``*.example.org``: every address at a subdomain of example.org;
- ``qa+*@example.net``: the addresses of that form at example.net;
- ``ann@example.com``: that address alone.

Everything here is pure: ``screening`` applies the rules to the items an enqueue adds,
and marks the items they held or redirected for the admin.
"""

from __future__ import annotations

import dataclasses
import email.header
import re
from collections.abc import Iterable, Sequence

from .addresses import domain_problem, envelope_form, normal_domain

#: The header field a redirected message gets: the recipients it was meant for.
ORIGINAL_RECIPIENTS_FIELD = "X-Bumail-Original-Recipients"
_FIELD_KEY = ORIGINAL_RECIPIENTS_FIELD.lower().encode("ascii")
# RFC 5322 §2.1.1: lines of at most 78 characters, where a field can be folded.
_FOLD_AT = 78
_LOCAL_PATTERN_BAD = re.compile(r"[\s\x00-\x1f\x7f]")


@dataclasses.dataclass(frozen=True, slots=True)
class RecipientPattern:
    """One entry of ``ALLOW_RECIPIENTS``, compiled: its local part's pattern (``None``
    for a bare domain, which matches every local part) and its domain's."""

    text: str
    local: re.Pattern[str] | None
    domain: re.Pattern[str]

    def matches(self, address: str) -> bool:
        """Return whether ``address`` is one the pattern allows."""
        local, at, domain = address.rpartition("@")
        if not at:
            return False
        if self.local is not None and not self.local.fullmatch(local):
            return False
        return self.domain.fullmatch(normal_domain(domain)) is not None


def _wildcard(text: str) -> re.Pattern[str]:
    """``*`` for any text, the rest literal, case ignored."""
    return re.compile(".*".join(re.escape(part) for part in text.split("*")), re.IGNORECASE | re.DOTALL)


def _domain_form(domain: str) -> str:
    """The domain of a pattern as addresses' domains are compared: each label without
    ``*`` in A-labels, lowercase, no trailing dot."""
    labels = domain.rstrip(".").lower().split(".")
    return ".".join(label if "*" in label else normal_domain(label) for label in labels)


def pattern_problem(text: object) -> str | None:
    """Say why ``text`` is not a recipient pattern, or return ``None``."""
    if not isinstance(text, str) or not text.strip():
        return "is not a domain or an address (a non-empty string)"
    local, at, domain = text.strip().rpartition("@")
    if at and (not local or _LOCAL_PATTERN_BAD.search(local)):
        return "has an empty local part, or one with a space or a control character"
    if any("*" in label and not label.isascii() for label in domain.split(".")):
        return "has a non-ASCII domain label with '*' in it; write '*' as a label of its own"
    problem = domain_problem(domain.rstrip(".").replace("*", "x"))
    if problem is not None:
        return f"is not a domain or an address pattern ({problem})"
    return None


def parse_pattern(text: str) -> RecipientPattern:
    """Return the compiled pattern; raise ``ValueError`` for one ``pattern_problem`` refuses."""
    problem = pattern_problem(text)
    if problem is not None:
        raise ValueError(f"{text!r} {problem}")
    local, at, domain = text.strip().rpartition("@")
    return RecipientPattern(text=text, local=_wildcard(local) if at else None, domain=_wildcard(_domain_form(domain)))


@dataclasses.dataclass(frozen=True, slots=True)
class Firewall:
    """``ALLOW_RECIPIENTS`` and ``REDIRECT_TO`` of valid settings: mail to any other
    recipient is held, or with ``redirect_to`` sent there instead."""

    patterns: tuple[RecipientPattern, ...]
    redirect_to: str | None = None

    @classmethod
    def of(cls, allow: Iterable[str], redirect_to: str | None = None) -> Firewall:
        """Return the firewall of valid settings' patterns."""
        return cls(patterns=tuple(map(parse_pattern, allow)), redirect_to=redirect_to)

    def allows(self, address: str) -> bool:
        """Return whether mail may go to ``address``."""
        return any(pattern.matches(address) for pattern in self.patterns)

    def split(self, recipients: Sequence[str]) -> tuple[list[str], list[str]]:
        """Return ``recipients`` the firewall allows, and the others, each in order."""
        allowed: list[str] = []
        stopped: list[str] = []
        for address in recipients:
            (allowed if self.allows(address) else stopped).append(address)
        return allowed, stopped


def original_recipients_field(addresses: Sequence[str], eol: bytes = b"\r\n") -> bytes:
    """Return the ``X-Bumail-Original-Recipients`` field naming ``addresses``, folded
    after a comma to lines of at most 78 characters, ending in ``eol``.

    Domains are written in A-labels; an address whose local part is not ASCII as an
    RFC 2047 encoded word, so that the field asks no SMTPUTF8 of the server it goes to.
    """
    tokens: list[str] = []
    for index, address in enumerate(addresses):
        words = _field_words(address)
        if index < len(addresses) - 1:
            words[-1] += ","
        tokens += words
    name = f"{ORIGINAL_RECIPIENTS_FIELD}:"
    lines = [name]
    for token in tokens:
        # A line holding no address yet takes the next, however long (an address is
        # at most 254 octets, well under RFC 5322's 998).
        if lines[-1] not in (name, "") and len(lines[-1]) + 1 + len(token) > _FOLD_AT:
            lines.append("")
        lines[-1] += " " + token
    return eol.join(line.encode("ascii") for line in lines) + eol


def _field_words(address: str) -> list[str]:
    """The words an address is written in: itself, or RFC 2047 encoded words of at
    most 75 characters (§2) when its local part is not ASCII."""
    form = envelope_form(address)
    if form.isascii():
        return [form]
    return email.header.Header(form, "utf-8").encode(maxlinelen=76).split()


def with_original_recipients(message: bytes, addresses: Sequence[str]) -> bytes:
    """Return ``message`` with an ``X-Bumail-Original-Recipients`` field naming
    ``addresses`` at the top of its header, in place of any it had."""
    first_end = message.find(b"\n")
    eol = b"\r\n" if first_end > 0 and message[first_end - 1 : first_end] == b"\r" else b"\n"
    return original_recipients_field(addresses, eol) + _without_field(message, eol)


def _without_field(message: bytes, eol: bytes) -> bytes:
    """``message`` without its ``X-Bumail-Original-Recipients`` fields (and their
    continuation lines); the body is left as it is."""
    end = message.find(eol + eol)
    head_end = len(message) if end == -1 else end + len(eol)
    if _FIELD_KEY not in message[:head_end].lower():
        return message
    kept: list[bytes] = []
    dropping = False
    for line in message[:head_end].split(eol)[:-1]:
        if line[:1] in (b" ", b"\t"):
            if not dropping:
                kept.append(line)
            continue
        dropping = line.partition(b":")[0].strip().lower() == _FIELD_KEY
        if not dropping:
            kept.append(line)
    return b"".join(line + eol for line in kept) + message[head_end:]


def original_recipients(head: bytes) -> list[str] | None:
    """Return the addresses a message's ``X-Bumail-Original-Recipients`` field names,
    or ``None`` when its header (``head``: the message, or its first bytes) has none."""
    value = _field_value(head)
    if value is None:
        return None
    decoded = str(email.header.make_header(email.header.decode_header(value)))
    return [address.strip() for address in decoded.split(",") if address.strip()]


def _field_value(head: bytes) -> str | None:
    lines = re.split(rb"\r?\n", head)
    for index, line in enumerate(lines):
        if not line:
            return None  # the header's end
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == _FIELD_KEY:
            parts = [value]
            for more in lines[index + 1 :]:
                if more[:1] not in (b" ", b"\t"):
                    break
                parts.append(more)
            return b" ".join(part.strip() for part in parts).decode("utf-8", errors="replace")
    return None
