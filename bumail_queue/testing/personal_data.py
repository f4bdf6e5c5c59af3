"""The promises of a store about an erased address's suppression entries: kept under
its ``suppression.forgotten_key``, and found by a lookup of the address itself."""

from __future__ import annotations

from datetime import timedelta

from bumail_queue.items import Reply
from bumail_queue.stores.base import QueueStore
from bumail_queue.suppression import SuppressionChange, channel_scope, forgotten_key, scopes_of
from bumail_queue.testing.values import T0, suppression


class PersonalDataContract:
    """An erased address stays suppressed, under a key that does not say it."""

    def _forget(self, store: QueueStore, address: str, *scopes: str) -> None:
        """Key ``address``'s entries in ``scopes`` by its HMAC, as ``queue.forget_address`` does."""
        key = forgotten_key(address)
        hashed = tuple(
            suppression(key, scope=scope, reply=Reply(code=550, status="5.1.1", text="")) for scope in scopes
        )
        change = SuppressionChange(add=hashed, clear_scoped=tuple((address, scope) for scope in scopes))
        store.update_suppressions(change, now=T0)

    def test_a_lookup_of_the_address_finds_its_forgotten_entries(self, store: QueueStore) -> None:
        store.update_suppressions(SuppressionChange(add=(suppression("ann@example.org"),)), now=T0)
        self._forget(store, "ann@example.org", "", channel_scope("news"))
        asked = ["ann@example.org", "ann@EXAMPLE.org.", "Ann@example.org", "bob@example.org"]
        found = store.suppressions_of(asked, now=T0 + timedelta(days=1), scopes=scopes_of("news"))
        assert set(found) == {"ann@example.org", "ann@EXAMPLE.org."}
        key = forgotten_key("ann@example.org")
        assert found["ann@example.org"].address == key
        assert found["ann@example.org"].forgotten
        every = store.suppression_entries(["ann@example.org"], now=T0, scopes=None)["ann@example.org"]
        assert sorted(entry.scope for entry in every) == ["", "channel:news"]
        assert {entry.address for entry in every} == {key}

    def test_the_list_names_a_forgotten_entry_by_its_key_alone(self, store: QueueStore) -> None:
        self._forget(store, "ann@example.org", "")
        page = store.search_suppressions(now=T0)
        assert [entry.address for entry in page] == [forgotten_key("ann@example.org")]
        assert store.search_suppressions(now=T0, text="ann@") == []
        assert store.count_suppressions(now=T0) == 1

    def test_a_forgotten_entry_is_taken_off_by_its_key(self, store: QueueStore) -> None:
        self._forget(store, "ann@example.org", channel_scope("news"))
        key = forgotten_key("ann@example.org")
        done = store.update_suppressions(SuppressionChange(clear_scoped=((key, channel_scope("news")),)), now=T0)
        assert done.removed == (key,)
        assert store.suppression_entries(["ann@example.org"], now=T0) == {}
