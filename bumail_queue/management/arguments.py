"""Argument types the queue's management commands share (``argparse`` ``type=``)."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta

_DURATION = re.compile(r"([0-9]+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def positive_int(value: str) -> int:
    """A whole number, 1 or more."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be 1 or more")
    return number


def duration(value: str) -> timedelta:
    """Parse ``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` (or ``1d12h``)."""
    text = value.strip().lower()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration such as 30d, 12h, 90m or 2w")
    span = sum((timedelta(**{_UNITS[unit]: int(number)}) for number, unit in parts), timedelta())
    if span <= timedelta(0):
        raise argparse.ArgumentTypeError(f"{value!r} must be longer than 0")
    return span
