"""Every store bumail_queue ships keeps the store contract (memory, ORM on this database, Redis)."""

from __future__ import annotations

import pytest

from bumail_queue.testing import StoreContract

pytestmark = pytest.mark.django_db(transaction=True)


class TestStoreContract(StoreContract):
    """Runs the contract against the parametrised ``store`` fixture of conftest.py."""
