# mypy: disable-error-code="union-attr"
# The tests read what a store returned without narrowing it first: a ``None`` where an
# item was due fails the test there, as it should.
"""The promises of a store about the suppression list."""

from __future__ import annotations

import builtins
import threading
from datetime import datetime, timedelta

import pytest
from django.db import connections

from bumail_queue.errors import QueueError
from bumail_queue.items import Reply
from bumail_queue.stores.base import QueueStore
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason, scopes_of
from bumail_queue.testing.values import (
    EXPIRED,
    SUPPRESSED_FOR,
    T0,
    suppression,
)


class SuppressionsContract:
    """The suppression list: entries, their expiry, and the notes of a first expired delivery."""

    # -- the suppression list -----------------------------------------------------------

    def _suppress(self, store: QueueStore, *entries: Suppression) -> None:
        store.update_suppressions(SuppressionChange(add=entries), now=entries[0].created_at)

    def _expire(self, store: QueueStore, address: str, at: datetime) -> tuple[Suppression, ...]:
        """Note one expiry of ``address`` at ``at``; return the entries it put in force."""
        entry = suppression(address, at=at, reason=SuppressionReason.EXPIRED, reply=EXPIRED)
        change = SuppressionChange(expired=(entry,), note_until=at + SUPPRESSED_FOR)
        return store.update_suppressions(change, now=at).suppressed

    def test_a_suppressed_address_is_found_however_its_domain_is_written(self, store: QueueStore) -> None:
        entry = suppression("Ann@xn--bcher-kva.example")
        self._suppress(store, entry)
        asked = ["Ann@Bücher.example", "Ann@BÜCHER.EXAMPLE.", "Ann@xn--bcher-kva.example", "ann@bücher.example"]
        found = store.suppressions_of(asked, now=T0 + timedelta(days=1))
        # The local part as written (RFC 5321 §2.4): "ann" is another mailbox.
        assert found == dict.fromkeys(asked[:3], entry)

    def test_a_batch_is_answered_for_the_suppressed_alone(self, store: QueueStore) -> None:
        gone, moved = (
            suppression("gone@example.org"),
            suppression("moved@example.net", reply=Reply(code=550, status="5.1.6", text="Moved")),
        )
        self._suppress(store, gone, moved)
        asked = [f"ok{n}@example.org" for n in range(600)] + ["gone@example.org", "moved@example.net", "nul\x00@x.org"]
        assert store.suppressions_of(asked, now=T0) == {"gone@example.org": gone, "moved@example.net": moved}
        assert store.suppressions_of([], now=T0) == {}

    def test_an_entry_past_its_time_is_never_returned(self, store: QueueStore) -> None:
        entry = suppression("gone@example.org", lasts=timedelta(days=1))
        self._suppress(store, entry)
        assert store.suppressions_of(["gone@example.org"], now=entry.expires_at - timedelta(seconds=1))
        assert store.count_suppressions(now=entry.expires_at - timedelta(seconds=1)) == 1
        after = entry.expires_at
        assert store.suppressions_of(["gone@example.org"], now=after) == {}
        assert store.search_suppressions(now=after) == []
        assert store.count_suppressions(now=after) == 0

    def test_an_entry_replaces_the_one_of_its_address(self, store: QueueStore) -> None:
        self._suppress(store, suppression("gone@example.org"))
        later = suppression(
            "gone@example.org", at=T0 + timedelta(days=3), reply=Reply(code=550, status="5.1.10", text="Null MX")
        )
        self._suppress(store, later)
        assert store.suppressions_of(["gone@example.org"], now=later.created_at) == {"gone@example.org": later}
        assert store.count_suppressions(now=later.created_at) == 1

    def test_clear_takes_entries_off_and_says_which_were_in_force(self, store: QueueStore) -> None:
        self._suppress(store, suppression("a@example.org"), suppression("b@example.org", lasts=timedelta(hours=1)))
        now = T0 + timedelta(hours=2)  # b's entry has expired
        done = store.update_suppressions(
            SuppressionChange(clear=("a@example.org", "b@example.org", "never@example.org")), now=now
        )
        assert (done.suppressed, sorted(done.removed)) == ((), ["a@example.org"])
        assert store.suppressions_of(["a@example.org", "b@example.org"], now=T0) == {}

    def test_a_delivery_takes_off_only_the_entries_it_disproves(self, store: QueueStore) -> None:
        disproved = [
            suppression("failed@example.org"),
            suppression("expired@example.org", reason=SuppressionReason.EXPIRED, reply=EXPIRED),
        ]
        kept = [
            suppression(f"{reason.value}@example.org", reason=reason)
            for reason in (
                SuppressionReason.BOUNCED,
                SuppressionReason.COMPLAINED,
                SuppressionReason.UNSUBSCRIBED,
                SuppressionReason.MANUAL,
            )
        ]
        self._suppress(store, *disproved, *kept)
        delivered = tuple(entry.address for entry in (*disproved, *kept))
        done = store.update_suppressions(SuppressionChange(clear=delivered), now=T0)
        assert sorted(done.removed) == ["expired@example.org", "failed@example.org"]
        assert store.suppressions_of(delivered, now=T0) == {entry.address: entry for entry in kept}
        # An operator's removal takes any entry off.
        operator = SuppressionChange(clear_scoped=tuple((entry.address, "") for entry in kept))
        assert sorted(store.update_suppressions(operator, now=T0).removed) == sorted(e.address for e in kept)
        assert store.count_suppressions(now=T0) == 0

    def test_a_second_expiry_while_the_note_lasts_suppresses(self, store: QueueStore) -> None:
        assert self._expire(store, "slow@example.org", T0) == ()
        assert store.suppressions_of(["slow@example.org"], now=T0) == {}
        assert store.search_suppressions(now=T0) == [] and store.count_suppressions(now=T0) == 0
        second = T0 + timedelta(days=29)
        [entry] = self._expire(store, "slow@example.org", second)
        assert entry == suppression("slow@example.org", at=second, reason=SuppressionReason.EXPIRED, reply=EXPIRED)
        assert store.suppressions_of(["slow@example.org"], now=second) == {"slow@example.org": entry}
        assert store.search_suppressions(now=second) == [entry]

    def test_an_expiry_after_the_note_lapsed_is_a_first_again(self, store: QueueStore) -> None:
        self._expire(store, "slow@example.org", T0)
        again = T0 + SUPPRESSED_FOR
        assert self._expire(store, "slow@example.org", again) == ()
        assert store.suppressions_of(["slow@example.org"], now=again) == {}
        assert len(self._expire(store, "slow@example.org", again + timedelta(days=1))) == 1

    def test_an_expiry_of_a_suppressed_address_keeps_its_entry(self, store: QueueStore) -> None:
        entry = suppression("gone@example.org")
        self._suppress(store, entry)
        for day in (1, 2):
            assert self._expire(store, "gone@example.org", T0 + timedelta(days=day)) == ()
        assert store.suppressions_of(["gone@example.org"], now=T0 + timedelta(days=3)) == {"gone@example.org": entry}

    def test_clear_forgets_a_note_and_no_note_forgets_nothing(self, store: QueueStore) -> None:
        self._expire(store, "slow@example.org", T0)
        store.update_suppressions(SuppressionChange(clear=("slow@example.org",)), now=T0 + timedelta(days=1))
        assert self._expire(store, "slow@example.org", T0 + timedelta(days=2)) == ()
        # Without a note_until, an expiry notes nothing but still completes a note that lasts.
        entry = suppression(
            "slow@example.org", at=T0 + timedelta(days=3), reason=SuppressionReason.EXPIRED, reply=EXPIRED
        )
        done = store.update_suppressions(SuppressionChange(expired=(entry,)), now=entry.created_at)
        assert done.suppressed == (entry,)

    def test_search_is_the_newest_first_page_by_page(self, store: QueueStore) -> None:
        entries = [suppression(f"m{n}@example.org", at=T0 + timedelta(minutes=n)) for n in range(5)]
        for entry in entries:
            self._suppress(store, entry)
        now = T0 + timedelta(hours=1)
        newest_first = entries[::-1]
        assert store.search_suppressions(now=now) == newest_first
        assert store.search_suppressions(now=now, offset=1, limit=2) == newest_first[1:3]
        assert store.search_suppressions(now=now, offset=4, limit=2) == newest_first[4:]
        assert store.search_suppressions(now=now, limit=0) == []
        assert store.count_suppressions(now=now) == 5

    def test_search_by_text_takes_part_of_an_address_ascii_case_aside(self, store: QueueStore) -> None:
        ann, bob, cy = (
            suppression("Ann@xn--bcher-kva.example", at=T0 + timedelta(minutes=2)),
            suppression("bob@example.org", at=T0 + timedelta(minutes=1)),
            suppression("cy_100%@example.org"),
        )
        self._suppress(store, ann)
        self._suppress(store, bob)
        self._suppress(store, cy)
        now = T0 + timedelta(hours=1)

        def found(text: str) -> list[str]:
            return [entry.address for entry in store.search_suppressions(now=now, text=text)]

        assert found("ANN@") == [ann.address]
        assert found("ann@bücher.example") == [ann.address]
        assert found("Bücher") == [ann.address]
        assert found("@example.org") == [bob.address, cy.address]
        assert found("_100%") == [cy.address]
        assert found("y_1") == [cy.address] and found("y11") == []
        assert found("nobody") == []
        assert [e.address for e in store.search_suppressions(now=now, text="example", offset=1, limit=1)] == [
            bob.address
        ]

    def test_purge_drops_what_expired_and_keeps_the_rest(self, store: QueueStore) -> None:
        short = suppression("short@example.org", lasts=timedelta(days=1))
        long = suppression("long@example.org")
        self._suppress(store, short, long)
        self._expire(store, "slow@example.org", T0)  # its note lasts SUPPRESSED_FOR
        now = T0 + timedelta(days=2)
        assert store.purge_suppressions(now=now) == 1
        assert store.purge_suppressions(now=now) == 0
        assert store.search_suppressions(now=T0) == [long]
        assert len(self._expire(store, "slow@example.org", now)) == 1  # the note was kept
        assert store.purge_suppressions(now=T0 + timedelta(days=100)) == 2

    def test_expiries_noted_at_once_by_several_workers_suppress_once(self, store: QueueStore) -> None:
        # The second expiry suppresses, whichever of the four it is; the others find the
        # note, or the entry, the one before wrote.
        start = threading.Barrier(4)
        done: builtins.list[int] = []
        failures: builtins.list[BaseException] = []

        def note() -> None:
            try:
                start.wait(10)
                done.append(len(self._expire(store, "slow@example.org", T0)))
            except BaseException as error:  # reported below, in the test's thread
                failures.append(error)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=note) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert failures == []
        assert sorted(done) == [0, 0, 0, 1]
        assert store.count_suppressions(now=T0) == 1

    def test_suppression_text_a_store_cannot_keep_is_invalid(self, store: QueueStore) -> None:
        for bad in (
            suppression("nul\x00@example.org"),
            suppression("a@example.org", reply=Reply(code=550, status="5.1.1", text="no\udc80such")),
        ):
            with pytest.raises(QueueError) as raised:
                store.update_suppressions(SuppressionChange(add=(bad,)), now=T0)
            assert raised.value.code == "INVALID"
        assert store.count_suppressions(now=T0) == 0

    # -- scopes: an entry for all mail, or for one channel's ------------------------------

    def test_a_channel_entry_suppresses_in_its_scope_alone(self, store: QueueStore) -> None:
        left = suppression("ann@example.org", reason=SuppressionReason.UNSUBSCRIBED, scope="channel:newsletter")
        self._suppress(store, left)
        assert store.suppressions_of(["ann@example.org"], now=T0) == {}
        assert store.suppressions_of(["ann@example.org"], now=T0, scopes=scopes_of("alerts")) == {}
        found = store.suppressions_of(["ann@EXAMPLE.org", "ann@example.org"], now=T0, scopes=scopes_of("newsletter"))
        assert found == {"ann@EXAMPLE.org": left, "ann@example.org": left}

    def test_an_address_keeps_an_entry_per_scope_and_the_first_scope_asked_wins(self, store: QueueStore) -> None:
        left = suppression("ann@example.org", reason=SuppressionReason.UNSUBSCRIBED, scope="channel:newsletter")
        gone = suppression("ann@example.org", at=T0 + timedelta(seconds=1))
        other = suppression("ann@example.org", reason=SuppressionReason.MANUAL, scope="tenant:acme")
        self._suppress(store, left, gone, other)
        at = T0 + timedelta(seconds=2)
        assert store.suppressions_of(["ann@example.org"], now=at, scopes=scopes_of("newsletter")) == {
            "ann@example.org": gone
        }
        assert store.suppressions_of(["ann@example.org"], now=at, scopes=("channel:newsletter", "")) == {
            "ann@example.org": left
        }
        every = store.suppression_entries(["ann@example.org", "bob@example.org"], now=at)
        assert sorted(every["ann@example.org"], key=lambda e: e.scope) == [gone, left, other]
        assert builtins.list(every) == ["ann@example.org"]
        assert store.count_suppressions(now=at) == 3
        assert store.search_suppressions(now=at, text="ann") == [gone, other, left]

    def test_a_delivery_clears_the_global_entry_and_leaves_a_channels(self, store: QueueStore) -> None:
        left = suppression("ann@example.org", reason=SuppressionReason.UNSUBSCRIBED, scope="channel:newsletter")
        gone = suppression("ann@example.org")
        self._suppress(store, left, gone)
        done = store.update_suppressions(SuppressionChange(clear=("ann@example.org",)), now=T0)
        assert done.removed == ("ann@example.org",)
        assert store.suppression_entries(["ann@example.org"], now=T0) == {"ann@example.org": [left]}
        scoped = SuppressionChange(clear_scoped=(("ann@example.org", "channel:newsletter"), ("x@example.org", "")))
        assert store.update_suppressions(scoped, now=T0).removed == ("ann@example.org",)
        assert store.suppression_entries(["ann@example.org"], now=T0) == {}
        assert store.count_suppressions(now=T0) == 0

    def test_an_expiry_is_noted_globally_beside_a_channel_entry(self, store: QueueStore) -> None:
        left = suppression("slow@example.org", reason=SuppressionReason.UNSUBSCRIBED, scope="channel:newsletter")
        self._suppress(store, left)
        assert self._expire(store, "slow@example.org", T0) == ()
        (second,) = self._expire(store, "slow@example.org", T0 + timedelta(hours=1))
        assert second.scope == ""
        at = T0 + timedelta(hours=1)
        assert store.suppressions_of(["slow@example.org"], now=at) == {"slow@example.org": second}
        assert sorted(
            store.suppression_entries(["slow@example.org"], now=at)["slow@example.org"], key=lambda e: e.scope
        ) == [
            second,
            left,
        ]

    def test_a_search_filters_by_scope_and_reason(self, store: QueueStore) -> None:
        entries = [
            suppression("a@example.org", at=T0, reason=SuppressionReason.UNSUBSCRIBED, scope="channel:newsletter"),
            suppression("b@example.org", at=T0 + timedelta(seconds=1), reason=SuppressionReason.COMPLAINED),
            suppression("c@example.org", at=T0 + timedelta(seconds=2), reason=SuppressionReason.UNSUBSCRIBED),
            suppression("d@example.org", at=T0 + timedelta(seconds=3), scope="channel:newsletter"),
        ]
        for entry in entries:
            self._suppress(store, entry)
        now = T0 + timedelta(seconds=4)

        def found(**wanted: object) -> builtins.list[str]:
            return [entry.address for entry in store.search_suppressions(now=now, **wanted)]  # type: ignore[arg-type]

        assert found(scope="channel:newsletter") == ["d@example.org", "a@example.org"]
        assert found(scope="") == ["c@example.org", "b@example.org"]
        assert found(reason=SuppressionReason.UNSUBSCRIBED) == ["c@example.org", "a@example.org"]
        assert found(scope="channel:newsletter", reason=SuppressionReason.UNSUBSCRIBED) == ["a@example.org"]
        assert found(scope="channel:newsletter", offset=1, limit=5) == ["a@example.org"]
        assert found(scope="channel:alerts") == []

    def test_a_scoped_entry_expires_and_is_purged(self, store: QueueStore) -> None:
        left = suppression("ann@example.org", scope="channel:newsletter", lasts=timedelta(days=1))
        self._suppress(store, left)
        after = T0 + timedelta(days=1)
        assert store.suppression_entries(["ann@example.org"], now=after) == {}
        assert store.purge_suppressions(now=after) == 1
        assert store.suppression_entries(["ann@example.org"], now=T0) == {}

    @pytest.mark.parametrize("scope", ["channel:", "newsletter", "channel:bad name", "tenant:a\nb", None])
    def test_a_scope_that_is_none_is_invalid(self, store: QueueStore, scope: object) -> None:
        bad = suppression("ann@example.org", scope=scope)  # type: ignore[arg-type]
        with pytest.raises(QueueError) as raised:
            store.update_suppressions(SuppressionChange(add=(bad,)), now=T0)
        assert raised.value.code == "INVALID"
        with pytest.raises(QueueError):
            store.update_suppressions(SuppressionChange(clear_scoped=(("ann@example.org", scope),)), now=T0)  # type: ignore[arg-type]
        assert store.count_suppressions(now=T0) == 0
