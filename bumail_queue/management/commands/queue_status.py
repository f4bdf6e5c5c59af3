"""``manage.py queue_status``: what is queued, as ``mailq`` and Postfix's ``qshape`` say it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from bumail_queue.errors import QueueError, first_line
from bumail_queue.management.arguments import describe_duration, positive_int
from bumail_queue.queries import ItemState, QueueSummary, bucket_labels
from bumail_queue.service import queue
from bumail_queue.shaping import DestinationState


class Command(BaseCommand):
    help = (
        "Show the queue: counts by state, the oldest item, items by channel and priority, "
        "pending recipients by domain and age."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")
        parser.add_argument(
            "--top", type=positive_int, default=10, help="domains shown, the most pending first (default: 10)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with store_errors_in_one_line():
            summary = queue.summary()
            destinations = queue.destination_states()
        if options["json"]:
            data = summary.to_dict(top=options["top"])
            if queue.settings.shaping:
                data["shaped_destinations"] = [state.to_dict() for state in destinations]
            self.stdout.write(json.dumps(data, indent=2))
            return
        lines = render(summary, top=options["top"])
        if queue.settings.shaping:
            lines += render_destinations(destinations, summary.now)
        self.stdout.write("\n".join(lines))


@contextmanager
def store_errors_in_one_line() -> Iterator[None]:
    """Turn a store or database that cannot be used into a ``CommandError``: one line, no traceback."""
    try:
        yield
    except QueueError as error:
        raise CommandError(error.message) from error
    except DatabaseError as error:
        raise CommandError(
            f"The queue's database could not be used (has manage.py migrate run?): {first_line(error)}"
        ) from error


def render(summary: QueueSummary, *, top: int) -> list[str]:
    """Return the text report, line by line."""
    states = ", ".join(
        f"{summary.by_state.get(state, 0)} {state.label.lower()}"
        for state in ItemState
        if state != ItemState.HELD or summary.by_state.get(state, 0)  # held: only when some are
    )
    lines = [f"{summary.total} item{'s' if summary.total != 1 else ''} queued: {states}; {summary.due} due now."]
    if summary.oldest_created_at is None:
        lines.append("The queue is empty.")
        return lines
    lines.append(
        f"Oldest: queued {describe_duration(summary.now - summary.oldest_created_at)} ago "
        f"({summary.oldest_created_at:%Y-%m-%d %H:%M:%S %Z})."
    )
    lines.append("")
    lines.append("Items by channel and priority (channels take turns, the higher priority first in each):")
    lines.append("")
    lines += _table(
        ["channel", "priority", "items", "due"],
        [[lane.channel, str(lane.priority), str(lane.total), str(lane.due)] for lane in summary.lanes],
    )
    lines.append("")
    lines.append(
        f"{summary.pending_recipients} recipient{'s' if summary.pending_recipients != 1 else ''} pending, by destination domain and age (minutes):"
    )
    lines.append("")
    labels = ["total", *bucket_labels(summary.age_buckets)]
    shown = summary.shape[:top]
    rows = [("all domains", [summary.pending_recipients, *summary.bucket_totals])]
    rows += [(d.domain or "(none)", [d.total, *d.buckets]) for d in shown]
    name_width = max(len(name) for name, _ in rows)
    widths = [max(len(label), *(len(str(values[i])) for _, values in rows)) for i, label in enumerate(labels)]
    lines.append(" ".join([" " * name_width, *(label.rjust(w) for label, w in zip(labels, widths, strict=True))]))
    for name, values in rows:
        lines.append(
            " ".join([name.rjust(name_width), *(str(v).rjust(w) for v, w in zip(values, widths, strict=True))])
        )
    left_out = len(summary.shape) - len(shown)
    if left_out:
        lines.append(f"({left_out} more domain{'s' if left_out != 1 else ''}; --top to show more)")
    return lines


def _table(labels: list[str], rows: list[list[str]]) -> list[str]:
    """Return ``rows`` under ``labels``: the first column to the left, the others to the right."""
    widths = [max(len(label), *(len(row[i]) for row in rows)) for i, label in enumerate(labels)]

    def line(cells: list[str]) -> str:
        first, *others = cells
        return " ".join([first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(others, widths[1:], strict=True))])

    return [line(labels), *(line(row) for row in rows)]


def render_destinations(states: list[DestinationState], now: datetime) -> list[str]:
    """Return the shaped destinations' lines: sessions, window, suspension, items held back."""
    lines = ["", "Shaped destinations (SHAPING):"]
    if not states:
        return [*lines, "  none has a session, a suspension, items held back or a quota's count."]
    for state in states:
        parts = [f"{state.sessions} session{'s' if state.sessions != 1 else ''}"]
        if state.window is not None:
            parts.append(f"slow-start window {state.window:g}")
        if state.suspended_until is not None:
            parts.append(
                f"suspended for {describe_duration(state.suspended_until - now)} "
                f"(until {state.suspended_until:%Y-%m-%d %H:%M:%S %Z})"
            )
        if state.held_until is not None:
            parts.append(f"{state.held} held back, due by {state.held_until:%H:%M:%S %Z}")
        if state.quota_text is not None:
            parts.append(f"quota {state.quota_text}")
        lines.append(f"  {state.key}: {'; '.join(parts)}")
    return lines
