"""Returned mail no parser could read (``ReturnedMail``): a read-only list and page, and
its ``.eml``, for a person to read and to delete once read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html
from django.utils.translation import gettext_lazy

from bumail_queue.conf import get_settings
from bumail_queue.models import ReturnedMail

from .shared import SecurePages, admin_page, url_of

if TYPE_CHECKING:  # ModelAdmin is generic for django-stubs only
    ReturnedMailAdminBase = admin.ModelAdmin[ReturnedMail]
else:
    ReturnedMailAdminBase = admin.ModelAdmin

#: How much of a message its page shows as text; the whole is in its ``.eml``.
SHOWN_OCTETS = 64 * 1024


@admin.register(ReturnedMail)
class ReturnedMailAdmin(SecurePages, ReturnedMailAdminBase):
    """Read-only: written by ``queue_inbound``; a person reads, then deletes."""

    list_display = ("received_at", "sender", "subject", "recipients")
    search_fields = ("sender", "subject", "recipients")
    list_per_page = 100
    readonly_fields = ("received_at", "recipients", "sender", "subject", "note", "text", "download")
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[ReturnedMail]:
        return super().get_queryset(request).using(get_settings().database).defer("message")

    @admin.display(description=gettext_lazy("message"))
    def text(self, obj: ReturnedMail) -> str:
        """The message as text (escaped when shown; never rendered as HTML)."""
        message = ReturnedMail.objects.using(get_settings().database).values_list("message", flat=True).get(pk=obj.pk)
        shown = bytes(message[:SHOWN_OCTETS]).decode("utf-8", "replace")
        return shown + ("\n[...]" if len(message) > SHOWN_OCTETS else "")

    @admin.display(description=gettext_lazy("download"))
    def download(self, obj: ReturnedMail) -> str:
        return format_html('<a href="{}">{}.eml</a>', url_of(self, "eml", obj.pk), obj.pk)

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        eml = path(
            "<int:pk>/eml/",
            admin_page(self, self.eml_view),
            name=f"{opts.app_label}_{opts.model_name}_eml",
        )
        return [eml, *super().get_urls()]

    def eml_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not self.has_view_permission(request):
            raise Http404
        found = ReturnedMail.objects.using(get_settings().database).filter(pk=pk).values_list("message", flat=True)
        message = found.first()
        if message is None:
            raise Http404
        response = HttpResponse(bytes(message), content_type="message/rfc822")
        response["Content-Disposition"] = f'attachment; filename="returned-{pk}.eml"'
        return response

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ReturnedMail | None = None) -> bool:
        return False
