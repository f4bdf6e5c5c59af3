"""The suppression list's part of the service (``queue``): what the admin, the
commands and a site's own code read and change on it.

Every entry is global (all mail) or of one scope (``suppression.channel_scope``);
lookups take the scopes that apply, changes name theirs.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from .addresses import domain_of, domain_problem, mailbox_problem, normal_address
from .conf import QueueSettings, normalise_domain
from .errors import ErrorCode, QueueError
from .items import Reply
from .stores import QueueStore
from .suppression import (
    GLOBAL_SCOPE,
    Suppression,
    SuppressionChange,
    SuppressionReason,
    forgotten_key,
    require_scope,
    scopes_of,
)
from .text import require_keepable

#: The longest note an operator may give a suppression.
MAX_NOTE = 500
SUPPRESSION_BATCH = 1000
"""Entries written to the list in one step by ``add_suppressions`` (an import)."""


class SuppressionService:
    """The suppression list's methods of ``QueueService``, over its store and clock."""

    clock: Callable[[], datetime]

    @property
    def store(self) -> QueueStore:
        raise NotImplementedError

    @property
    def settings(self) -> QueueSettings:
        raise NotImplementedError

    def suppressed(self, addresses: Sequence[str], *, channel: str | None = None) -> dict[str, Suppression]:
        """Return the entries in force for those of ``addresses`` on the suppression list.

        Global entries; with ``channel``, that channel's too (a global entry first),
        as the worker looks its mail up. Keyed by each address as given; one round trip
        to the store for them all.
        """
        given = [addresses] if isinstance(addresses, str) else [str(address) for address in addresses]
        scopes = (GLOBAL_SCOPE,) if channel is None else scopes_of(channel)
        return self.store.suppressions_of(given, now=self.clock(), scopes=scopes)

    def suppressions_for(self, address: str) -> builtins.list[Suppression]:
        """Return every entry in force for ``address``, in every scope, the global first:
        what the list holds about one person."""
        entries = self.store.suppression_entries([str(address)], now=self.clock(), scopes=None).get(str(address), [])
        return sorted(entries, key=lambda entry: (entry.scope != GLOBAL_SCOPE, entry.scope))

    def suppress(
        self,
        address: str,
        *,
        note: str = "",
        duration: timedelta | None = None,
        scope: str = GLOBAL_SCOPE,
        reason: SuppressionReason = SuppressionReason.MANUAL,
    ) -> Suppression:
        """Put ``address`` on the suppression list, for all mail or for ``scope``'s alone
        (``channel_scope("newsletter")``); an operator's entry unless ``reason`` says
        otherwise.

        For ``duration`` (``SUPPRESSION_DURATION`` unless given); an entry the address
        had in that scope is replaced. ``note`` says why, on the list's pages. Raises
        ``QueueError(INVALID)`` for an address that is no mailbox, a duration that is
        not a positive ``timedelta``, a scope that is none, or text that cannot be kept.
        """
        problem = mailbox_problem(address) if isinstance(address, str) else "it is not a string"
        if problem:
            raise QueueError(ErrorCode.INVALID, f"{address!r} cannot be suppressed: {problem}.", recipient=address)
        if duration is None:
            duration = self.settings.suppression_duration
        elif not isinstance(duration, timedelta) or duration <= timedelta(0):
            raise QueueError(ErrorCode.INVALID, f"A suppression lasts a positive timedelta; got {duration!r}.")
        if not isinstance(note, str) or len(note) > MAX_NOTE:
            raise QueueError(ErrorCode.INVALID, f"A suppression's note is a string of at most {MAX_NOTE} characters.")
        now = self.clock()
        entry = Suppression(
            address=normal_address(address),
            reason=SuppressionReason(reason),
            reply=Reply(code=None, status="", text=require_keepable(note.strip(), "note")),
            created_at=now,
            expires_at=now + duration,
            scope=require_scope(scope),
        )
        self.store.update_suppressions(SuppressionChange(add=(entry,)), now=now)
        return entry

    def add_suppressions(self, entries: Sequence[Suppression]) -> int:
        """Put ``entries`` on the list as they are (their reasons, replies, scopes and
        times: an export of this list or another's), replacing the addresses' own in
        those scopes; return how many.

        All are checked before any is written: ``QueueError(INVALID)`` names the first
        that is no mailbox, has expired already, or holds text that cannot be kept.
        """
        now = self.clock()
        checked = []
        for entry in entries:
            problem = mailbox_problem(entry.address) if isinstance(entry.address, str) else "it is not a string"
            if problem and isinstance(entry.address, str) and entry.forgotten:
                problem = None  # an erased address's entry, kept under its key (forgotten_key)
            if problem or entry.expires_at <= now:
                why = problem or f"its entry expired at {entry.expires_at.isoformat()}"
                raise QueueError(ErrorCode.INVALID, f"{entry.address!r} cannot be suppressed: {why}.")
            require_keepable(entry.reply.text, "reply")
            require_scope(entry.scope)
            checked.append(dataclasses.replace(entry, address=normal_address(entry.address)))
        for start in range(0, len(checked), SUPPRESSION_BATCH):
            batch = tuple(checked[start : start + SUPPRESSION_BATCH])
            self.store.update_suppressions(SuppressionChange(add=batch), now=now)
        return len(checked)

    def unsuppress(
        self, addresses: Sequence[str] = (), *, domain: str | None = None, scope: str = GLOBAL_SCOPE
    ) -> builtins.list[str]:
        """Take addresses off the suppression list in ``scope`` (the global one, with any
        note of a first expiry, unless given).

        ``addresses`` as given, or with ``domain`` every address on the list at that
        domain (compared as routes compare domains), as after an outage there.
        Returns those whose entries were in force, in ``addresses.normal_address``'s
        form. Raises ``QueueError(INVALID)`` for a domain or a scope that is none.
        """
        require_scope(scope)
        given = [addresses] if isinstance(addresses, str) else [str(address) for address in addresses]
        if domain is not None:
            given += self._suppressed_at(recipient_domain(domain), scope)
        # Each address's erased entry too (suppression.forgotten_key), named as the address.
        keys = {forgotten_key(address): normal_address(address) for address in given}
        keys.update((normal_address(address), normal_address(address)) for address in given)
        change = SuppressionChange(clear_scoped=tuple((key, scope) for key in keys))
        removed = self.store.update_suppressions(change, now=self.clock()).removed
        return builtins.list(dict.fromkeys(keys.get(key, key) for key in removed))

    def forget_suppressions(self, address: str) -> builtins.list[Suppression]:
        """Take ``address`` off the list in every scope, with any note of an expiry (an
        erasure: mail to it is sent again); return the entries it had in force."""
        entries = self.suppressions_for(address)
        keys = dict.fromkeys((normal_address(str(address)), forgotten_key(str(address))))
        scopes = {GLOBAL_SCOPE, *(entry.scope for entry in entries)}
        change = SuppressionChange(clear_scoped=tuple((key, scope) for key in keys for scope in sorted(scopes)))
        self.store.update_suppressions(change, now=self.clock())
        return entries

    def _suppressed_at(self, domain: str, scope: str) -> builtins.list[str]:
        """The addresses on the list at ``domain`` (in ``normalise_domain``'s form) in
        ``scope``, a page at a time."""
        found: builtins.list[str] = []
        now, offset = self.clock(), 0
        while page := self.store.search_suppressions(
            now=now, text=f"@{domain}", scope=scope, offset=offset, limit=1000
        ):
            found += [entry.address for entry in page if domain_of(entry.address) == domain]
            offset += len(page)
        return found

    def search_suppressions(
        self,
        *,
        text: str | None = None,
        scope: str | None = None,
        reason: SuppressionReason | str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> builtins.list[Suppression]:
        """Return a page of the entries in force, the newest first; with ``text``, those
        whose address holds it (its domain as written or in A-labels, ASCII case aside);
        with ``scope`` or ``reason``, those of it."""
        if offset < 0 or limit < 0:
            raise QueueError(ErrorCode.INVALID, "'offset' and 'limit' must be 0 or more.")
        if scope is not None:
            require_scope(scope)
        return self.store.search_suppressions(
            now=self.clock(),
            text=text or None,
            scope=scope,
            reason=None if reason is None else _reason(reason),
            offset=offset,
            limit=limit,
        )

    def count_suppressions(self) -> int:
        """Return how many entries the suppression list holds now, in every scope."""
        return self.store.count_suppressions(now=self.clock())

    def purge_suppressions(self) -> int:
        """Drop the entries that expired (lookups skip them already); return how many."""
        return self.store.purge_suppressions(now=self.clock())


def _reason(reason: SuppressionReason | str) -> SuppressionReason:
    try:
        return SuppressionReason(reason)
    except ValueError:
        raise QueueError(ErrorCode.INVALID, f"{reason!r} is not a suppression's reason.") from None


def recipient_domain(domain: str) -> str:
    """Return ``domain`` in the form recipients' domains are compared in; raise
    ``QueueError(INVALID)`` for one no mailbox could be at."""
    name = domain.rstrip(".")
    problem = domain_problem(name) if name else "it is empty"
    if problem:
        raise QueueError(ErrorCode.INVALID, f"{domain!r} is not a domain: {problem}.")
    return normalise_domain(name)


__all__ = ["MAX_NOTE", "SUPPRESSION_BATCH", "SuppressionService", "recipient_domain"]
