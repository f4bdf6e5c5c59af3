"""The archive's pages (``ArchivedMessage``): a list searched by recipient, subject or
Message-ID; a page with the headers and, while kept, the bodies and the ``.eml``; and
*Resend*, which asks first, then queues the message again (``queue.resend``).

Permissions: the model's *view* permission for the pages and the ``.eml``, *change*
to resend (it queues mail); nothing is edited or added here, and the rows are deleted
by ``queue_purge`` alone (``REDACT_AFTER``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from bumail_queue.conf import get_settings
from bumail_queue.errors import QueueError
from bumail_queue.models import ArchivedMessage, ResentMessage
from bumail_queue.preview import preview, srcdoc_for
from bumail_queue.service import queue

from .shared import SecurePages, admin_page, url_of

if TYPE_CHECKING:  # ModelAdmin is generic for django-stubs only
    ArchiveAdminBase = admin.ModelAdmin[ArchivedMessage]
else:
    ArchiveAdminBase = admin.ModelAdmin

#: Recipients the list shows per message; the rest are counted.
LIST_RECIPIENTS = 3


@admin.register(ArchivedMessage)
class ArchivedMessageAdmin(SecurePages, ArchiveAdminBase):
    """Read-only, but for *Resend*: rows are written by the worker, dropped by age."""

    list_display = ("archived_at", "subject_link", "sender", "recipient_list", "channel", "kept", "resent_from_link")
    list_filter = ("channel",)
    search_fields = ("recipients", "subject", "message_id")
    search_help_text = gettext_lazy("A recipient, a subject or a Message-ID (or part of one), or an item id.")
    list_per_page = 100
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[ArchivedMessage]:
        # The list reads no message: the bodies can be large.
        return super().get_queryset(request).using(get_settings().database).defer("data", "headers")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ArchivedMessage], search_term: str
    ) -> tuple[QuerySet[ArchivedMessage], bool]:
        try:
            return queryset.filter(item_id=uuid.UUID(search_term.strip())), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: ArchivedMessage | None = None) -> bool:
        return False  # manage.py queue_purge deletes by age; queue_forget by address

    def can_resend(self, request: HttpRequest) -> bool:
        """Whether the user may resend: the model's *change* permission (a resend queues mail)."""
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    # -- the list's columns -------------------------------------------------------------

    @admin.display(description=gettext_lazy("subject"), ordering="subject")
    def subject_link(self, row: ArchivedMessage) -> str:
        return format_html('<a href="{}">{}</a>', url_of(self, "change", row.item_id), row.subject or _("(no subject)"))

    @admin.display(description=gettext_lazy("recipients"))
    def recipient_list(self, row: ArchivedMessage) -> str:
        addresses = row.recipients.splitlines()
        shown = ", ".join(addresses[:LIST_RECIPIENTS])
        more = len(addresses) - LIST_RECIPIENTS
        return shown if more <= 0 else _("%(shown)s and %(more)d more") % {"shown": shown, "more": more}

    @admin.display(description=gettext_lazy("kept"))
    def kept(self, row: ArchivedMessage) -> str:
        if row.body_until > timezone.now():
            return _("whole, until %s") % f"{row.body_until:%Y-%m-%d %H:%M}"
        return _("headers only, until %s") % f"{row.keep_until:%Y-%m-%d %H:%M}"

    @admin.display(description=gettext_lazy("resent from"))
    def resent_from_link(self, row: ArchivedMessage) -> str:
        if row.resent_from is None:
            return "—"
        return format_html('<a href="{}">{}</a>', self._item_url(row.resent_from), str(row.resent_from)[:8])

    # -- URLs ---------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("<uuid:item_id>/message.eml", admin_page(self, self.eml_view), name=f"{prefix}_eml"),
            path("<uuid:item_id>/resend/", admin_page(self, self.resend_view), name=f"{prefix}_resend"),
            *super().get_urls(),
        ]

    def _item_url(self, item_id: uuid.UUID | str) -> str:
        """The item page of ``item_id`` (its history, once it left the queue)."""
        try:
            return reverse(f"{self.admin_site.name}:bumail_queue_item_change", args=[str(item_id)])
        except NoReverseMatch:  # a site of your own without the queue's items
            return url_of(self, "change", item_id)

    def _archived(self, request: HttpRequest, item_id: uuid.UUID | str) -> ArchivedMessage:
        if not self.has_view_permission(request):
            raise PermissionDenied
        found = queue.archived(str(item_id))
        if found is None:
            raise Http404(_("The archive keeps no message of this item."))
        return found

    # -- the pages ----------------------------------------------------------------------

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        row = self._archived(request, object_id)
        data = None if row.data is None else bytes(row.data)
        shown = preview(data if data is not None else bytes(row.headers) + b"\r\n\r\n")
        context = self._context(
            request,
            row.subject or _("Archived message %s") % row.item_id,
            row=row,
            recipients=row.recipients.splitlines(),
            kept_whole=data is not None,
            preview=shown if data is not None else None,
            headers=shown.headers,
            srcdoc=None if data is None or shown.html is None else srcdoc_for(shown.html),
            item_url=self._item_url(row.item_id),
            resent_from_url=None if row.resent_from is None else self._item_url(row.resent_from),
            resends=[(resend, self._item_url(resend.item_id)) for resend in queue.resends_of(str(row.item_id))],
            eml_url=url_of(self, "eml", row.item_id),
            resend_url=url_of(self, "resend", row.item_id),
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/bumail_queue/archivedmessage/change_form.html", context)

    def eml_view(self, request: HttpRequest, item_id: uuid.UUID) -> HttpResponse:
        row = self._archived(request, item_id)
        if row.data is None:
            raise Http404(_("The archive keeps only this message's headers now."))
        response = HttpResponse(bytes(row.data), content_type="message/rfc822")
        response["Content-Disposition"] = f'attachment; filename="{item_id}.eml"'
        return response

    def resend_view(self, request: HttpRequest, item_id: uuid.UUID) -> HttpResponse:
        """GET: what would be resent, and to whom; POST with ``confirm``: resend it."""
        row = self._archived(request, item_id)
        if not self.can_resend(request):
            raise PermissionDenied
        recipients = row.recipients.splitlines()
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            chosen = request.POST.getlist("to")
            if not chosen:
                messages.error(request, _("Choose at least one recipient to resend to."))
                return HttpResponseRedirect(url_of(self, "resend", item_id))
            try:
                item = queue.resend(
                    str(item_id), recipients=chosen, by=request.user.get_username(), nth=_nth(request.POST.get("nth"))
                )
            except QueueError as error:
                messages.error(request, error.message)
                return HttpResponseRedirect(url_of(self, "change", item_id))
            messages.success(request, _("Resent as item %(id)s.") % {"id": item.id})
            return HttpResponseRedirect(self._item_url(item.id))
        context = self._context(
            request,
            _("Resend this message?"),
            row=row,
            recipients=recipients,
            kept_whole=row.data is not None,
            nth=queue.next_resend(row),
            back_url=url_of(self, "change", item_id),
            resend_url=url_of(self, "resend", item_id),
        )
        return TemplateResponse(request, "admin/bumail_queue/archivedmessage/resend_confirmation.html", context)

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "has_view_permission": self.has_view_permission(request),
            "can_resend": self.can_resend(request),
            "changelist_url": url_of(self, "changelist"),
            **extra,
        }

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("bumail_queue/admin.css",)}


def _nth(posted: str | None) -> int | None:
    """The resend's number the confirmation page was drawn with; ``None`` (the next)
    for a form without a valid one."""
    try:
        nth = int(posted or "")
    except ValueError:
        return None
    return nth if nth >= 1 else None


def archive_links(admin_site: admin.AdminSite, item_id: str) -> dict[str, str]:
    """The item page's links to the archive: ``archived`` (the item's archived message)
    and ``resent_from`` (the item it resends), each when there is one."""
    try:
        key = uuid.UUID(item_id)
    except ValueError:
        return {}
    database = get_settings().database
    links: dict[str, str] = {}
    try:
        if ArchivedMessage.objects.using(database).filter(item_id=key).exists():
            links["archived"] = reverse(f"{admin_site.name}:bumail_queue_archivedmessage_change", args=[item_id])
        resent_from = ResentMessage.objects.using(database).filter(item_id=key).values_list("resent_from", flat=True)
        original = resent_from.first()
        if original is not None:
            links["resent_from"] = reverse(f"{admin_site.name}:bumail_queue_item_change", args=[str(original)])
    except NoReverseMatch:  # a site of your own that leaves the archive out
        pass
    return links
