"""What the overview page draws: the state bar and the shape of the queue by domain and age."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from bumail_queue.queries import ItemState, QueueSummary, bucket_labels

from .shared import (
    age_text,
)


def overview_context(summary: QueueSummary, list_url: str, *, top: int = 20) -> dict[str, Any]:
    """Return what the overview page draws: the state bar and the shape's rows."""
    total = summary.total or 1
    states = []
    offset = 0.0
    for state in ItemState:
        count = summary.by_state.get(state, 0)
        width = 100.0 * count / total
        states.append(
            {
                "state": state,
                "count": count,
                "x": round(offset, 3),
                "width": round(width, 3),
                "url": f"{list_url}?state={state.value}",
            }
        )
        offset += width
    shape = summary.shape[:top]
    widest = max((d.total for d in shape), default=0) or 1
    buckets_max = max((n for d in shape for n in d.buckets), default=0) or 1
    rows = [
        {
            "domain": d.domain,
            "total": d.total,
            "bar": round(100.0 * d.total / widest, 3),
            # The heat of each cell: 0 (none) to 5 (the busiest cell of the table).
            "cells": [(n, 0 if n == 0 else 1 + min(4, int(4 * n / buckets_max))) for n in d.buckets],
            "url": f"{list_url}?{urlencode({'domain': d.domain})}",
        }
        for d in shape
    ]
    return {
        "summary": summary,
        "states": states,
        "bucket_labels": bucket_labels(summary.age_buckets),
        "bucket_totals": summary.bucket_totals,
        "shape_rows": rows,
        "shape_left_out": len(summary.shape) - len(shape),
        "oldest_age": None if summary.oldest_created_at is None else age_text(summary.oldest_created_at, summary.now),
    }
