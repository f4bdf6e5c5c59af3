"""The delivery log's pages: read-only, searched by address, never counted row by row on
a large PostgreSQL log."""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.translation import gettext_lazy

from bumail_queue import delivery_log
from bumail_queue.conf import get_settings
from bumail_queue.models import DeliveryLog

from .addresses import address_url
from .shared import LogAdminBase, SecurePages


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """The delivery log's paginator: it never counts a large PostgreSQL log row by row.

    With no filter, the count is ``delivery_log.estimated_count``; a filtered list is
    counted, as it should be small.
    """

    @cached_property
    def count(self) -> int:
        object_list = self.object_list
        if isinstance(object_list, QuerySet) and object_list.model is DeliveryLog:
            estimate = delivery_log.estimated_count(object_list)
            if estimate is not None:
                return estimate
        return super().count


@admin.register(DeliveryLog)
class DeliveryLogAdmin(SecurePages, LogAdminBase):
    """The delivery log, read-only: entries are written by the worker, deleted by age."""

    list_display = ("logged_at", "recipient_link", "status_badge", "reply", "remote", "item")
    list_filter = ("status",)
    search_fields = ("recipient", "sender", "=message_id")
    search_help_text = gettext_lazy("An address (or part of one), a Message-ID, or an item id.")
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # counts per status would scan a large log
    paginator = EstimatedCountPaginator
    readonly_fields = (
        "logged_at", "item_id", "recipient_link", "domain", "sender", "status", "reply_code", "reply_status",
        "reply_text", "remote_host", "tls", "next_attempt_at", "subject", "message_id",
    )  # fmt: skip
    exclude = ("recipient",)  # shown as recipient_link, a link to the address's page

    def get_queryset(self, request: HttpRequest) -> QuerySet[DeliveryLog]:
        return super().get_queryset(request).using(get_settings().database)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: DeliveryLog | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: DeliveryLog | None = None) -> bool:
        return False  # manage.py queue_purge deletes by age

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[DeliveryLog], search_term: str
    ) -> tuple[QuerySet[DeliveryLog], bool]:
        try:
            return queryset.filter(item_id=uuid.UUID(search_term.strip())), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    @admin.display(description=gettext_lazy("recipient"), ordering="recipient")
    def recipient_link(self, entry: DeliveryLog) -> str:
        url = address_url(self.admin_site, entry.recipient)
        if url is None:
            return entry.recipient
        return format_html('<a class="bq-address" href="{}">{}</a>', url, entry.recipient)

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, entry: DeliveryLog) -> str:
        return format_html('<span class="bq-status bq-{}">{}</span>', entry.status, entry.get_status_display())

    @admin.display(description=gettext_lazy("reply"))
    def reply(self, entry: DeliveryLog) -> str:
        return entry.reply_line

    @admin.display(description=gettext_lazy("remote host"), ordering="remote_host")
    def remote(self, entry: DeliveryLog) -> str:
        return render_to_string("admin/bumail_queue/remote_host.html", {"entry": entry})

    @admin.display(description=gettext_lazy("item"))
    def item(self, entry: DeliveryLog) -> str:
        url = reverse(f"{self.admin_site.name}:bumail_queue_item_change", args=[entry.item_id])
        return format_html('<a href="{}">{}</a>', url, str(entry.item_id)[:8])

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("bumail_queue/admin.css",)}
