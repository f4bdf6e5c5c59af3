"""The store contract as tests, shipped for stores of your own.

``StoreContract`` holds the promises every ``QueueStore`` keeps (``stores/base.py``
lists them). A store is held to them by a pytest test class that inherits it and a
``store`` fixture that yields a fresh, empty store::

    import pytest

    from bumail_queue.testing import StoreContract


    @pytest.fixture
    def store(settings):
        return MyStore(get_settings())


    @pytest.mark.django_db(transaction=True)
    class TestMyStore(StoreContract):
        pass

Times are made here and given to the store: a store keeps no clock. Importing this
package imports pytest; nothing else in ``bumail_queue`` does.

The promises are grouped by what they are about, one mixin each (``items``, ``claims``,
``operators``, ``sts``, ``suppressions``, ``shaping``, ``bulk``, ``personal_data``); ``values`` holds what they are
written with, which tests of a store's own may use too.
"""

from __future__ import annotations

from bumail_queue.testing.bulk import BulkContract
from bumail_queue.testing.claims import ClaimsContract
from bumail_queue.testing.items import ItemsContract
from bumail_queue.testing.operators import OperatorsContract
from bumail_queue.testing.personal_data import PersonalDataContract
from bumail_queue.testing.shaping import ShapingContract
from bumail_queue.testing.sts import STSContract
from bumail_queue.testing.suppressions import SuppressionsContract
from bumail_queue.testing.values import (
    LATER,
    LEASE,
    NO_SUCH_USER,
    OK,
    T0,
    claim_one,
    new_item,
    result,
    sts_failure,
    sts_policy,
    suppression,
    tls_count,
    tried_once,
)

__all__ = [
    "LATER",
    "LEASE",
    "NO_SUCH_USER",
    "OK",
    "T0",
    "BulkContract",
    "PersonalDataContract",
    "ShapingContract",
    "StoreContract",
    "claim_one",
    "new_item",
    "result",
    "sts_failure",
    "sts_policy",
    "suppression",
    "tls_count",
    "tried_once",
]


class StoreContract(
    ItemsContract,
    ClaimsContract,
    OperatorsContract,
    STSContract,
    SuppressionsContract,
    ShapingContract,
    BulkContract,
    PersonalDataContract,
):
    """Every promise of a ``QueueStore``: inherit it in a pytest class with a ``store`` fixture."""
