"""Envelope addresses as RFC 5321 §4.1.2 defines them, with RFC 6531's UTF-8 extension.

Only the syntax an SMTP server would accept in ``MAIL FROM`` / ``RCPT TO`` passes: a
``Dot-string`` or ``Quoted-string`` local part, an ``@``, and a domain or an address
literal, within §4.5.3.1's size limits. Non-ASCII text is accepted where SMTPUTF8
allows it; whether a given server takes it is decided at delivery.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import string
import unicodedata

from .errors import ErrorCode, QueueError
from .text import unkeepable_reason

# RFC 5321 §4.5.3.1: the limits a server must accept, in octets.
MAX_LOCAL_PART = 64
MAX_DOMAIN = 255
MAX_PATH = 256  # including the angle brackets

# The classes are written as what they exclude: "any character but these" compiles
# in microseconds, where a range up to U+10FFFF costs the regex compiler milliseconds
# in every process that imports this module.
# atext (RFC 5322 §3.2.3) or any non-ASCII character (RFC 6531).
_ATEXT = r'[^\x00-\x20\x7f"(),.:;<>@\[\\\]]'
_DOT_STRING = re.compile(rf"{_ATEXT}+(?:\.{_ATEXT}+)*")
# qtextSMTP is %d32-33 / %d35-91 / %d93-126, or non-ASCII; quoted-pairSMTP is "\" %d32-126.
_QUOTED_STRING = re.compile(r'"(?:[^\x00-\x1f\x7f"\\]|\\[\x20-\x7e])*"')
# A label: letters, digits or non-ASCII, with hyphens inside.
_LET_DIG = r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]"
_LDH = r"[^\x00-\x2c\x2e\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]"
_LABEL = re.compile(rf"{_LET_DIG}(?:{_LDH}*{_LET_DIG})?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Unicode's controls (Cc: C0 and C1), format characters (Cf: bidi embeddings,
# overrides and isolates, U+061C, zero-width spaces, U+FEFF...) and the line and
# paragraph separators (Zl, Zp). None is visible: in a log line or the admin they
# reorder or hide what is around them, and Python's str.splitlines() breaks a DSN's
# To header at U+2028 (RFC 3464 §2.1: a DSN goes to the envelope sender).
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# ZWNJ and ZWJ are spelling in Persian and Indic scripts, which IDNA allows in
# labels (RFC 5892 Appendix A.1, A.2) and RFC 6531 allows in local parts.
_JOINERS = frozenset({"\u200c", "\u200d"})
_GENERAL_LITERAL = re.compile(r"[A-Za-z0-9-]*[A-Za-z0-9]:[\x21-\x5a\x5e-\x7e]+")


def _invisible_character(address: str) -> str | None:
    """Return the first control or format character of a non-ASCII ``address``, if any."""
    for char in address:
        if not char.isascii() and char not in _JOINERS and unicodedata.category(char) in _INVISIBLE_CATEGORIES:
            return char
    return None


def _local_part_problem(local: str) -> str | None:
    if not local:
        return "the local part before the @ is empty"
    if len(local.encode("utf-8")) > MAX_LOCAL_PART:
        return f"the local part is longer than {MAX_LOCAL_PART} octets"
    if _DOT_STRING.fullmatch(local) or _QUOTED_STRING.fullmatch(local):
        return None
    return "the local part is neither a dot-atom nor a quoted string (RFC 5321 §4.1.2)"


def a_labels(domain: str) -> str:
    """Return ``domain`` as DNS and a server without SMTPUTF8 know it: IDNA2008 A-labels.

    An ASCII domain is returned as it is. A Unicode one goes through UTS #46's
    non-transitional mapping, then IDNA2008 (RFC 5891 §4), as browsers and Postfix
    do: ``straße.example`` is ``xn--strae-oqa.example``, where IDNA2003 (Python's
    ``"idna"`` codec) would give ``strasse.example``, another domain. STD3 rules keep
    the result a host name (RFC 1123 §2.1): a mapping may not make ``⑴`` into ``(1)``.
    Raises ``UnicodeError`` when IDNA2008 refuses the domain.
    """
    if domain.isascii():
        return domain
    import idna  # here: most domains are ASCII, and a process may never meet another

    return idna.encode(domain, uts46=True, std3_rules=True).decode("ascii")


def u_labels(domain: str) -> str:
    """Return a domain in A-labels as a person writes it: IDNA2008 U-labels, lowercase.

    ``xn--bcher-kva.example`` is ``bücher.example``; an ASCII domain without A-labels
    comes back lowercase. Raises ``UnicodeError`` for an A-label that is none.
    """
    import idna

    return str(idna.decode(domain))


def _idna_problem(domain: str) -> str | None:
    """Say why IDNA2008 refuses a Unicode ``domain``, or return ``None``."""
    try:
        a_labels(domain)
    except UnicodeError as error:
        return f"IDNA2008 refuses the domain ({error})"
    return None


def _label_problem(label: str) -> str | None:
    if not _LABEL.fullmatch(label):
        return f"the domain label {label!r} is not letters, digits and inner hyphens"
    if label.isascii() and len(label) > 63:
        return f"the domain label {label[:20]!r}... is longer than 63 characters"
    return None


def _literal_problem(literal: str) -> str | None:
    inner = literal[1:-1]
    if inner.lower().startswith("ipv6:"):
        try:
            ipaddress.IPv6Address(inner[5:])
        except ValueError:
            return "the IPv6 address literal is not an IPv6 address"
        return None
    try:
        ipaddress.IPv4Address(inner)
    except ValueError:
        if _GENERAL_LITERAL.fullmatch(inner):
            return None
        return "the address literal is not an IPv4, IPv6 or general address literal"
    return None


def domain_problem(domain: str) -> str | None:
    """Say what is wrong with ``domain`` as the domain of a mailbox (RFC 5321 §4.1.2,
    IDNA2008 for a Unicode one; an address literal too), or return ``None``."""
    if not domain:
        return "the domain after the @ is empty"
    if domain.startswith("[") and domain.endswith("]"):
        return _literal_problem(domain)
    if len(domain.encode("utf-8")) > MAX_DOMAIN:
        return f"the domain is longer than {MAX_DOMAIN} octets"
    for label in domain.split("."):
        problem = _label_problem(label)
        if problem:
            return problem
    return _idna_problem(domain)


# The answer depends on the address alone, and most mail comes from one sender: the
# answers for the addresses seen lately are kept (a few microseconds an enqueue).
@functools.lru_cache(maxsize=1024)
def mailbox_problem(address: str) -> str | None:
    """Say what is wrong with ``address`` as an RFC 5321 mailbox, or return ``None``."""
    reason = unkeepable_reason(address)
    if reason:
        return reason
    if _CONTROL.search(address):
        return "it holds a control character (CR, LF, TAB or another)"
    if not address.isascii():
        invisible = _invisible_character(address)
        if invisible is not None:
            return f"it holds U+{ord(invisible):04X}, an invisible control or format character"
    if len(address.encode("utf-8")) + 2 > MAX_PATH:
        return f"it is longer than {MAX_PATH - 2} octets"
    local, at, domain = address.rpartition("@")
    if not at:
        return "it has no @"
    return _local_part_problem(local) or domain_problem(domain)


def check_mailbox(address: str, *, role: str) -> str:
    """Return ``address`` if it is a valid mailbox, else raise ``QueueError(INVALID)``.

    ``role`` names the address in the message (``"recipient"``, ``"sender"``).
    """
    problem = mailbox_problem(address)
    if problem:
        raise QueueError(
            ErrorCode.INVALID,
            f"The {role} address {address!r} cannot be queued: {problem}.",
            recipient=address if role == "recipient" else None,
        )
    return address


def check_sender(address: str) -> str:
    """Return the envelope sender; ``""`` is the null sender ``<>`` (RFC 5321 §4.5.5)."""
    if address == "":
        return address
    return check_mailbox(address, role="sender")


def needs_smtputf8(address: str) -> bool:
    """Return whether the address can only travel with SMTPUTF8 (RFC 6531): whether its
    local part is UTF-8. A Unicode domain travels as A-labels (:func:`envelope_form`)."""
    return not address.rpartition("@")[0].isascii()


def envelope_form(address: str) -> str:
    """Return ``address`` as it goes in ``MAIL FROM`` / ``RCPT TO``: its local part as
    written, its domain in A-labels.

    A-labels are sent whether or not the server offers SMTPUTF8: RFC 6531 §3.3 lets a
    domain be written either way, every server reads A-labels, and so the choice of
    ``SMTPUTF8`` depends only on local parts and header fields. An address literal
    and the null sender are returned as they are; so is a domain IDNA2008 refuses
    (enqueue refused it, and delivery checks the address before it gets here).
    """
    local, at, domain = address.rpartition("@")
    if not at or domain.isascii():
        return address
    try:
        return f"{local}@{a_labels(domain)}"
    except UnicodeError:
        return address


def normal_domain(domain: str) -> str:
    """Return the form domains are compared in: lowercase IDNA2008 A-labels
    (:func:`a_labels`), no trailing dot. A domain IDNA2008 refuses is returned
    lowercase, as no A-label form can equal it."""
    domain = domain.rstrip(".").lower()
    try:
        return a_labels(domain)
    except UnicodeError:
        return domain


def normal_address(address: str) -> str:
    """Return the form addresses are compared in (the suppression list's key): the
    local part as written, the domain as :func:`normal_domain` gives it.

    RFC 5321 §2.4: a local part "MUST be treated as case sensitive" by every host but
    its own, so ``Ann@example.org`` and ``ann@example.org`` stay two addresses; the
    domain is DNS's, where case means nothing and ``bücher.example`` is
    ``xn--bcher-kva.example``.
    """
    local, at, domain = address.rpartition("@")
    if not at:
        return address
    return f"{local}@{normal_domain(domain)}"


def domain_of(address: str) -> str:
    """Return the domain of an address, lowercased, after its last ``@``: the key of routes,
    limits, the delivery log and the queue's shape.

    A trailing dot goes: ``example.org.`` is the fully qualified form of the same domain
    (RFC 1034 §3.1), as an operator may type it in a filter.
    """
    return address.rpartition("@")[2].rstrip(".").lower()


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def ascii_lower(text: str) -> str:
    """Return ``text`` with its ASCII letters lowercase, and nothing else changed: the
    case rule every store can apply in its own query (SQLite's ``lower()``, Lua's)."""
    return text.translate(_ASCII_LOWER)
