"""The worker's metrics endpoint: its counters, its process's, and the queue's gauges.

``queue_worker --metrics-port N`` serves them with prometheus-client's own HTTP
server, on a daemon thread, at any path (``/metrics`` by convention), on loopback
unless ``--metrics-address`` says otherwise: the endpoint has no access control.
"""

from __future__ import annotations

import dataclasses
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, start_http_server

from .queue import QueueCollector
from .worker import WorkerMetrics


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerRegistry:
    """A worker process's registry and the ``Meter`` to give its ``Worker``."""

    registry: CollectorRegistry
    metrics: WorkerMetrics


def worker_registry(*, domains: frozenset[str], queue_gauges: bool) -> WorkerRegistry:
    """Return a registry of a worker's metrics, its process's (CPU, memory, open files,
    the garbage collector, as prometheus-client reports them by default) and, with
    ``queue_gauges``, the queue's (read from the store at each scrape)."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    metrics = WorkerMetrics(registry=registry, domains=domains)
    if queue_gauges:
        # Each scrape is served on a thread of its own: its database connection goes with it.
        registry.register(QueueCollector(close_connections=True))
    return WorkerRegistry(registry=registry, metrics=metrics)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MetricsServer:
    """A running endpoint; ``close()`` stops it."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def address(self) -> tuple[str, int]:
        """Return the address and port it listens on (the port chosen when 0 was asked)."""
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve(registry: CollectorRegistry, *, address: str, port: int) -> MetricsServer:
    """Serve ``registry`` over HTTP at ``address``:``port`` (0: any free port) on a
    daemon thread; raise ``OSError`` when the address cannot be bound."""
    server, thread = start_http_server(port, addr=address, registry=registry)
    return MetricsServer(server=server, thread=thread)
