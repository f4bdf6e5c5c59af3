"""``manage.py queue_worker``: claim due mail and deliver it until stopped."""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError

from bumail_queue.conf import QueueSettings, get_settings
from bumail_queue.errors import QueueConfigurationError, QueueError
from bumail_queue.management.arguments import host_and_port, listen_address, listen_error, port, positive_int
from bumail_queue.stores.base import QueueStore
from bumail_queue.worker import Worker

if TYPE_CHECKING:
    from bumail_queue.metrics.server import MetricsServer, WorkerRegistry

logger = logging.getLogger("bumail_queue.worker")


def owner_name(value: str) -> str:
    if not value or len(value) > 255 or any(ord(ch) < 33 or ord(ch) == 127 for ch in value):
        raise argparse.ArgumentTypeError("an owner name is 1 to 255 printable characters without spaces")
    return value


@contextmanager
def stop_on_signals(worker: Worker) -> Iterator[None]:
    """First SIGTERM/SIGINT: stop gracefully. Second: exit at once (status 1)."""

    def handle(signum: int, frame: Any) -> None:
        if worker.stopping:
            sys.exit(1)  # the second signal: at once
        worker.request_stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Command(BaseCommand):
    help = "Deliver queued mail: claim what is due, send it over SMTP, record each recipient's outcome."
    # The queue's own checks only: a worker (and each --burst run from cron) starts
    # in a fraction of the time the whole project's take; deploys run those anyway.
    requires_system_checks = ("bumail_queue",)

    def run_from_argv(self, argv: list[str]) -> None:
        # Only on the command line, where the process ends with the command (not under
        # call_command, whose caller goes on). Start-up's objects, Django's and every
        # module's, live as long as the process: frozen, the collector stops walking
        # them in each full collection. Frozen again at the end, the process skips the
        # interpreter's last collection of everything, which would walk every object
        # only to free memory the system takes back at exit anyway.
        gc.freeze()
        try:
            super().run_from_argv(argv)
        finally:
            gc.freeze()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--concurrency", type=positive_int, help="SMTP sessions in flight (default: CONCURRENCY)")
        parser.add_argument(
            "--domain-concurrency",
            type=positive_int,
            help="sessions per destination domain (default: DOMAIN_CONCURRENCY)",
        )
        parser.add_argument(
            "--owner", type=owner_name, help="this worker's name on its leases (default: host-pid-random)"
        )
        parser.add_argument("--burst", action="store_true", help="deliver what is due, then exit")
        inbound = parser.add_argument_group("Returned mail (needs bumail_queue[feedback]; docs/feedback.md)")
        inbound.add_argument(
            "--inbound",
            type=host_and_port,
            metavar="HOST:PORT",
            help="also take returned mail over LMTP on HOST:PORT, as queue_inbound --listen does",
        )
        inbound.add_argument("--inbound-smtp", action="store_true", help="speak SMTP there rather than LMTP")
        metrics = parser.add_argument_group("Prometheus metrics (needs bumail_queue[prometheus]; docs/metrics.md)")
        metrics.add_argument(
            "--metrics-port", type=port, help="serve metrics over HTTP on this port (0: any free port, logged)"
        )
        metrics.add_argument(
            "--metrics-address",
            type=listen_address,
            help="the address to serve them on (default: 127.0.0.1; the endpoint has no access control)",
        )
        metrics.add_argument(
            "--no-queue-gauges",
            action="store_true",
            help="serve this worker's metrics only, not the queue's gauges (read from the store at each scrape)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        settings = get_settings()
        metrics = _worker_metrics(options, domains=settings.metrics_domains)
        worker = Worker(
            settings=settings,
            owner=options["owner"],
            concurrency=options["concurrency"],
            domain_concurrency=options["domain_concurrency"],
            burst=options["burst"],
            meter=None if metrics is None else metrics.metrics,
        )
        require_store(worker.store, burst=worker.burst)
        with ExitStack() as stack:
            if metrics is not None:
                address = options["metrics_address"] or DEFAULT_METRICS_ADDRESS
                stack.callback(_serve_metrics(metrics, worker, address, options["metrics_port"]).close)
            if options["inbound"] is not None:
                stack.callback(_listen_for_returned_mail(settings, *options["inbound"], smtp=options["inbound_smtp"]))
            elif options["inbound_smtp"]:
                raise CommandError("--inbound-smtp goes with --inbound.")
            self._run(worker, settings)

    def _run(self, worker: Worker, settings: QueueSettings) -> None:
        logger.info(
            "starting owner=%s store=%s route=%s concurrency=%d domain_concurrency=%d lease=%ss burst=%s",
            worker.owner, type(worker.store).__name__, _describe_route(settings), worker.concurrency,
            worker.domain_concurrency, settings.lease_seconds, worker.burst,
        )  # fmt: skip
        with stop_on_signals(worker):
            stats = worker.run()
        logger.info(
            "stopped items=%d delivered=%d deferred=%d failed=%d held=%d",
            stats.items, stats.delivered, stats.deferred, stats.failed, stats.held,
        )  # fmt: skip
        if worker.configuration_error is not None:
            raise CommandError(worker.configuration_error.message)
        if worker.burst and stats.store_errors:
            # 0 says nothing was left due: cron and scripts must not take a pass that
            # could not claim or record for one that found nothing to do.
            raise CommandError(
                f"The queue's store failed {stats.store_errors} time{'s' if stats.store_errors != 1 else ''} "
                "during this run (see the log): due mail may be left."
            )

    def _configure_logging(self, verbosity: int) -> None:
        root = logging.getLogger("bumail_queue")
        if not root.handlers:
            handler = logging.StreamHandler(self.stdout)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
            root.addHandler(handler)
        root.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))


#: Where ``--metrics-port`` listens unless ``--metrics-address`` says otherwise: this
#: machine only, as the endpoint has no access control (a scraper on the same host,
#: or a sidecar, reaches it; anything else needs the address given on purpose).
DEFAULT_METRICS_ADDRESS = "127.0.0.1"


def _worker_metrics(options: dict[str, Any], *, domains: frozenset[str]) -> WorkerRegistry | None:
    """Build the worker's metrics when ``--metrics-port`` asks for them."""
    if options["metrics_port"] is None:
        for flag in ("metrics_address", "no_queue_gauges"):
            if options[flag]:
                raise CommandError(f"--{flag.replace('_', '-')} goes with --metrics-port.")
        return None
    from bumail_queue.metrics import require_prometheus

    try:
        require_prometheus()
    except QueueConfigurationError as error:
        raise CommandError(error.message) from error
    from bumail_queue.metrics.server import worker_registry

    return worker_registry(domains=domains, queue_gauges=not options["no_queue_gauges"])


def _serve_metrics(metrics: WorkerRegistry, worker: Worker, address: str, port: int) -> MetricsServer:
    from bumail_queue.metrics.server import serve

    metrics.metrics.watch(sessions=worker.sessions_under_way, concurrency=worker.concurrency)
    try:
        server = serve(metrics.registry, address=address, port=port)
    except OSError as error:
        raise CommandError(f"Cannot serve metrics on {address} port {port}: {error.strerror or error}.") from error
    logger.info("serving metrics on %s", server.url, extra={"action": "metrics"})
    return server


def _listen_for_returned_mail(settings: QueueSettings, host: str, port: int, *, smtp: bool) -> Callable[[], None]:
    """Start ``queue_inbound``'s listener beside the worker; return what stops it."""
    if importlib.util.find_spec("aiosmtpd") is None:
        raise CommandError("--inbound needs aiosmtpd: pip install 'bumail-queue[feedback]'.")
    from bumail_queue.feedback.inbound import Listener
    from bumail_queue.feedback.processing import process_returned_mail

    listener = Listener(
        settings=settings,
        process=lambda raw, recipients: process_returned_mail(raw, recipients=recipients),
        host=host,
        port=port,
        lmtp=not smtp,
    )
    try:
        bound = listener.start()
    except OSError as error:
        raise CommandError(f"Cannot listen on {host} port {port}: {listen_error(error)}.") from error
    logger.info("inbound listening on %s://%s:%d", "smtp" if smtp else "lmtp", *bound)
    return listener.close


def require_store(store: QueueStore, *, burst: bool) -> None:
    """Read the store once before starting, so a set-up it refuses stops the command.

    A store set up wrongly (a Redis that may evict, another application's prefix)
    never starts a worker. One out of reach (not migrated, down) fails a ``--burst``
    run; a lasting worker says so and keeps trying, as it does when the store goes
    away later (a worker started before its database is common in deployments).
    """
    try:
        store.estimated_count()
    except QueueConfigurationError as error:
        raise CommandError(error.message) from error
    except QueueError as error:
        if burst:
            raise CommandError(f"Could not read the queue: {error.message}") from error
        logger.warning("the store cannot be read yet, trying again: %s", error, extra={"action": "error"})


def _describe_route(settings: Any) -> str:
    """Say where mail goes: ``ROUTE``, and how many domains ``ROUTES`` sends elsewhere."""
    described = _describe(settings.route)
    if settings.routes:
        described += f" routes={len(settings.routes)} ({', '.join(sorted(settings.routes)[:3])}"
        described += ", ...)" if len(settings.routes) > 3 else ")"
    return described


def _describe(route: Any) -> str:
    # Never the password: the host, the port and whether AUTH is used.
    if route.type == "mx":
        return "mx"
    auth = " auth" if route.username else ""
    return f"smarthost {route.host}:{route.port} tls={route.tls}{auth}"
