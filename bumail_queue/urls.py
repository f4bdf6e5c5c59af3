"""The URLs a site includes for one-click unsubscribe (RFC 8058)::

    path("mail/", include("bumail_queue.urls")),

serves ``/mail/unsubscribe/<token>/``; ``UNSUBSCRIBE``'s ``URL`` is then
``"https://www.example.com/mail/unsubscribe/"``.
"""

from __future__ import annotations

from django.urls import path

from bumail_queue.feedback import views

app_name = "bumail_queue"

urlpatterns = [
    path("unsubscribe/<str:token>/", views.unsubscribe, name="unsubscribe"),
]
