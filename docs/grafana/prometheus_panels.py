"""Screenshot the dashboard's panels as a real Prometheus draws them.

    python docs/grafana/prometheus_panels.py --prometheus http://127.0.0.1:9090 [--range 10m] [--out PATH]

Reads ``bumail_queue.json`` beside this file, takes the first query of each of its
time-series panels, opens Prometheus' own graph page with those queries (one graph
each, over ``--range``) in headless Chromium (``/usr/bin/chromium``, or
``$BUMAIL_CHROMIUM``) through Playwright, and saves a full-page screenshot. It draws
what Grafana would query, without Grafana: the screenshot in docs/metrics.md was
taken so, against a Prometheus scraping a real ``queue_worker --metrics-port``.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent


def panel_queries(dashboard: dict, limit: int) -> list[tuple[str, str]]:
    """(title, query) of the first query of each time-series panel, in the dashboard's order."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "timeseries" and panel.get("targets"):
            found.append((panel["title"], panel["targets"][0]["expr"]))
    return found[:limit]


def graph_url(prometheus: str, queries: list[tuple[str, str]], span: str) -> str:
    params = {}
    for n, (_, expr) in enumerate(queries):
        params.update({f"g{n}.expr": expr, f"g{n}.tab": "0", f"g{n}.range_input": span, f"g{n}.stacked": "0"})
    return f"{prometheus.rstrip('/')}/graph?{urllib.parse.urlencode(params)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--range", default="10m")
    parser.add_argument("--panels", type=int, default=6)
    parser.add_argument("--out", default=str(HERE.parent / "images" / "metrics-prometheus.png"))
    args = parser.parse_args()
    dashboard = json.loads((HERE / "bumail_queue.json").read_text())
    queries = panel_queries(dashboard, args.panels)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ.get("BUMAIL_CHROMIUM", "/usr/bin/chromium"), headless=True, args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(graph_url(args.prometheus, queries, args.range))  # the graph page: rickshaw draws SVG
        page.wait_for_selector(".rickshaw_graph svg path, canvas", timeout=30_000)
        page.wait_for_timeout(3000)  # every graph's query answered and drawn
        page.add_style_tag(content=".navbar { position: static !important; }")  # not across the page's middle
        page.screenshot(path=args.out, full_page=True)
        browser.close()
    print(f"{len(queries)} panels: {', '.join(title for title, _ in queries)} -> {args.out}")  # noqa: T201 - a script's report


if __name__ == "__main__":
    main()
