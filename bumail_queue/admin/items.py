"""The queue's items: the list, the actions (retry, cancel), the item page, its ``.eml``
and the overview's page."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.timesince import timeuntil
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from bumail_queue import delivery_log
from bumail_queue.conf import get_settings
from bumail_queue.items import QueueItem, Recipient, RecipientStatus, reply_line
from bumail_queue.models import DeliveryLog, Item
from bumail_queue.preview import HeadSummary, preview, srcdoc_for, summarize_head
from bumail_queue.queries import ItemState, is_estimate, state_of
from bumail_queue.screening import FirewallMark, firewall_mark
from bumail_queue.service import queue

from .addresses import AddressPage
from .archive import archive_links
from .bulk import bulk_actions_url
from .bulk_actions import (
    CANCEL,
    HOLD,
    RELEASE,
    RETRY,
    SELECT_ACROSS,
    AllMatching,
    ListFilter,
    all_matching_context,
    hold_or_release_selected,
)
from .overview import overview_context
from .shared import (
    ItemAdminBase,
    admin_page,
    age_text,
    url_of,
)

#: Bytes of each message the list reads to show its subject.
HEAD_BYTES = 2048
#: Recipients the list shows per item; the rest are counted.
LIST_RECIPIENTS = 3


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
    firewall: FirewallMark | None = None  # held or redirected by the staging firewall

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


#: A filter's choice as the list's template draws it: value, label, URL, selected.
_Choice = tuple[Any, str, str, bool]


def _lane_filters(
    link: Callable[..., str], channel: str | None, priority: int | None, lanes: Sequence[tuple[str, int]]
) -> list[tuple[str, str, list[_Choice]]]:
    """The channel and priority filters, each once there is more than one value to
    choose from (or one is chosen): ``(name, title, [(value, label, url, selected)])``."""
    channels = sorted({c for c, _ in lanes} | ({channel} if channel else set()))
    priorities = sorted({p for _, p in lanes} | ({priority} if priority is not None else set()), reverse=True)
    filters: list[tuple[str, str, list[_Choice]]] = []
    if len(channels) > 1 or channel:
        by_channel: list[_Choice] = [(c, c, link(channel=c, p=1), channel == c) for c in channels]
        every_channel: _Choice = (None, _("All"), link(channel=None, p=1), channel is None)
        filters.append(("channel", _("By channel"), [every_channel, *by_channel]))
    if len(priorities) > 1 or priority is not None:
        by_priority: list[_Choice] = [(p, str(p), link(priority=str(p), p=1), priority == p) for p in priorities]
        every_priority: _Choice = (None, _("All"), link(priority=None, p=1), priority is None)
        filters.append(("priority", _("By priority"), [every_priority, *by_priority]))
    return filters


def _ids_from(request: HttpRequest) -> list[str]:
    # Ids no item can have are dropped here: they would only be "no longer queued".
    ids = []
    for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
        try:
            ids.append(str(uuid.UUID(value)))
        except ValueError:
            continue
    return list(dict.fromkeys(ids))


@admin.register(Item)
class ItemAdmin(ItemAdminBase):
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
            path("", admin_page(self, self.changelist_view), name=f"{prefix}_changelist"),
            path("overview/", admin_page(self, self.overview_view), name=f"{prefix}_overview"),
            path("address/<path:address>/", admin_page(self, AddressPage(self)), name=f"{prefix}_address"),
            path("<str:object_id>/change/", admin_page(self, self.change_view), name=f"{prefix}_change"),
            path("<str:object_id>/message.eml", admin_page(self, self.eml_view), name=f"{prefix}_eml"),
            path("<str:object_id>/", admin_page(self, self.item_redirect), name=f"{prefix}_item"),
        ]

    def _url(self, name: str, *args: Any) -> str:
        return url_of(self, name, *args)

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
            "bulk_actions_url": bulk_actions_url(self.admin_site, request),
            **extra,
        }

    # -- the list -----------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        self._require(self.has_view_permission, request)
        if request.method == "POST":
            return self._run_action(request)
        now = timezone.now()
        listed = ListFilter.from_query(request.GET)
        state, domain, text = listed.state, listed.domain, listed.text
        channel, priority = listed.channel, listed.priority
        try:
            page = max(1, int(request.GET.get("p", "1")))
        except ValueError:
            page = 1
        per_page = self.list_per_page
        # One item more than the page: whether there is a next page, without a count.
        found = queue.search(
            state=state,
            domain=domain or None,
            text=text or None,
            channel=channel,
            priority=priority,
            offset=(page - 1) * per_page,
            limit=per_page + 1,
        )
        items, has_next = found[:per_page], len(found) > per_page
        rows = self._rows(items, now)
        filtered = listed.is_filtered
        total = None if filtered else queue.store.estimated_count()
        params = listed.params

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
            lane_filters=_lane_filters(link, channel, priority, queue.store.lanes()),
            clear_url=link(state=None, domain=None, q=None, channel=None, priority=None, p=1) if filtered else None,
            actions=[(RETRY, _("Retry now")), (HOLD, _("Hold")), (RELEASE, _("Release"))]
            * self.has_change_permission(request)
            + [(CANCEL, _("Cancel…"))] * self.has_delete_permission(request),
            **all_matching_context(listed, shown=len(rows), whole=page == 1 and not has_next),
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
            firewall=firewall_mark(item, head, get_settings().firewall),
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
        if action in (RETRY, HOLD, RELEASE):
            self._require(self.has_change_permission, request)
        elif action == CANCEL:
            self._require(self.has_delete_permission, request)
        else:
            self.message_user(request, _("Choose an action."), messages.WARNING)
            return HttpResponseRedirect(back or self._url("changelist"))
        if request.POST.get(SELECT_ACROSS) == "1":
            return AllMatching(self, list_url=self._url("changelist"))(request, action, back)
        if not ids:
            self.message_user(request, _("Select the items to act on first."), messages.WARNING)
            return HttpResponseRedirect(back or self._url("changelist"))
        if action in (HOLD, RELEASE):
            hold_or_release_selected(self, request, action, ids)
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
            firewall=None if item is None else firewall_mark(item, data, get_settings().firewall),
            now=now,
            recipients=[] if item is None else _recipient_rows(item.recipients, hosts),
            preview=shown,
            srcdoc=None if shown is None or shown.html is None else srcdoc_for(shown.html),
            message_missing=item is not None and data is None,
            history=history,
            eml_url=self._url("eml", item_id),
            archive_links=archive_links(self.admin_site, item_id),
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
