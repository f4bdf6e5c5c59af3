from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from bumail_queue.metrics.views import QueueMetricsView

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("anymail/", include("anymail.urls")),
    path("mail/", include("bumail_queue.urls")),
    path("metrics/queue/", QueueMetricsView.as_view()),
    path("send-one/", views.send_one),
    path("send-many/", views.send_many),
    path("send-then-fail/", views.send_then_fail),
    path("send-one-then-fail/", views.send_one_then_fail),
    path("send-async/", views.send_async),
    path("send-async-in-a-transaction/", views.send_async_in_a_transaction),
]
