"""The admin: the queue's items (list, item page, retry, cancel), its overview, the log.

The item pages read the queue through the queue service and its store, never through
the ``Item`` model, so they are the same pages whatever store keeps the queue (the
ORM, Redis, a store of your own); ``Item`` is registered for its URLs and its
permissions only. Items change only through ``queue.retry_now`` and ``queue.cancel``,
which respect the workers' leases. The suppression list's pages are made the same
way, over ``queue.search_suppressions``, ``queue.suppress`` and ``queue.unsuppress``.

Permissions, checked on the server for every request: the model's *view* permission
for the pages and the ``.eml`` download, *change* to retry, *delete* to cancel. No
page shows a setting's value, so no password or AUTH string can appear on one.

One module, because its classes share one permission model, one way of reading the
queue and one set of templates; the message preview is ``preview``'s.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
)
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from . import delivery_log
from .conf import get_settings
from .errors import QueueError
from .items import QueueItem, Recipient, RecipientStatus, reply_line
from .models import DeliveryLog, Item
from .models import Suppression as SuppressionModel
from .preview import HeadSummary, preview, srcdoc_for, summarize_head
from .queries import ItemState, QueueSummary, bucket_labels, is_estimate, state_of
from .service import MAX_NOTE, queue
from .suppression import Suppression

#: The Content-Security-Policy of every queue page: scripts from this site only, nothing
#: framed from elsewhere. Inline styles are allowed because a message preview's frame
#: inherits this policy, and mail is styled inline; the frame adds its own, stricter one.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'self'"
)
#: Bytes of each message the list reads to show its subject.
HEAD_BYTES = 2048
#: Recipients the list shows per item; the rest are counted.
LIST_RECIPIENTS = 3

if TYPE_CHECKING:  # ModelAdmin is generic for django-stubs only
    _ItemAdminBase = admin.ModelAdmin[Item]
    _LogAdminBase = admin.ModelAdmin[DeliveryLog]
    _SuppressionAdminBase = admin.ModelAdmin[SuppressionModel]
else:
    _ItemAdminBase = _LogAdminBase = _SuppressionAdminBase = admin.ModelAdmin

RETRY = "retry_now"
CANCEL = "cancel"


def _secure(response: HttpResponseBase) -> HttpResponseBase:
    response["Content-Security-Policy"] = PAGE_CSP
    response["X-Content-Type-Options"] = "nosniff"
    response["Referrer-Policy"] = "same-origin"
    return response


def _page(model_admin: admin.ModelAdmin[Any], view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """A page of ours: ``admin_view`` (active staff only, CSRF-protected, never cached), sent ``_secure``."""
    return model_admin.admin_site.admin_view(lambda *args, **kwargs: _secure(view(*args, **kwargs)))


def _url_of(model_admin: admin.ModelAdmin[Any], name: str, *args: Any) -> str:
    """The URL of one of ``model_admin``'s pages, on its own admin site."""
    opts = model_admin.opts
    return reverse(f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_{name}", args=args)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RecipientRow:
    """A recipient as the pages show it: its state, its last reply and where from."""

    address: str
    status: RecipientStatus
    reply: str
    remote_host: str = ""

    @property
    def reply_code(self) -> str:
        """Return the reply's codes alone (``451 4.7.1``), for the list's narrow column."""
        return " ".join(part for part in self.reply.split()[:2] if any(ch.isdigit() for ch in part))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ItemRow:
    """An item as the list shows it."""

    item: QueueItem
    state: ItemState
    head: HeadSummary | None
    recipients: list[RecipientRow]
    more_recipients: int
    age: timedelta
    due_in: timedelta

    @property
    def age_text(self) -> str:
        return age_text(self.item.created_at, self.item.created_at + self.age)

    @property
    def due_text(self) -> str:
        now = self.item.next_attempt_at - self.due_in
        return timeuntil(self.item.next_attempt_at, now, depth=1)


def _recipient_rows(recipients: Sequence[Recipient], hosts: dict[str, str] | None = None) -> list[RecipientRow]:
    hosts = hosts or {}
    return [
        RecipientRow(
            address=r.address, status=r.status, reply=reply_line(r.reply), remote_host=hosts.get(r.address, "")
        )
        for r in recipients
    ]


def _ids_from(request: HttpRequest) -> list[str]:
    # Ids no item can have are dropped here: they would only be "no longer queued".
    ids = []
    for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
        try:
            ids.append(str(uuid.UUID(value)))
        except ValueError:
            continue
    return list(dict.fromkeys(ids))


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


@admin.register(Item)
class ItemAdmin(_ItemAdminBase):
    """The queue's pages, read through the queue service (any store)."""

    list_per_page = 100

    # -- permissions --------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # mail is queued by sending it, never typed in here

    def _require(self, allowed: Callable[[HttpRequest], bool], request: HttpRequest) -> None:
        if not allowed(request):
            raise PermissionDenied

    # -- URLs ---------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", _page(self, self.changelist_view), name=f"{prefix}_changelist"),
            path("overview/", _page(self, self.overview_view), name=f"{prefix}_overview"),
            path("<str:object_id>/change/", _page(self, self.change_view), name=f"{prefix}_change"),
            path("<str:object_id>/message.eml", _page(self, self.eml_view), name=f"{prefix}_eml"),
            path("<str:object_id>/", _page(self, self.item_redirect), name=f"{prefix}_item"),
        ]

    def _url(self, name: str, *args: Any) -> str:
        return _url_of(self, name, *args)

    def _log_url(self) -> str | None:
        try:
            return reverse(f"{self.admin_site.name}:bumail_queue_deliverylog_changelist")
        except NoReverseMatch:  # a site of your own that leaves the log out
            return None

    def item_redirect(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return HttpResponseRedirect(self._url("change", object_id))

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        log_url = self._log_url()
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "has_view_permission": self.has_view_permission(request),
            "can_retry": self.has_change_permission(request),
            "can_cancel": self.has_delete_permission(request),
            "changelist_url": self._url("changelist"),
            "overview_url": self._url("overview"),
            "log_url": log_url,
            "can_view_log": request.user.has_perm("bumail_queue.view_deliverylog") and log_url is not None,
            **extra,
        }

    # -- the list -----------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        self._require(self.has_view_permission, request)
        if request.method == "POST":
            return self._run_action(request)
        now = timezone.now()
        state_value = request.GET.get("state") or None
        state = state_value if state_value in set(ItemState) else None
        domain = (request.GET.get("domain") or "").strip()[:255]
        text = (request.GET.get("q") or "").strip()[:320]
        try:
            page = max(1, int(request.GET.get("p", "1")))
        except ValueError:
            page = 1
        per_page = self.list_per_page
        # One item more than the page: whether there is a next page, without a count.
        found = queue.search(
            state=state, domain=domain or None, text=text or None, offset=(page - 1) * per_page, limit=per_page + 1
        )
        items, has_next = found[:per_page], len(found) > per_page
        rows = self._rows(items, now)
        filtered = bool(state or domain or text)
        total = None if filtered else queue.store.estimated_count()
        params = {key: value for key, value in (("state", state or ""), ("domain", domain), ("q", text)) if value}

        def link(**changes: Any) -> str:
            merged = {**params, **changes}
            return "?" + urlencode({k: v for k, v in merged.items() if v not in (None, "", 1)})

        context = self._context(
            request,
            _("Queued mail"),
            rows=rows,
            page=page,
            previous_url=link(p=page - 1) if page > 1 else None,
            next_url=link(p=page + 1) if has_next else None,
            total=total,
            total_is_estimate=total is not None and is_estimate(total),
            filtered=filtered,
            query=text,
            domain=domain,
            params=params,
            state_choices=[(None, _("All"), link(state=None, p=1), state is None)]
            + [(s.value, s.label, link(state=s.value, p=1), state == s.value) for s in ItemState],
            clear_url=link(state=None, domain=None, q=None, p=1) if filtered else None,
            actions=[(RETRY, _("Retry now"))] * self.has_change_permission(request)
            + [(CANCEL, _("Cancel…"))] * self.has_delete_permission(request),
            media=self.media,
            return_to=request.get_full_path(),
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/bumail_queue/item/change_list.html", context)

    def _rows(self, items: list[QueueItem], now: datetime) -> list[ItemRow]:
        """The rows of ``items``, their subjects read in one call to the store."""
        heads = queue.store.read_message_heads([item.id for item in items], size=HEAD_BYTES)
        return [self._row(item, heads.get(item.id), now) for item in items]

    def _row(self, item: QueueItem, head: bytes | None, now: datetime) -> ItemRow:
        return ItemRow(
            item=item,
            state=state_of(item, now),
            head=None if head is None else summarize_head(head),
            recipients=_recipient_rows(item.recipients[:LIST_RECIPIENTS]),
            more_recipients=max(0, len(item.recipients) - LIST_RECIPIENTS),
            age=now - item.created_at,
            due_in=item.next_attempt_at - now,
        )

    # -- the actions --------------------------------------------------------------------

    def _run_action(self, request: HttpRequest) -> HttpResponse:
        action = request.POST.get("action", "")
        ids = _ids_from(request)
        back = request.POST.get("next") or ""
        if not url_has_allowed_host_and_scheme(
            back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            back = ""
        if action == RETRY:
            self._require(self.has_change_permission, request)
        elif action == CANCEL:
            self._require(self.has_delete_permission, request)
        else:
            self.message_user(request, _("Choose an action."), messages.WARNING)
            return HttpResponseRedirect(back or self._url("changelist"))
        if not ids:
            self.message_user(request, _("Select the items to act on first."), messages.WARNING)
            return HttpResponseRedirect(back or self._url("changelist"))
        if action == RETRY:
            self._retry(request, ids)
            return HttpResponseRedirect(back or self._url("changelist"))
        if request.POST.get("confirm") != "yes":
            return self._confirm_cancel(request, ids, back)
        self._cancel(request, ids)
        # Back to the list (with its filters), not to the page of an item now gone.
        list_url = self._url("changelist")
        return HttpResponseRedirect(back if back.split("?")[0] == list_url else list_url)

    def _retry(self, request: HttpRequest, ids: list[str]) -> None:
        now = timezone.now()
        retried = gone = busy = 0
        for item_id in ids:
            item = queue.get(item_id)
            if item is None:
                gone += 1
            elif item.is_leased_at(now):
                busy += 1  # its worker is delivering it now; retrying would change nothing
            elif queue.retry_now(item_id):
                retried += 1
            else:
                gone += 1
        parts = [ngettext("%d item retried", "%d items retried", retried) % retried]
        if gone:
            parts.append(ngettext("%d was no longer queued", "%d were no longer queued", gone) % gone)
        if busy:
            parts.append(
                ngettext("%d was being delivered, left alone", "%d were being delivered, left alone", busy) % busy
            )
        self.message_user(request, "; ".join(parts) + ".", messages.SUCCESS if retried else messages.WARNING)

    def _cancel(self, request: HttpRequest, ids: list[str]) -> None:
        cancelled = gone = 0
        for item_id in ids:
            if queue.cancel(item_id) is None:
                gone += 1
            else:
                cancelled += 1
        parts = [ngettext("%d item cancelled", "%d items cancelled", cancelled) % cancelled]
        if gone:
            parts.append(ngettext("%d was no longer queued", "%d were no longer queued", gone) % gone)
        self.message_user(request, "; ".join(parts) + ".", messages.SUCCESS if cancelled else messages.WARNING)

    def _confirm_cancel(self, request: HttpRequest, ids: list[str], back: str) -> HttpResponse:
        now = timezone.now()
        items = [item for item in map(queue.get, ids) if item is not None]
        rows = self._rows(items, now)
        context = self._context(
            request,
            ngettext("Cancel this item?", "Cancel these %(count)d items?", len(items)) % {"count": len(items)},
            rows=rows,
            gone=len(ids) - len(items),
            delivering=sum(row.state == ItemState.DELIVERING for row in rows),
            action=CANCEL,
            next=back,
        )
        return TemplateResponse(request, "admin/bumail_queue/item/cancel_confirmation.html", context)

    # -- the item page ------------------------------------------------------------------

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self._require(self.has_view_permission, request)
        try:
            item_id = str(uuid.UUID(object_id))
        except ValueError:
            raise Http404(_("No queued item has this id.")) from None
        item = queue.get(item_id)
        history = list(delivery_log.history(item_id))
        if item is None and not history:
            raise Http404(_("No queued item has this id, and the delivery log has nothing about it."))
        now = timezone.now()
        data = None if item is None else queue.read_message(item_id)
        shown = None if data is None else preview(data)
        hosts = {entry.recipient: entry.remote_host for entry in history if entry.remote_host}
        context = self._context(
            request,
            shown.subject if shown is not None and shown.subject else _("Queued item %s") % item_id,
            item=item,
            item_id=item_id,
            queued_ago=None if item is None else age_text(item.created_at, now),
            state=None if item is None else state_of(item, now),
            now=now,
            recipients=[] if item is None else _recipient_rows(item.recipients, hosts),
            preview=shown,
            srcdoc=None if shown is None or shown.html is None else srcdoc_for(shown.html),
            message_missing=item is not None and data is None,
            history=history,
            eml_url=self._url("eml", item_id),
            return_to=request.get_full_path(),
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/bumail_queue/item/change_form.html", context)

    def eml_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        self._require(self.has_view_permission, request)
        try:
            item_id = str(uuid.UUID(object_id))
        except ValueError:
            raise Http404 from None
        data = queue.read_message(item_id)
        if data is None:
            raise Http404(_("This item's message is no longer in the queue."))
        response = HttpResponse(data, content_type="message/rfc822")
        response["Content-Disposition"] = f'attachment; filename="{item_id}.eml"'
        return response

    # -- the overview -------------------------------------------------------------------

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        self._require(self.has_view_permission, request)
        summary = queue.summary()
        context = self._context(request, _("Mail queue overview"), **overview_context(summary, self._url("changelist")))
        if get_settings().shaping:
            context["destinations"] = [(state, state.is_throttled(summary.now)) for state in queue.destination_states()]
        if request.user.has_perm("bumail_queue.view_deliverylog") and get_settings().delivery_log:
            since = summary.now - timedelta(hours=24)
            counted = (
                DeliveryLog.objects.using(get_settings().database)
                .filter(logged_at__gte=since)
                .values("status")
                .annotate(n=Count("id"))
            )
            by_status = {row["status"]: row["n"] for row in counted}
            context["last_day"] = [
                (label, by_status.get(value, 0), value) for value, label in DeliveryLog.Status.choices
            ]
        return TemplateResponse(request, "admin/bumail_queue/item/overview.html", context)


def overview_context(summary: QueueSummary, list_url: str, *, top: int = 20) -> dict[str, Any]:
    """Return what the overview page draws: the state bar and the shape's rows."""
    total = summary.total or 1
    states = []
    offset = 0.0
    for state in ItemState:
        count = summary.by_state.get(state, 0)
        width = 100.0 * count / total
        states.append(
            {
                "state": state,
                "count": count,
                "x": round(offset, 3),
                "width": round(width, 3),
                "url": f"{list_url}?state={state.value}",
            }
        )
        offset += width
    shape = summary.shape[:top]
    widest = max((d.total for d in shape), default=0) or 1
    buckets_max = max((n for d in shape for n in d.buckets), default=0) or 1
    rows = [
        {
            "domain": d.domain,
            "total": d.total,
            "bar": round(100.0 * d.total / widest, 3),
            # The heat of each cell: 0 (none) to 5 (the busiest cell of the table).
            "cells": [(n, 0 if n == 0 else 1 + min(4, int(4 * n / buckets_max))) for n in d.buckets],
            "url": f"{list_url}?{urlencode({'domain': d.domain})}",
        }
        for d in shape
    ]
    return {
        "summary": summary,
        "states": states,
        "bucket_labels": bucket_labels(summary.age_buckets),
        "bucket_totals": summary.bucket_totals,
        "shape_rows": rows,
        "shape_left_out": len(summary.shape) - len(shape),
        "oldest_age": None if summary.oldest_created_at is None else age_text(summary.oldest_created_at, summary.now),
    }


def age_text(since: datetime, now: datetime) -> str:
    """Say how long ago ``since`` was, in its largest unit: never "0 minutes", which
    ``timesince`` writes for anything under a minute."""
    if now - since < timedelta(minutes=1):
        return _("under a minute")
    return timesince(since, now, depth=1)


# -- the suppression list -------------------------------------------------------------------

REMOVE = "remove"


class SuppressForm(forms.Form):
    """The admin's form to add an address to the suppression list."""

    address = forms.CharField(label=gettext_lazy("Address"), max_length=320)
    note = forms.CharField(
        label=gettext_lazy("Note"),
        required=False,
        max_length=MAX_NOTE,
        help_text=gettext_lazy("Why, for whoever reads the list later."),
    )
    days = forms.IntegerField(
        label=gettext_lazy("Days"),
        required=False,
        min_value=1,
        max_value=3650,
        help_text=gettext_lazy("How long the entry lasts; empty for SUPPRESSION_DURATION."),
    )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SuppressionRow:
    """An entry as the list shows it."""

    entry: Suppression
    reply: str
    age: str
    expires_in: str


@admin.register(SuppressionModel)
class SuppressionAdmin(_SuppressionAdminBase):
    """The suppression list, read and changed through the queue service (any store).

    *view* for the list, *add* to add an address, *delete* to remove one; the model is
    registered for its URLs and those permissions only, as ``Item`` is.
    """

    list_per_page = 100

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", _page(self, self.changelist_view), name=f"{prefix}_changelist"),
            path("add/", _page(self, self.add_view), name=f"{prefix}_add"),
        ]

    def _url(self, name: str) -> str:
        return _url_of(self, name)

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "has_view_permission": self.has_view_permission(request),
            "can_add": self.has_add_permission(request),
            "can_remove": self.has_delete_permission(request),
            "changelist_url": self._url("changelist"),
            "add_url": self._url("add"),
            "suppression_on": get_settings().suppression,
            **extra,
        }

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._remove(request)
        text = (request.GET.get("q") or "").strip()[:320]
        try:
            page = max(1, int(request.GET.get("p", "1")))
        except ValueError:
            page = 1
        per_page = self.list_per_page
        # One more than the page: whether there is a next page, without a count.
        found = queue.search_suppressions(text=text or None, offset=(page - 1) * per_page, limit=per_page + 1)
        entries, has_next = found[:per_page], len(found) > per_page
        now = timezone.now()

        def link(**changes: Any) -> str:
            merged = {"q": text, "p": page, **changes}
            return "?" + urlencode({k: v for k, v in merged.items() if v not in (None, "", 1)})

        context = self._context(
            request,
            _("Suppressed addresses"),
            rows=[
                SuppressionRow(
                    entry=entry,
                    reply=reply_line(entry.reply),
                    age=age_text(entry.created_at, now),
                    expires_in=timeuntil(entry.expires_at, now, depth=1),
                )
                for entry in entries
            ],
            query=text,
            page=page,
            previous_url=link(p=page - 1) if page > 1 else None,
            next_url=link(p=page + 1) if has_next else None,
            total=None if text else queue.count_suppressions(),
            return_to=request.get_full_path(),
            media=self.media,
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/bumail_queue/suppression/change_list.html", context)

    def _remove(self, request: HttpRequest) -> HttpResponse:
        if not self.has_delete_permission(request):
            raise PermissionDenied
        back = request.POST.get("next") or ""
        if not url_has_allowed_host_and_scheme(
            back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            back = ""
        addresses = list(dict.fromkeys(request.POST.getlist(ACTION_CHECKBOX_NAME)))
        if request.POST.get("action") != REMOVE:
            self.message_user(request, _("Choose an action."), messages.WARNING)
        elif not addresses:
            self.message_user(request, _("Select the addresses to remove first."), messages.WARNING)
        else:
            removed = len(queue.unsuppress(addresses))
            gone = len(addresses) - removed
            parts = [ngettext("%d address removed", "%d addresses removed", removed) % removed]
            if gone:
                parts.append(ngettext("%d was no longer on the list", "%d were no longer on the list", gone) % gone)
            self.message_user(request, "; ".join(parts) + ".", messages.SUCCESS if removed else messages.WARNING)
        return HttpResponseRedirect(back or self._url("changelist"))

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = SuppressForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            days = form.cleaned_data["days"]
            try:
                entry = queue.suppress(
                    form.cleaned_data["address"].strip(),
                    note=form.cleaned_data["note"],
                    duration=None if days is None else timedelta(days=days),
                )
            except QueueError as error:
                if error.code != "INVALID":
                    raise
                form.add_error("address", error.message)
            else:
                self.message_user(
                    request,
                    _("%(address)s is suppressed until %(until)s.")
                    % {"address": entry.address, "until": f"{entry.expires_at:%Y-%m-%d %H:%M %Z}"},
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(self._url("changelist"))
        context = self._context(request, _("Suppress an address"), form=form, **(extra_context or {}))
        return TemplateResponse(request, "admin/bumail_queue/suppression/add_form.html", context)

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("bumail_queue/admin.css",)}


# -- the delivery log ---------------------------------------------------------------------


@admin.register(DeliveryLog)
class DeliveryLogAdmin(_LogAdminBase):
    """The delivery log, read-only: entries are written by the worker, deleted by age."""

    list_display = ("logged_at", "recipient", "status_badge", "reply", "remote", "item")
    list_filter = ("status",)
    search_fields = ("recipient", "sender")
    search_help_text = gettext_lazy("An address (or part of one), or an item id.")
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # counts per status would scan a large log
    paginator = EstimatedCountPaginator
    readonly_fields = (
        "logged_at", "item_id", "recipient", "domain", "sender", "status", "reply_code", "reply_status",
        "reply_text", "remote_host", "tls", "next_attempt_at",
    )  # fmt: skip

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
