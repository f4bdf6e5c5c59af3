"""The suppression list's pages: the list, removing entries, adding an address."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any, ClassVar
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.timesince import timeuntil
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from bumail_queue.conf import get_settings
from bumail_queue.errors import QueueError
from bumail_queue.items import CHANNEL_MAX_LENGTH, check_channel, reply_line
from bumail_queue.models import Suppression as SuppressionModel
from bumail_queue.service import MAX_NOTE, queue
from bumail_queue.suppression import (
    GLOBAL_SCOPE,
    Suppression,
    SuppressionReason,
    channel_scope,
    is_scope,
    scope_label,
)

from .shared import (
    SuppressionAdminBase,
    admin_page,
    age_text,
    url_of,
)

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
    channel = forms.CharField(
        label=gettext_lazy("Channel"),
        required=False,
        max_length=CHANNEL_MAX_LENGTH,
        help_text=gettext_lazy("Suppress the address for this channel's mail alone; empty for all mail."),
    )


def selection_value(entry: Suppression) -> str:
    """The value of an entry's checkbox: its address, after its scope and a ``|`` unless global."""
    return f"{entry.scope}|{entry.address}" if entry.scope != GLOBAL_SCOPE else entry.address


def selected_entry(value: str) -> tuple[str, str]:
    """The address and scope a checkbox's value names (``selection_value``)."""
    scope, bar, address = value.partition("|")
    if bar and scope and is_scope(scope):
        return address, scope
    return value, GLOBAL_SCOPE


def filter_scope(value: str) -> str | None:
    """The scope a ``scope`` filter asks for: ``global``, ``channel:<name>``, or any (``None``)."""
    if value == "global":
        return GLOBAL_SCOPE
    return value if value and is_scope(value) else None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SuppressionRow:
    """An entry as the list shows it."""

    entry: Suppression
    reply: str
    age: str
    expires_in: str
    scope: str
    value: str


@admin.register(SuppressionModel)
class SuppressionAdmin(SuppressionAdminBase):
    """The suppression list, read and changed through the queue service (any store).

    *view* for the list, *add* to add an address, *delete* to remove one; the model is
    registered for its URLs and those permissions only, as ``Item`` is.
    """

    list_per_page = 100

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", admin_page(self, self.changelist_view), name=f"{prefix}_changelist"),
            path("add/", admin_page(self, self.add_view), name=f"{prefix}_add"),
        ]

    def _url(self, name: str) -> str:
        return url_of(self, name)

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
        scope = filter_scope(request.GET.get("scope") or "")
        reason = request.GET.get("reason") or ""
        reason = reason if reason in {r.value for r in SuppressionReason} else ""
        try:
            page = max(1, int(request.GET.get("p", "1")))
        except ValueError:
            page = 1
        per_page = self.list_per_page
        # One more than the page: whether there is a next page, without a count.
        found = queue.search_suppressions(
            text=text or None,
            scope=scope,
            reason=reason or None,
            offset=(page - 1) * per_page,
            limit=per_page + 1,
        )
        entries, has_next = found[:per_page], len(found) > per_page
        now = timezone.now()
        scope_value = "" if scope is None else (scope or "global")

        def link(**changes: Any) -> str:
            merged = {"q": text, "scope": scope_value, "reason": reason, "p": page, **changes}
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
                    scope=scope_label(entry.scope),
                    value=selection_value(entry),
                )
                for entry in entries
            ],
            query=text,
            filters=[
                ("scope", _("Scope"), scope_value, self._scope_choices(scope_value)),
                ("reason", _("Why"), reason, [("", _("any")), *[(r.value, r.value) for r in SuppressionReason]]),
            ],
            filtered=bool(text or scope is not None or reason),
            page=page,
            previous_url=link(p=page - 1) if page > 1 else None,
            next_url=link(p=page + 1) if has_next else None,
            total=None if text or scope is not None or reason else queue.count_suppressions(),
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
        selected = list(dict.fromkeys(request.POST.getlist(ACTION_CHECKBOX_NAME)))
        if request.POST.get("action") != REMOVE:
            self.message_user(request, _("Choose an action."), messages.WARNING)
        elif not selected:
            self.message_user(request, _("Select the addresses to remove first."), messages.WARNING)
        else:
            by_scope: dict[str, list[str]] = {}
            for address, scope in map(selected_entry, selected):
                by_scope.setdefault(scope, []).append(address)
            removed = sum(len(queue.unsuppress(addresses, scope=scope)) for scope, addresses in by_scope.items())
            gone = len(selected) - removed
            parts = [ngettext("%d address removed", "%d addresses removed", removed) % removed]
            if gone:
                parts.append(ngettext("%d was no longer on the list", "%d were no longer on the list", gone) % gone)
            self.message_user(request, "; ".join(parts) + ".", messages.SUCCESS if removed else messages.WARNING)
        return HttpResponseRedirect(back or self._url("changelist"))

    def _scope_choices(self, chosen: str) -> list[tuple[str, str]]:
        """Any scope, all mail, and each channel the settings name (and the one chosen)."""
        settings = get_settings()
        channels = {*settings.unsubscribe, *settings.channel_routes}
        scopes = sorted({*(channel_scope(channel) for channel in channels), *([chosen] if ":" in chosen else [])})
        return [("", _("any")), ("global", _("all mail")), *[(scope, scope) for scope in scopes]]

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = SuppressForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            days = form.cleaned_data["days"]
            channel = form.cleaned_data["channel"].strip()
            try:
                entry = queue.suppress(
                    form.cleaned_data["address"].strip(),
                    note=form.cleaned_data["note"],
                    duration=None if days is None else timedelta(days=days),
                    scope=channel_scope(check_channel(channel)) if channel else GLOBAL_SCOPE,
                )
            except QueueError as error:
                if error.code != "INVALID":
                    raise
                form.add_error("channel" if "channel" in error.message else "address", error.message)
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
