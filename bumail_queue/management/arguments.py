"""Argument types the queue's management commands share (``argparse`` ``type=``)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from datetime import date, timedelta

_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DURATION = re.compile(r"([0-9]+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: Longer spans reach back before year 1 from today: no date can be that old.
LONGEST_DURATION = timedelta(days=100 * 365)


def positive_int(value: str) -> int:
    """A whole number, 1 or more."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be 1 or more")
    return number


def port(value: str) -> int:
    """A TCP port to listen on, 0 (any free one) to 65535."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} must be a port number from 0 (any free port) to 65535")
    return number


def listen_address(value: str) -> str:
    """An IP address to listen on: ``127.0.0.1``, ``::1``, ``0.0.0.0``, ``::``."""
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an IP address such as 127.0.0.1 or ::1") from None


def duration(value: str) -> timedelta:
    """Parse ``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` (or ``1d12h``)."""
    text = value.strip().lower()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration such as 30d, 12h, 90m or 2w")
    seconds = sum(int(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be longer than 0")
    if seconds > LONGEST_DURATION.total_seconds():
        raise argparse.ArgumentTypeError(f"{value!r} is longer than {LONGEST_DURATION.days} days")
    span = timedelta(seconds=seconds)
    return span


_SPELLED = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def describe_duration(span: timedelta, *, depth: int = 2) -> str:
    """Write ``span`` in days, hours, minutes and seconds: ``30 days``, ``1 day, 12 hours``.

    Unlike ``timesince`` it knows no calendar, so the same span reads the same on
    every day of the year (``timesince`` calls 30 days "1 month" after a 30-day month).
    """
    left = int(span.total_seconds())
    parts: list[str] = []
    for unit, seconds in _SPELLED:
        count, left = divmod(left, seconds)
        if count:
            parts.append(f"{count} {unit}{'' if count == 1 else 's'}")
        if len(parts) == depth:
            break
    return ", ".join(parts) or "0 seconds"


def iso_date(value: str) -> date:
    """A day written ``YYYY-MM-DD``."""
    try:
        if not _DAY.fullmatch(value):
            raise ValueError(value)
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a day written YYYY-MM-DD") from None


def host_and_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:2526`` for IPv6), the port from 0 (any free one) to 65535."""
    host, colon, port = value.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT, such as 127.0.0.1:2526")
    return host, int(port)


def listen_error(error: OSError) -> str:
    """Why a socket could not listen, in the system's words (asyncio wraps them in its own)."""
    return os.strerror(error.errno) if error.errno else str(error)
