"""One worker's counters and histograms: what it did since it started.

``WorkerMetrics`` is the ``Meter`` (``outcomes.Meter``) a worker is given when its
metrics are on: the worker and its recorder call it where they already count
(``Stats``), and without it they pay one ``is None`` test per event. Each worker
process has its own registry and endpoint; Prometheus adds them up across workers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bumail_queue.conf import normalise_domain
from bumail_queue.items import Outcome, QueueItem, RecipientStatus, Reply

#: The label value of every recipient domain not in ``METRICS_DOMAINS``.
OTHER_DOMAIN = "other"

#: One item's attempt: a reused connection's transaction takes milliseconds, a slow
#: server's session minutes (``TIMEOUTS``' SESSION is 30).
SESSION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
#: Enqueue to delivery: under a second when all goes well, hours to days through
#: retries (``MAX_AGE`` is 5 days by default, 432,000 s).
DELIVERY_BUCKETS = (
    0.1, 0.25, 0.5, 1, 2.5, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 172800,
    259200, 432000, 604800,
)  # fmt: skip
#: Items per claim; 0 is an idle worker's poll (``CLAIM_BATCH_SIZE`` is 50 by default).
CLAIM_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def reply_class(reply: Reply) -> str:
    """Return a reply's class as a label value: ``2xx``, ``4xx``, ``5xx``; ``none`` when
    no server answered (DNS, a refused connection, a timeout before the greeting)."""
    if reply.code is None or not 200 <= reply.code <= 599:
        return "none"
    return f"{reply.code // 100}xx"


class WorkerMetrics:
    """A worker's metrics in ``registry``; ``domains`` (``METRICS_DOMAINS``, in
    ``normalise_domain``'s form) get a ``domain`` label of their own, every other
    domain is ``other``: a label's values stay as few as the project chose."""

    def __init__(self, *, registry: CollectorRegistry, domains: Collection[str] = ()) -> None:
        self.domains = frozenset(domains)
        self.attempts = Counter(
            "bumail_queue_attempts",
            "Delivery attempts, one per recipient tried, by outcome, reply class and recipient domain.",
            ["outcome", "reply_class", "domain"],
            registry=registry,
        )
        self.session_duration = Histogram(
            "bumail_queue_session_duration_seconds",
            "Time a delivery thread spent on one item's attempt: routing, DNS, and the SMTP session of each destination.",
            buckets=SESSION_BUCKETS,
            registry=registry,
        )
        self.time_to_delivery = Histogram(
            "bumail_queue_time_to_delivery_seconds",
            "Time from enqueue to delivery, per recipient delivered.",
            buckets=DELIVERY_BUCKETS,
            registry=registry,
        )
        self.dsns = Counter(
            "bumail_queue_dsns", "Delivery status notifications queued, by kind.", ["kind"], registry=registry
        )
        self.leases_lost = Counter(
            "bumail_queue_leases_lost",
            "Attempts whose outcomes were not recorded: the item's lease had passed to another worker.",
            registry=registry,
        )
        self.claim_batch_size = Histogram(
            "bumail_queue_claim_batch_size",
            "Items per claim (its _count is the claims made; 0: nothing was due).",
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self.store_errors = Counter(
            "bumail_queue_store_errors",
            "Claims the store refused, and batches of outcomes it could not record.",
            registry=registry,
        )
        self.sessions = Gauge("bumail_queue_worker_sessions", "Items this worker is delivering now.", registry=registry)
        self.concurrency = Gauge(
            "bumail_queue_worker_concurrency",
            "This worker's CONCURRENCY: the sessions it runs at once.",
            registry=registry,
        )
        self._label = functools.lru_cache(maxsize=4096)(self._domain_label)
        # Every series an alert divides by exists from the start, at 0.
        for domain in (*sorted(self.domains), OTHER_DOMAIN):
            for outcome, reply in (("delivered", "2xx"), ("deferred", "4xx"), ("failed", "5xx")):
                self.attempts.labels(outcome, reply, domain)
        for kind in ("failed", "delayed"):
            self.dsns.labels(kind)

    def watch(self, *, sessions: Callable[[], int], concurrency: int) -> None:
        """Read the worker's sessions under way at each scrape; set its concurrency."""
        self.sessions.set_function(sessions)
        self.concurrency.set(concurrency)

    # -- the Meter -----------------------------------------------------------------------

    def claimed(self, count: int) -> None:
        self.claim_batch_size.observe(count)

    def session_ended(self, seconds: float) -> None:
        self.session_duration.observe(seconds)

    def attempted(self, item: QueueItem, outcomes: Mapping[str, Outcome], now: datetime) -> None:
        for address, outcome in outcomes.items():
            self.attempts.labels(outcome.status.value, reply_class(outcome.reply), self.domain_label(address)).inc()
            if outcome.status == RecipientStatus.DELIVERED:
                self.time_to_delivery.observe(max(0.0, (now - item.created_at).total_seconds()))

    def dsn_sent(self, kind: str) -> None:
        self.dsns.labels(kind).inc()

    def lease_lost(self) -> None:
        self.leases_lost.inc()

    def store_failed(self) -> None:
        self.store_errors.inc()

    # -- labels ----------------------------------------------------------------------------

    def domain_label(self, address: str) -> str:
        """Return the ``domain`` label of a recipient: its domain if listed, else ``other``."""
        if not self.domains:
            return OTHER_DOMAIN
        return self._label(address.rpartition("@")[2])

    def _domain_label(self, domain: str) -> str:
        normal = normalise_domain(domain)
        return normal if normal in self.domains else OTHER_DOMAIN
