"""The suppression list: which outcomes put an address on it or take it off, and its values.

An address is suppressed when a permanent failure says that its mailbox or its domain
does not exist (``SUPPRESSING_STATUSES``), or when its delivery time expired
(``MAX_AGE``, ``4.4.7``) twice within ``SUPPRESSION_EXPIRY_WINDOW``; a delivery to it
takes such an entry off (``DISPROVED_BY_DELIVERY``), and so does its expiry
(``SUPPRESSION_DURATION``). An entry is of all mail or of one channel's (its scope).
The worker checks a claim's recipients against the list before it routes them: a
suppressed recipient fails at once with ``suppressed_reply()``, without a session.

These are values and pure functions; the stores keep the entries (``QueueStore``'s
suppression methods), the worker and its recorder apply them.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import hmac
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, cast

from django.conf import settings

from .addresses import ascii_lower, normal_address, normal_domain
from .errors import ErrorCode, QueueError
from .items import CHANNEL_PATTERN, Outcome, RecipientStatus, Reply, reply_line
from .text import is_keepable

__all__ = [
    "DISPROVED_BY_DELIVERY",
    "DNS_VERDICTS",
    "FORGOTTEN_LABEL",
    "FORGOTTEN_PREFIX",
    "GLOBAL_SCOPE",
    "SCOPE_KINDS",
    "SUPPRESSED_STATUS",
    "SUPPRESSING_STATUSES",
    "Suppression",
    "SuppressionChange",
    "SuppressionReason",
    "SuppressionUpdate",
    "address_holds",
    "ascii_lower",
    "change_from",
    "channel_scope",
    "entry_in",
    "forgotten_key",
    "is_forgotten",
    "is_scope",
    "lookup_keys",
    "require_scope",
    "scope_label",
    "scopes_of",
    "search_form",
    "suppressed_reply",
    "suppresses",
]

SUPPRESSING_STATUSES: Final = frozenset(
    {
        # RFC 3463 §3.2. X.1.1: "The mailbox specified in the address does not exist."
        "5.1.1",
        # X.1.2: "The destination system specified in the address does not exist or is
        # incapable of accepting mail" (also what our DNS lookup says for NXDOMAIN).
        "5.1.2",
        # X.1.3: "The destination address was syntactically invalid": it can never work.
        "5.1.3",
        # X.1.6: "The mailbox address provided was at one time valid, but mail is no
        # longer being accepted for that address" (no forwarding address).
        "5.1.6",
        # RFC 7505 §4.2: "Recipient address has null MX": the domain takes no mail.
        "5.1.10",
        # RFC 3463 §3.3. X.2.1: "The mailbox exists, but is not accepting messages";
        # in class 5 the server says it is for good (Gmail answers so for a disabled
        # account; KumoMTA classes it InactiveMailbox).
        "5.2.1",
        # RFC 7293 (RRVS): the mailbox's or the domain's owner has changed since.
        "5.7.17",
        "5.7.18",
    }
)
"""The enhanced status codes of a permanent failure that suppress its address: those
that say the mailbox or the domain does not exist or will take no mail, KumoMTA's
*InvalidRecipient*, *BadDomain* and *InactiveMailbox* classes in class 5. Not the
policy codes (``5.7.1``, a block of *our* mail: suppressing would punish the
recipient for our reputation), not the vague ``5.1.0`` or ``5.0.0``, and not a reply
without an enhanced status, which may be either."""

DNS_VERDICTS: Final = frozenset({"5.1.2", "5.1.10"})
"""The suppressing statuses our own DNS lookup gives (no SMTP reply): the domain does
not exist, has no mail host, or publishes a null MX. Our other local failures (an
address ``smtplib`` cannot send to a server without SMTPUTF8, ``5.1.3``) are about a
session, not the address, and suppress nothing."""

SUPPRESSED_STATUS: Final = "5.7.1"
"""The status of a recipient failed because it is suppressed: RFC 3463's X.7.1,
"delivery not authorized, message refused ... the result of per-host or
per-recipient filtering", which is what the list is; Momentum and SparkPost answer a
suppressed recipient with it too. Not the cause's own status: the cause was another
message's, and an expiry's (``4.4.7``) is not even permanent."""


GLOBAL_SCOPE: Final = ""
"""The scope of an entry that suppresses its address for all mail."""


SCOPE_KINDS: Final = ("channel", "tenant")
"""The kinds of scope an entry may name besides the global one (``tenant`` is kept and
looked up like any other, for a site that scopes by its own tenants)."""


def channel_scope(channel: str) -> str:
    """Return the scope of an entry that suppresses its address for ``channel``'s mail alone.

    Scopes are strings named by kind (``channel:newsletter``), so that a tenant's
    (``tenant:...``) can join them without a change to the stores.
    """
    return f"channel:{channel}"


def scopes_of(channel: str) -> tuple[str, str]:
    """Return the scopes whose entries suppress mail of ``channel``, the global one first."""
    return (GLOBAL_SCOPE, channel_scope(channel))


def entry_in(entries: Iterable[Suppression], scopes: Sequence[str]) -> Suppression | None:
    """Return the entry of ``entries`` (one address's) in the first of ``scopes`` that
    has one, or ``None``: how a lookup in several scopes picks what suppresses."""
    by_scope = {entry.scope: entry for entry in entries}
    return next((by_scope[scope] for scope in scopes if scope in by_scope), None)


def is_scope(scope: object) -> bool:
    """Return whether ``scope`` is the global scope or a kind's (``channel:<a channel name>``)."""
    if not isinstance(scope, str):
        return False
    kind, colon, name = scope.partition(":")
    return scope == GLOBAL_SCOPE or (bool(colon) and kind in SCOPE_KINDS and bool(CHANNEL_PATTERN.fullmatch(name)))


def require_scope(scope: object) -> str:
    """Return ``scope``, or raise ``QueueError(INVALID)`` for one ``is_scope`` refuses."""
    if not is_scope(scope):
        raise QueueError(
            ErrorCode.INVALID,
            f"A suppression's scope is '' (all mail), 'channel:<channel>' or 'tenant:<name>'; got {scope!r}.",
        )
    return cast(str, scope)


def scope_label(scope: str) -> str:
    """Return how pages and exports show ``scope``: ``all mail`` for the global one."""
    return scope or "all mail"


class SuppressionReason(enum.StrEnum):
    """Why an address is on the list."""

    FAILED = "failed"
    """A permanent failure said that its mailbox or its domain does not exist."""
    EXPIRED = "expired"
    """Its delivery time expired (``MAX_AGE``) twice within ``SUPPRESSION_EXPIRY_WINDOW``."""
    MANUAL = "manual"
    """An operator added it (the admin, ``manage.py queue_suppression add``)."""
    BOUNCED = "bounced"
    """A report that came back after the mail was handed on said it failed for good."""
    COMPLAINED = "complained"
    """Its recipient reported the mail as spam (a feedback loop's report, an ESP's event)."""
    UNSUBSCRIBED = "unsubscribed"
    """Its recipient unsubscribed at an ESP (its event)."""


DISPROVED_BY_DELIVERY: Final = frozenset({SuppressionReason.FAILED, SuppressionReason.EXPIRED})
"""The reasons of the entries a delivery takes off: a session's verdict that the mailbox
does not exist, which a later session's acceptance contradicts. Not a bounce, a
complaint, an unsubscribe or an operator's entry: a delivery that raced one of them (a
bounce read back while the recorder was still writing the message's own delivery,
behind a smarthost that accepts everything) says nothing against it."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Suppression:
    """An entry of the suppression list.

    ``address`` is in ``addresses.normal_address``'s form; ``reply`` the reply that
    put it there (an operator's note, with no code and no status, for ``manual``).
    The entry is in force until ``expires_at``, for all mail (``GLOBAL_SCOPE``) or for
    its ``scope``'s alone (``channel_scope()``).
    """

    address: str
    reason: SuppressionReason
    reply: Reply
    created_at: datetime
    expires_at: datetime
    scope: str = GLOBAL_SCOPE

    def is_in_force(self, now: datetime) -> bool:
        """Return whether the entry still suppresses its address at ``now``."""
        return self.expires_at > now

    @property
    def forgotten(self) -> bool:
        """Whether the entry is an erased address's, kept under its ``forgotten_key``."""
        return is_forgotten(self.address)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form a store keeps (times are kept by the store, in its own form)."""
        data = {"reason": self.reason.value, "reply": self.reply.to_dict()}
        if self.scope != GLOBAL_SCOPE:
            data["scope"] = self.scope
        return data

    @classmethod
    def from_dict(
        cls, address: str, data: Mapping[str, Any], *, created_at: datetime, expires_at: datetime
    ) -> Suppression:
        """Build an entry from its JSON form and its times."""
        return cls(
            address=address,
            reason=SuppressionReason(data["reason"]),
            reply=Reply.from_dict(data["reply"]),
            created_at=created_at,
            expires_at=expires_at,
            scope=data.get("scope", GLOBAL_SCOPE),
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SuppressionChange:
    """What a store writes to the list in one step (``QueueStore.update_suppressions``).

    ``add`` puts entries on the list, replacing any for their addresses. ``expired``
    holds one expiry each: an address whose first expiry is noted (until
    ``note_until``) is suppressed, as its entry there says, when a second comes while
    the note lasts. ``clear`` takes addresses off: their entries and their notes. An
    address is in one of the three at most, in ``addresses.normal_address``'s form.

    ``clear`` holds delivered addresses: each loses its note, and its global entry if
    a delivery disproves it (``DISPROVED_BY_DELIVERY``). A delivery proves that a
    mailbox takes mail, not that its owner wants back a channel they left, nor that a
    bounce read since was wrong. ``clear_scoped`` takes entries off whatever their
    reason (an operator's removal), as ``(address, scope)`` pairs; the global scope's
    with the address's note.
    """

    add: tuple[Suppression, ...] = ()
    expired: tuple[Suppression, ...] = ()
    note_until: datetime | None = None
    clear: tuple[str, ...] = ()
    clear_scoped: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.expired or self.clear or self.clear_scoped)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SuppressionUpdate:
    """What an update did: the entries now in force that it wrote (added, or a second
    expiry's), and the addresses it took off whose entries were in force."""

    suppressed: tuple[Suppression, ...] = ()
    removed: tuple[str, ...] = ()


FORGOTTEN_PREFIX: Final = "hmac-sha256:"
"""How the key of an erased address's entries begins (``forgotten_key``)."""

FORGOTTEN_LABEL: Final = "(forgotten address)"
"""How pages, commands and exports name the address of such an entry."""

_FORGOTTEN_SALT: Final = "bumail_queue.suppression.forgotten_key"


def forgotten_key(address: str) -> str:
    """Return the key an erased address's entries are kept under: ``hmac-sha256:`` and the
    hex HMAC-SHA256 of its ``normal_address`` form, keyed by ``SECRET_KEY`` through
    Django's ``salted_hmac`` with a salt of its own.

    The list then says nothing of the address to whoever reads it, yet a lookup of
    the address finds the entry (``lookup_keys``); a key of the list is returned as it is.
    """
    key = normal_address(address)
    return key if is_forgotten(key) else _hashed(_keyed(str(settings.SECRET_KEY)), key)


def _hashed(keyed: hmac.HMAC, key: str) -> str:
    # Django's salted_hmac, with its derived key and its HMAC's key schedule made once
    # per SECRET_KEY: each lookup of a claim's recipients pays one hash per address.
    mac = keyed.copy()
    mac.update(key.encode("utf-8", "surrogatepass"))
    return FORGOTTEN_PREFIX + mac.hexdigest()


@functools.lru_cache(maxsize=4)
def _keyed(signing_key: str) -> hmac.HMAC:
    """The HMAC Django's ``salted_hmac`` starts from, with this module's salt and SHA-256,
    for ``signing_key`` (part of the cache's key, so a changed SECRET_KEY is heeded)."""
    return hmac.new(hashlib.sha256((_FORGOTTEN_SALT + signing_key).encode()).digest(), digestmod=hashlib.sha256)


def is_forgotten(address: str) -> bool:
    """Return whether ``address`` is the key of an erased address's entries (``forgotten_key``)."""
    return address.startswith(FORGOTTEN_PREFIX)


def lookup_keys(addresses: Iterable[str]) -> dict[str, list[str]]:
    """Return the keys a lookup of ``addresses`` reads on the list, each with the
    addresses given that it answers for: an address's ``normal_address`` form and its
    ``forgotten_key``, so that one round trip finds its entries whether or not it was
    erased. An address no store can keep (``text.is_keepable``) is left out.
    """
    keys: dict[str, list[str]] = {}
    keyed = _keyed(str(settings.SECRET_KEY))
    for address in addresses:
        if not is_keepable(address):
            continue
        key = normal_address(address)
        keys.setdefault(key, []).append(address)
        if not is_forgotten(key):
            keys.setdefault(_hashed(keyed, key), []).append(address)
    return keys


def search_form(text: str) -> str:
    """Return a search text in the form the list keeps addresses, ASCII-lowercase.

    Its domain part (after an ``@``, or the whole text without one) in A-labels when it
    is not ASCII, so ``ann@Bücher.example`` and ``bücher`` find ``ann@xn--bcher-kva.example``.
    """
    local, at, domain = text.rpartition("@")
    if not domain.isascii():
        domain = normal_domain(domain)
    return ascii_lower(f"{local}{at}{domain}")


def address_holds(address: str, text: str) -> bool:
    """Return whether a kept ``address`` holds ``text`` (in ``search_form``), as stores compare."""
    return text in ascii_lower(address)


def suppresses(reply: Reply) -> bool:
    """Return whether a permanent failure with ``reply`` puts its address on the list.

    A server's reply suppresses when its enhanced status is one of
    ``SUPPRESSING_STATUSES``; a failure of ours (no reply code) only when our DNS
    lookup gave it (``DNS_VERDICTS``).
    """
    status = reply.status.strip()
    if reply.code is None:
        return status in DNS_VERDICTS
    return reply.code // 100 == 5 and status in SUPPRESSING_STATUSES


def suppressed_reply(entry: Suppression) -> Reply:
    """Return the reply of a recipient failed because ``entry`` suppresses it.

    No server gave it (``code`` is ``None``), as for any failure of the queue's own;
    its text says that the address is suppressed, until when, and why.
    """
    until = entry.expires_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = f"Recipient address suppressed until {until}: {_cause(entry)}"
    return Reply(code=None, status=SUPPRESSED_STATUS, text=text[:512])


def _cause(entry: Suppression) -> str:
    if entry.reason == SuppressionReason.MANUAL:
        note = entry.reply.text.strip()
        return f"added by an operator ({note})" if note else "added by an operator"
    said = reply_line(entry.reply) or "no reply"
    if entry.reason == SuppressionReason.EXPIRED:
        return f"its delivery time expired twice; the last time: {said}"
    if entry.reason == SuppressionReason.BOUNCED:
        return f"an earlier message bounced with {said}"
    if entry.reason == SuppressionReason.COMPLAINED:
        return "its recipient reported an earlier message as spam"
    if entry.reason == SuppressionReason.UNSUBSCRIBED:
        return "its recipient unsubscribed"
    return f"an earlier delivery failed with {said}"


def change_from(
    outcomes: Iterable[tuple[str, Outcome, bool]],
    *,
    now: datetime,
    duration: timedelta,
    expiry_window: timedelta | None,
) -> SuppressionChange:
    """Return what a batch of outcomes changes on the list.

    ``outcomes`` holds each recipient's address, outcome and whether it failed because
    its delivery time expired (``MAX_AGE``). A delivery takes its address off; a
    suppressing failure puts it on for ``duration``; an expiry is noted for
    ``expiry_window`` (``None``: never), and two expiries of one address in the batch
    suppress it at once. A delivery outweighs a failure of the same batch: it proves
    that the mailbox takes mail.
    """
    delivered: set[str] = set()
    failed: dict[str, Suppression] = {}
    expiries: Counter[str] = Counter()
    last_expiry: dict[str, Reply] = {}

    def entry(address: str, reason: SuppressionReason, reply: Reply) -> Suppression:
        return Suppression(address=address, reason=reason, reply=reply, created_at=now, expires_at=now + duration)

    for address, outcome, expired in outcomes:
        key = normal_address(address)
        if outcome.status == RecipientStatus.DELIVERED:
            delivered.add(key)
        elif outcome.status != RecipientStatus.FAILED:
            continue
        elif expired:
            if expiry_window is not None:
                expiries[key] += 1
                last_expiry[key] = outcome.reply
        elif outcome.names_recipient and suppresses(outcome.reply):
            failed[key] = entry(key, SuppressionReason.FAILED, outcome.reply)
    for key, count in expiries.items():
        if count >= 2 and key not in failed:
            failed[key] = entry(key, SuppressionReason.EXPIRED, last_expiry[key])
    noted = [
        entry(key, SuppressionReason.EXPIRED, last_expiry[key])
        for key, count in expiries.items()
        if count == 1 and key not in failed and key not in delivered
    ]
    return SuppressionChange(
        add=tuple(e for key, e in failed.items() if key not in delivered),
        expired=tuple(noted),
        note_until=None if expiry_window is None else now + expiry_window,
        clear=tuple(sorted(delivered)),
    )
