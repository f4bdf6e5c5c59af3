"""Every store bumail_queue ships keeps the store contract (memory, ORM on this database, Redis)."""

from __future__ import annotations

import pytest

from bumail_queue.conf import get_settings
from bumail_queue.stores.base import QueueStore
from bumail_queue.stores.memory import MemoryStore
from bumail_queue.testing import StoreContract

pytestmark = pytest.mark.django_db(transaction=True)


class TestStoreContract(StoreContract):
    """Runs the contract against the parametrised ``store`` fixture of conftest.py."""


class MemoryStoreOnTheDefaults(MemoryStore):
    """The memory store with the base class's own ``retry_deferred``, ``bulk_page``,
    ``hold`` and ``release``: what a store of your own that does not override them gets."""

    retry_deferred = QueueStore.retry_deferred
    bulk_page = QueueStore.bulk_page
    hold = QueueStore.hold
    release = QueueStore.release


class TestTheDefaultsKeepTheContract(StoreContract):
    @pytest.fixture
    def store(self) -> QueueStore:
        return MemoryStoreOnTheDefaults(get_settings())
