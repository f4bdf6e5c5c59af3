"""A worker's metrics, scraped over HTTP and parsed as Prometheus parses them.

The first test runs ``manage.py queue_worker --metrics-port 0`` as a process against
a loopback SMTP server whose replies are scripted, and checks every number the
endpoint serves against what the test sent. The others run a ``Worker`` in this
process behind the same endpoint, for what a process cannot be made to do on cue.
"""

from __future__ import annotations

import re
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from django.core.mail import EmailMessage
from django.test import override_settings
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bumail_queue import queue
from bumail_queue.metrics.server import serve, worker_registry
from bumail_queue.metrics.worker import WorkerMetrics
from bumail_queue.service import QueueService
from bumail_queue.stores import get_store
from bumail_queue.worker import Worker
from tests.helpers import ScriptedTransport, printed, running_worker, smarthost, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the endpoint serves, by name and labels, as Prometheus reads them."""
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback only
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.mark.slow
def test_a_running_worker_serves_what_it_delivered_deferred_failed_and_reported(smtp_servers):
    delivered, failed, deferred = 4, 2, 3
    server = smtp_servers(
        rcpt_replies={
            **{f"bad{n}@example.org": "550 5.1.1 No such user" for n in range(failed)},
            **{f"later{n}@example.org": "451 4.3.0 Try again later" for n in range(deferred)},
        }
    )
    settings = smarthost(server, METRICS_DOMAINS=["Example.ORG"], CONCURRENCY=3)
    with override_settings(BUMAIL_QUEUE=settings):
        for address in (
            *(f"ok{n}@example.org" for n in range(delivered)),
            *(f"bad{n}@example.org" for n in range(failed)),
            *(f"later{n}@example.org" for n in range(deferred)),
        ):
            queue.enqueue(EmailMessage("Hello", "Body", "shop@shop.example", [address]))
    with running_worker(settings, "--metrics-port", "0") as (_worker, lines):
        assert wait_until(printed(lines, "serving metrics on http://127.0.0.1:")), lines
        url = re.search(r"serving metrics on (\S+)", "".join(lines)).group(1)
        # Each failed recipient's sender gets a failure DSN, which the server accepts too.
        expected_sessions = delivered + failed + deferred + failed

        def all_recorded():
            samples = scrape(url)
            return value(samples, "bumail_queue_session_duration_seconds_count") == expected_sessions and (
                value(samples, "bumail_queue_delivery_log_entries_last_hour", status="delivered") == delivered + failed
            )

        assert wait_until(all_recorded, 60), scrape(url)
        samples = scrape(url)

    def attempts(outcome, reply_class, domain):
        return value(samples, "bumail_queue_attempts_total", outcome=outcome, reply_class=reply_class, domain=domain)

    assert attempts("delivered", "2xx", "example.org") == delivered
    assert attempts("failed", "5xx", "example.org") == failed
    assert attempts("deferred", "4xx", "example.org") == deferred
    assert attempts("delivered", "2xx", "other") == failed  # the DSNs, to shop.example
    assert attempts("failed", "5xx", "other") == 0
    assert value(samples, "bumail_queue_dsns_total", kind="failed") == failed
    assert value(samples, "bumail_queue_dsns_total", kind="delayed") == 0
    assert value(samples, "bumail_queue_time_to_delivery_seconds_count") == delivered + failed
    # Enqueued moments before: every delivery falls in the buckets of a minute and less.
    assert value(samples, "bumail_queue_time_to_delivery_seconds_bucket", le="60.0") == delivered + failed
    assert value(samples, "bumail_queue_claim_batch_size_sum") == expected_sessions
    assert value(samples, "bumail_queue_claim_batch_size_count") >= 2  # the mail, then the DSNs at least
    assert value(samples, "bumail_queue_leases_lost_total") == 0
    assert value(samples, "bumail_queue_store_errors_total") == 0
    assert value(samples, "bumail_queue_worker_concurrency") == 3
    assert value(samples, "bumail_queue_worker_sessions") == 0
    # The queue's gauges, read from the store: the deferred mail waits for its retry.
    assert value(samples, "bumail_queue_store_up") == 1
    assert value(samples, "bumail_queue_items", state="deferred") == deferred
    assert value(samples, "bumail_queue_items", state="queued") == 0
    assert value(samples, "bumail_queue_recipients", state="deferred") == deferred
    assert value(samples, "bumail_queue_items_due") == 0
    assert value(samples, "bumail_queue_oldest_item_age_seconds", state="deferred") > 0
    assert value(samples, "bumail_queue_counts_exact") == 1
    assert value(samples, "bumail_queue_delivery_log_entries_last_hour", status="failed") == failed
    assert value(samples, "bumail_queue_delivery_log_entries_last_hour", status="deferred") == deferred
    # And the process's own, as prometheus-client reports them.
    assert value(samples, "process_resident_memory_bytes") > 0


@pytest.mark.slow
def test_without_queue_gauges_a_worker_serves_its_own_metrics_only(smtp_server):
    settings = smarthost(smtp_server)
    with running_worker(settings, "--metrics-port", "0", "--no-queue-gauges") as (_worker, lines):
        assert wait_until(printed(lines, "serving metrics on ")), lines
        samples = scrape(re.search(r"serving metrics on (\S+)", "".join(lines)).group(1))
    names = {name for name, _ in samples}
    assert "bumail_queue_attempts_total" in names
    assert not any(name.startswith(("bumail_queue_items", "bumail_queue_store_up")) for name in names)


@pytest.fixture
def endpoint():
    """A worker registry served on a free loopback port, as queue_worker serves it."""
    built = worker_registry(domains=frozenset({"example.org"}), queue_gauges=True)
    server = serve(built.registry, address="127.0.0.1", port=0)
    yield built.metrics, server.url
    server.close()


def test_a_lease_taken_by_another_worker_is_counted_as_lost(endpoint):
    metrics, url = endpoint
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "ROUTE": SMARTHOST}):
        item = QueueService(clock=lambda: T0).enqueue(
            EmailMessage("Hi", "Body", "shop@shop.example", ["a@example.org"])
        )
        store = get_store()
        worker = Worker(transport=ScriptedTransport(), clock=lambda: T0, owner="stale", meter=metrics)
        [claimed] = store.claim(owner="stale", now=T0, lease_until=T0 + timedelta(minutes=10), limit=1)
        store.claim(owner="thief", now=T0 + timedelta(minutes=10), lease_until=T0 + timedelta(minutes=20), limit=1)
        worker._lease_until[claimed.id] = T0 + timedelta(minutes=10)
        worker.complete(worker.attempt(claimed))
    samples = scrape(url)
    assert value(samples, "bumail_queue_leases_lost_total") == 1
    # Refused by the store, the attempt's outcomes were not counted either.
    assert (
        value(samples, "bumail_queue_attempts_total", outcome="delivered", reply_class="2xx", domain="example.org") == 0
    )
    assert get_store().get(item.id).lease_owner == "thief"


SMARTHOST = {"TYPE": "smarthost", "HOST": "relay.example.net", "PORT": 2525, "TLS": "none"}


def test_a_worker_in_this_process_counts_into_its_meter_and_nothing_without_one():
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry=registry)
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "ROUTE": SMARTHOST}):
        for n in range(3):
            queue.enqueue(EmailMessage("Hi", "Body", "", [f"user{n}@example.org"]))
        Worker(transport=ScriptedTransport(), meter=metrics).run_until_idle()
        queue.enqueue(EmailMessage("Hi", "Body", "", ["once-more@example.org"]))
        stats = Worker(transport=ScriptedTransport()).run_until_idle()  # no meter: nothing counted
    assert stats.delivered == 1
    assert (
        registry.get_sample_value(
            "bumail_queue_attempts_total", {"outcome": "delivered", "reply_class": "2xx", "domain": "other"}
        )
        == 3
    )
    assert registry.get_sample_value("bumail_queue_session_duration_seconds_count") == 3
