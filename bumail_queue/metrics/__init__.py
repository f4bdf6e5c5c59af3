"""Prometheus metrics, with ``pip install "bumail_queue[prometheus]"`` (docs/metrics.md).

- ``queue``: ``QueueCollector``, the queue's gauges, read through the store at every
  scrape (``QueueStore.gauges``), and the delivery log's last hour;
- ``worker``: ``WorkerMetrics``, one worker's counters and histograms: the ``Meter``
  the worker tells what it does;
- ``server``: the worker's own HTTP endpoint (``queue_worker --metrics-port``);
- ``views``: ``QueueMetricsView``, the queue's gauges served by the web process.

Only this module is imported without prometheus-client installed: the queue runs
without it, and asking for metrics then says what to install.
"""

from __future__ import annotations

from bumail_queue.errors import QueueConfigurationError

#: What asking for metrics says when prometheus-client is not installed.
PROMETHEUS_MISSING = (
    "Prometheus metrics need prometheus-client, which is not installed: "
    "pip install 'bumail_queue[prometheus]' (or prometheus-client)."
)


def prometheus_installed() -> bool:
    """Return whether prometheus-client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def require_prometheus() -> None:
    """Raise ``QueueConfigurationError`` (an ``ImproperlyConfigured``) naming the package
    to install when prometheus-client is not installed."""
    if not prometheus_installed():
        raise QueueConfigurationError(PROMETHEUS_MISSING)
