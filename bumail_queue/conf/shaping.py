"""``SHAPING``: limits per destination pattern, checked and made into ``Limits``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from bumail_queue.shaping import DEFAULT_PATTERN, SLOW_START_INITIAL, Limits, parse_rate

from .names import HOSTNAME, is_ip, normalise_domain
from .validator import Validator, as_timedelta, duration_seconds

_SHAPING_KEYS: Final = ("CONCURRENCY", "RATE", "SLOW_START", "SUSPEND")


def shaping_pattern(key: Any) -> str | None:
    """Return a ``SHAPING`` key in the form it is matched in, or ``None`` for one that is
    no pattern: ``"*"``, a domain (``"example.com"``), or a dot and a domain, an MX host
    suffix (``".google.com"``), each lowercase in A-labels."""
    if key == DEFAULT_PATTERN:
        return DEFAULT_PATTERN
    if not isinstance(key, str) or not key.strip("."):
        return None
    suffix = key.startswith(".")
    name = normalise_domain(key[1:] if suffix else key)
    if not HOSTNAME.fullmatch(name) or name.endswith(".") or is_ip(name):
        return None
    return f".{name}" if suffix else name


def check_shaping(check: Validator, shaping: Any) -> None:
    where = "BUMAIL_QUEUE['SHAPING']"
    if not isinstance(shaping, Mapping):
        check.add(
            "bumail_queue.E028",
            "SHAPING",
            f"{where} must be a dict of destination pattern to limits; got {type(shaping).__name__}.",
        )
        return
    seen: dict[str, Any] = {}
    for key, limits in shaping.items():
        pattern = shaping_pattern(key)
        if pattern is None:
            check.add(
                "bumail_queue.E028",
                "SHAPING",
                f"{where} has a key that is no destination pattern: {key!r}. A key is a recipient domain "
                "('example.com'), an MX host suffix starting with a dot ('.google.com'), or '*' for every other destination.",
            )
        elif pattern in seen:
            check.add(
                "bumail_queue.E028", "SHAPING", f"{where} names {pattern!r} twice: {seen[pattern]!r} and {key!r}."
            )
        else:
            seen[pattern] = key
        for problem in _limits_problems(limits):
            check.add("bumail_queue.E028", "SHAPING", f"{where}[{key!r}] {problem}.")


def _limits_problems(limits: Any) -> list[str]:
    if not isinstance(limits, Mapping):
        return [f"must be a dict of {', '.join(_SHAPING_KEYS)}; got {type(limits).__name__}"]
    problems = [
        f"has the unknown key {key!r} (it takes {', '.join(_SHAPING_KEYS)})"
        for key in sorted(set(limits) - set(_SHAPING_KEYS), key=repr)
    ]
    concurrency = limits.get("CONCURRENCY")
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        problems.append(f"has a CONCURRENCY that is not a whole number above 0: {concurrency!r}")
        concurrency = None
    if limits.get("RATE") is not None and parse_rate(limits["RATE"]) is None:
        problems.append(
            f"has a RATE that is not 'N/s', 'N/m' or 'N/h' with N a whole number above 0: {limits['RATE']!r}"
        )
    slow_start = limits.get("SLOW_START", False)
    if not isinstance(slow_start, bool) and (not isinstance(slow_start, int) or slow_start < 1):
        problems.append(
            f"has a SLOW_START that is not True, False or the number of sessions to start at: {slow_start!r}"
        )
    elif slow_start is not False and "CONCURRENCY" not in limits:
        problems.append("has SLOW_START without CONCURRENCY: slow start grows its sessions up to CONCURRENCY")
    if "SUSPEND" in limits and duration_seconds(limits["SUSPEND"]) is None:
        problems.append(
            f"has a SUSPEND that is not a timedelta or a number of seconds above 0 and at most 10 years: {limits['SUSPEND']!r}"
        )
    return problems


def _limits_from(raw: Mapping[str, Any]) -> Limits:
    concurrency = raw.get("CONCURRENCY")
    slow_start = raw.get("SLOW_START", False)
    if slow_start is True:
        slow_start = SLOW_START_INITIAL
    return Limits(
        concurrency=concurrency,
        rate=parse_rate(raw.get("RATE")),
        slow_start=None if slow_start is False or concurrency is None else min(slow_start, concurrency),
        suspend=as_timedelta(raw["SUSPEND"]) if "SUSPEND" in raw else Limits().suspend,
    )


def shaping_from(raw: Mapping[str, Any]) -> dict[str, Limits]:
    return {pattern: _limits_from(limits) for key, limits in raw.items() if (pattern := shaping_pattern(key))}
