from __future__ import annotations

from django.urls import path

from . import views

app_name = "mailing"

urlpatterns = [
    path("", views.compose, name="compose"),
    path("queue/", views.queue_list, name="queue"),
    path("queue/<uuid:item_id>/cancel/", views.cancel, name="cancel"),
]
