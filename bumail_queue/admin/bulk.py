"""The audit of the bulk actions (``BulkAction``): a read-only list of who held,
released, cancelled or retried which items by filter, from the admin or a command."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.sites import AdminSite
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.timesince import timesince
from django.utils.timezone import now
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from bumail_queue.models import BulkAction

from .shared import SecurePages

if TYPE_CHECKING:  # ModelAdmin is generic for django-stubs only
    BulkActionAdminBase = admin.ModelAdmin[BulkAction]
else:
    BulkActionAdminBase = admin.ModelAdmin


def filter_in_words(data: Mapping[str, Any]) -> str:
    """Say a bulk action's filter (``BulkFilter.to_dict``'s form) as a person reads it:
    ``domain example.net, state deferred``; ``every item`` for none."""
    labels = {
        "domain": _("domain"),
        "channel": _("channel"),
        "state": _("state"),
        "sender": _("sender"),
        "recipient": _("recipient"),
    }
    parts = [f"{label} {data[name]}" for name, label in labels.items() if data.get(name) not in (None, "")]
    older_than = data.get("older_than")
    if isinstance(older_than, int | float) and older_than > 0:
        at = now()
        parts.append(_("older than %s") % timesince(at - timedelta(seconds=older_than), at, depth=2))
    return ", ".join(parts) or _("every item")


def bulk_actions_url(site: AdminSite, request: HttpRequest) -> str | None:
    """The audit page's URL, for a user who may see it on ``site``; else ``None``."""
    model_admin = site._registry.get(BulkAction)
    if model_admin is None or not model_admin.has_view_permission(request):
        return None
    try:
        return reverse(f"{site.name}:bumail_queue_bulkaction_changelist")
    except NoReverseMatch:
        return None


@admin.register(BulkAction)
class BulkActionAdmin(SecurePages, BulkActionAdminBase):
    """Read-only: rows are written by the bulk actions themselves, never by hand."""

    list_display = ("acted_at", "by", "action", "filter_text", "matched", "changed", "skipped", "stopped_text")
    list_filter = ("action",)
    search_fields = ("by",)
    date_hierarchy = "acted_at"
    list_per_page = 100
    actions = None
    fields = ("acted_at", "by", "action", "filter_text", "matched", "changed", "skipped", "stopped")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: BulkAction | None = None) -> bool:
        return False  # an audit entry says what was done: nobody edits it

    def has_delete_permission(self, request: HttpRequest, obj: BulkAction | None = None) -> bool:
        return False

    @admin.display(description=gettext_lazy("filter"))
    def filter_text(self, obj: BulkAction) -> str:
        return filter_in_words(obj.filter if isinstance(obj.filter, dict) else {})

    @admin.display(description=gettext_lazy("stopped"))
    def stopped_text(self, obj: BulkAction) -> str:
        return obj.stopped or "—"
