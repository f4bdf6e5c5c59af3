"""The admin: the queue's items (list, item page, retry, cancel), its overview, the log.

The item pages read the queue through the queue service and its store, never through
the ``Item`` model, so they are the same pages whatever store keeps the queue (the
ORM, Redis, a store of your own); ``Item`` is registered for its URLs and its
permissions only. Items change only through the service (``queue.retry_now``,
``queue.cancel``, ``queue.hold_items``, ``queue.release_items`` and the bulk actions by
filter), which respect the workers' leases. The suppression list's pages are made the same
way, over ``queue.search_suppressions``, ``queue.suppress`` and ``queue.unsuppress``.

Permissions, checked on the server for every request: the model's *view* permission
for the pages and the ``.eml`` download, *change* to retry, hold and release, *delete*
to cancel. No
page shows a setting's value, so no password or AUTH string can appear on one.

Its classes share one permission model, one way of reading the queue and one set of
templates (``shared``); each page family has its module: ``items`` (the list, the
actions, the item page), ``overview``, ``suppressions``, ``log``, ``returned``
(returned mail no parser could read), ``addresses`` (the page of one address),
``bulk_actions`` (hold, release, and any action on all the items matching the list's
filter), ``bulk`` (the bulk actions' audit) and ``archive`` (the archived messages,
their ``.eml`` and *Resend*). The message preview is ``preview``'s. Importing this package registers every model admin.
"""

from __future__ import annotations

from .archive import ArchivedMessageAdmin
from .bulk import BulkActionAdmin
from .items import ItemAdmin
from .log import DeliveryLogAdmin, EstimatedCountPaginator
from .overview import overview_context
from .returned import ReturnedMailAdmin
from .shared import age_text
from .suppressions import SuppressionAdmin

__all__ = [
    "ArchivedMessageAdmin",
    "BulkActionAdmin",
    "DeliveryLogAdmin",
    "EstimatedCountPaginator",
    "ItemAdmin",
    "ReturnedMailAdmin",
    "SuppressionAdmin",
    "age_text",
    "overview_context",
]
