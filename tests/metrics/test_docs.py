"""The metrics' page, dashboard and alert rules name the metrics the code serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from bumail_queue.metrics.queue import QueueCollector
from bumail_queue.metrics.worker import WorkerMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs"


def families():
    registry = CollectorRegistry()
    WorkerMetrics(registry=registry)
    return [*registry.collect(), *QueueCollector().describe()]


def documented_name(family) -> str:
    return f"{family.name}_total" if family.type == "counter" else family.name


def served_names() -> set[str]:
    """Every name a sample of ours may have, as PromQL reads it."""
    names = set()
    for family in families():
        name = documented_name(family)
        names.add(name)
        if family.type == "histogram":
            names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return names


def test_the_metrics_page_describes_every_metric_with_its_type():
    page = (DOCS / "metrics.md").read_text()
    for family in families():
        row = re.search(rf"^\| `{documented_name(family)}` \| (\w+) \|", page, re.MULTILINE)
        assert row is not None, f"{documented_name(family)} is not in docs/metrics.md"
        assert row.group(1) == family.type


@pytest.mark.parametrize("path", ["grafana/bumail_queue.json", "prometheus/alerts.yml", "metrics.md"])
def test_the_dashboard_rules_and_page_query_only_metrics_that_exist(path):
    text = (DOCS / path).read_text()
    # Less a job's name and a token file's in the examples.
    queried = set(re.findall(r"\bbumail_queue_[a-z_]+\b", text)) - {"bumail_queue_worker", "bumail_queue_token"}
    assert queried, path
    assert queried <= served_names(), queried - served_names()


def test_the_dashboard_is_a_grafana_dashboard_on_a_chosen_prometheus():
    dashboard = json.loads((DOCS / "grafana" / "bumail_queue.json").read_text())
    assert dashboard["templating"]["list"][0] == {
        "name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0,
    }  # fmt: skip
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(target["expr"] for target in panel["targets"])
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
