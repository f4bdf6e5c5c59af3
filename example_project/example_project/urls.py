"""URLs of the example project: the mailing pages, the admin and the unsubscribe view."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # One-click unsubscribe (RFC 8058) for the channels of BUMAIL_QUEUE["UNSUBSCRIBE"].
    path("mail/", include("bumail_queue.urls")),
    path("", include("mailing.urls")),
]
