"""The queue's gauges for Prometheus, served by the web process.

::

    from bumail_queue.metrics.views import QueueMetricsView

    urlpatterns = [..., path("metrics/queue/", QueueMetricsView.as_view())]

Who may read it: a request with ``Authorization: Bearer <METRICS_TOKEN>`` (how
Prometheus scrapes it), or a signed-in staff user with the ``view_item`` permission
of the queue, who could see the same counts in the admin. Anyone else gets 401 (no
or a wrong token) or 403 (signed in without the permission). Importing this module
without prometheus-client installed raises ``ImproperlyConfigured`` saying what to
install.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from bumail_queue.conf import get_settings

from . import require_prometheus

require_prometheus()

from prometheus_client import CollectorRegistry  # noqa: E402 - said what to install first
from prometheus_client.django import PrometheusDjangoView  # noqa: E402

from .queue import QueueCollector  # noqa: E402

#: The permission a signed-in staff user needs: the admin's to see queued items.
PERMISSION = "bumail_queue.view_item"


def _queue_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(QueueCollector())
    return registry


@method_decorator(never_cache, name="dispatch")
class QueueMetricsView(PrometheusDjangoView):
    """The queue's gauges (``bumail_queue.metrics.queue``) in Prometheus' text format,
    or OpenMetrics when the scraper asks for it; see the module for who may read them."""

    registry = _queue_registry()

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        response: HttpResponseBase = super().dispatch(request, *args, **kwargs)
        return response

    @staticmethod
    def refusal(request: HttpRequest) -> HttpResponse | None:
        """Return the response that refuses ``request``, or ``None`` to serve it."""
        token = get_settings().metrics_token
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if (
            token is not None
            and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), token.encode())
        ):
            return None
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            if user.is_staff and user.has_perm(PERMISSION):
                return None
            return HttpResponse("Forbidden: the queue's metrics need the view_item permission.\n", status=403)
        response = HttpResponse("Unauthorized: send Authorization: Bearer <METRICS_TOKEN>.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="bumail_queue metrics"'
        return response
