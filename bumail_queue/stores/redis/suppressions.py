"""The Redis store's suppression list: its entries and notes, one script a write.

A lookup of a batch is one ``HMGET``; an update is one script; the admin's page is
one read-only script; a purge goes a page a script, so that Redis serves the workers
between them.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import cast

from bumail_queue.suppression import (
    GLOBAL_SCOPE,
    Suppression,
    SuppressionChange,
    SuppressionReason,
    SuppressionUpdate,
    lookup_keys,
    search_form,
)

from . import scripts
from .connection import RedisConnection
from .items import RETRY_PAGE
from .layout import member_address, micros, pairs, suppression_from_json, suppression_json, suppression_member


class RedisSuppressions(RedisConnection):
    """Looks addresses up on the suppression list, and updates, searches, counts and purges it."""

    # -- the suppression list ---------------------------------------------------------

    def suppression_entries(
        self, addresses: Iterable[str], *, now: datetime, scopes: Sequence[str] | None = None
    ) -> dict[str, builtins.list[Suppression]]:
        """One ``HMGET`` for the whole batch in every scope asked (every scope kept, read
        first with ``SMEMBERS``, for ``None``), each address's ``forgotten_key`` with it;
        entries past their time are left out here."""
        given = lookup_keys(addresses)
        if not given:
            return {}
        client = self._redis()
        with self._translated_errors("read the suppression list"):
            if scopes is None:
                kept = cast("set[bytes]", client.smembers(self.keys.suppression_scopes))
                scopes = [GLOBAL_SCOPE, *sorted(scope.decode() for scope in kept)]
            members = [suppression_member(key, scope) for key in given for scope in scopes]
            raws = cast("list[bytes | None]", client.hmget(self.keys.suppressed, members)) if members else []
        found: dict[str, builtins.list[Suppression]] = {}
        for member, raw in zip(members, raws, strict=True):
            if raw is not None and (entry := suppression_from_json(member, raw)).is_in_force(now):
                for address in given[entry.address]:
                    found.setdefault(address, []).append(entry)
        return found

    def update_suppressions(self, change: SuppressionChange, *, now: datetime) -> SuppressionUpdate:
        self.validate_suppressions(change)
        if not change:
            return SuppressionUpdate()
        args: list[str | bytes | int] = [
            micros(now),
            "" if change.note_until is None else micros(change.note_until),
        ]
        for entries in (change.add, change.expired):
            args.append(len(entries))
            for entry in entries:
                member = suppression_member(entry.address, entry.scope)
                args += [member, suppression_json(entry), micros(entry.created_at), micros(entry.expires_at)]
        args += [len(change.clear), *change.clear]
        args += [suppression_member(address, scope) for address, scope in change.clear_scoped]
        promoted, removed = self._run(scripts.SUPPRESS, "update the suppression list", self.keys.suppression_keys, args)
        by_address = {entry.address: entry for entry in change.expired}
        return SuppressionUpdate(
            suppressed=(*change.add, *(by_address[address.decode()] for address in promoted)),
            removed=tuple(member_address(member.decode()) for member in removed),
        )

    def search_suppressions(
        self,
        *,
        now: datetime,
        text: str | None = None,
        scope: str | None = None,
        reason: SuppressionReason | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> builtins.list[Suppression]:
        """One read-only script that walks the list from its newest entry (see ``suppression_page.lua``)."""
        if limit <= 0:
            return []
        args: list[str | bytes | int] = [
            micros(now),
            "" if text is None else search_form(text),
            offset,
            limit,
            "0" if scope is None else "1",
            scope or "",
            "" if reason is None else reason.value,
        ]
        keys = [self.keys.suppressed, self.keys.suppressed_created]
        flat = self._run(scripts.SUPPRESSION_PAGE, "search the suppression list", keys, args)
        return [suppression_from_json(member.decode(), raw) for member, raw in pairs(flat).items()]

    def count_suppressions(self, *, now: datetime) -> int:
        client = self._redis()
        with self._translated_errors("count the suppression list"):
            return int(client.zcount(self.keys.suppressed_expires, f"({micros(now)}", "+inf"))

    def purge_suppressions(self, *, now: datetime) -> int:
        """A thousand at a time, one script each, so that Redis serves the workers between them."""
        dropped = 0
        while True:
            entries, notes = self._run(
                scripts.SUPPRESSION_PURGE,
                "purge the suppression list",
                self.keys.suppression_keys,
                [micros(now), RETRY_PAGE],
            )
            dropped += int(entries)
            if entries < RETRY_PAGE and notes < RETRY_PAGE:
                return dropped
