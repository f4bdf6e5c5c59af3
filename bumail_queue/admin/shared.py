"""What every page of the queue's admin shares: its security headers, how a page is
wrapped and found, the model admins' base classes, and how an age is said."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.contrib import admin
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
)
from django.urls import reverse
from django.utils.timesince import timesince
from django.utils.translation import gettext as _

from bumail_queue.models import DeliveryLog, Item
from bumail_queue.models import Suppression as SuppressionModel

#: The Content-Security-Policy of every queue page: scripts from this site only, nothing
#: framed from elsewhere. Inline styles are allowed because a message preview's frame
#: inherits this policy, and mail is styled inline; the frame adds its own, stricter one.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'self'"
)

if TYPE_CHECKING:  # ModelAdmin is generic for django-stubs only
    ItemAdminBase = admin.ModelAdmin[Item]
    LogAdminBase = admin.ModelAdmin[DeliveryLog]
    SuppressionAdminBase = admin.ModelAdmin[SuppressionModel]
else:
    ItemAdminBase = LogAdminBase = SuppressionAdminBase = admin.ModelAdmin


_Response = TypeVar("_Response", bound=HttpResponseBase)


def secure(response: _Response) -> _Response:
    """Give ``response`` the headers of every page of the queue's admin."""
    response["Content-Security-Policy"] = PAGE_CSP
    response["X-Content-Type-Options"] = "nosniff"
    response["Referrer-Policy"] = "same-origin"
    return response


class SecurePages:
    """Django's own pages of a model admin (list, object, history), sent with the
    headers of every other page of the queue's."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return secure(cast(HttpResponse, super().changelist_view(request, extra_context)))  # type: ignore[misc]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return secure(cast(HttpResponse, super().change_view(request, object_id, form_url, extra_context)))  # type: ignore[misc]

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return secure(cast(HttpResponse, super().history_view(request, object_id, extra_context)))  # type: ignore[misc]


def admin_page(
    model_admin: admin.ModelAdmin[Any], view: Callable[..., HttpResponseBase]
) -> Callable[..., HttpResponseBase]:
    """A page of ours: ``admin_view`` (active staff only, CSRF-protected, never cached), sent ``secure``."""
    return model_admin.admin_site.admin_view(lambda *args, **kwargs: secure(view(*args, **kwargs)))


def url_of(model_admin: admin.ModelAdmin[Any], name: str, *args: Any) -> str:
    """The URL of one of ``model_admin``'s pages, on its own admin site."""
    opts = model_admin.opts
    return reverse(f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_{name}", args=args)


def age_text(since: datetime, now: datetime) -> str:
    """Say how long ago ``since`` was, in its largest unit: never "0 minutes", which
    ``timesince`` writes for anything under a minute."""
    if now - since < timedelta(minutes=1):
        return _("under a minute")
    return timesince(since, now, depth=1)
