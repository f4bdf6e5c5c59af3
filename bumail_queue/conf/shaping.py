"""``SHAPING``: limits per destination pattern, checked and made into ``Limits``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final

from bumail_queue.quota import COUNT_MESSAGES, COUNT_RECIPIENTS, Quota, day_start, parse_quota
from bumail_queue.shaping import DEFAULT_PATTERN, SLOW_START_INITIAL, Limits, parse_rate

from .names import HOSTNAME, is_ip, normalise_domain
from .validator import Validator, as_timedelta, duration_seconds

_SHAPING_KEYS: Final = ("CONCURRENCY", "RATE", "SLOW_START", "SUSPEND", "QUOTA", "COUNT", "WARMUP", "WARMUP_START")


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
    return problems + _quota_problems(limits)


def _quota_problems(limits: Mapping[str, Any]) -> list[str]:
    problems = []
    if "QUOTA" in limits and parse_quota(limits["QUOTA"]) is None:
        problems.append(
            f"has a QUOTA that is not 'N/d' (a rolling 24 hours) or 'N/h' (a rolling hour) with N a whole "
            f"number above 0: {limits['QUOTA']!r}"
        )
    if "COUNT" in limits:
        if limits["COUNT"] not in (COUNT_RECIPIENTS, COUNT_MESSAGES):
            problems.append(f"has a COUNT that is not 'recipients' or 'messages': {limits['COUNT']!r}")
        elif "QUOTA" not in limits and "WARMUP" not in limits:
            problems.append("has COUNT without QUOTA or WARMUP: COUNT says what a quota counts")
    if "WARMUP" in limits:
        if _warmup_steps(limits["WARMUP"]) is None:
            problems.append(
                "has a WARMUP that is not a list of [days, quota] steps, each two whole numbers above 0, "
                f"e.g. [[3, 50], [4, 200]]: {limits['WARMUP']!r}"
            )
        if "WARMUP_START" not in limits:
            problems.append("has WARMUP without WARMUP_START: the date its first day is (e.g. '2026-12-01')")
    if "WARMUP_START" in limits:
        if _warmup_start(limits["WARMUP_START"]) is None:
            problems.append(f"has a WARMUP_START that is not a date or 'YYYY-MM-DD': {limits['WARMUP_START']!r}")
        if "WARMUP" not in limits:
            problems.append("has WARMUP_START without WARMUP")
    return problems


def _warmup_steps(raw: Any) -> tuple[tuple[int, int], ...] | None:
    """A ``WARMUP`` as ``(days, quota)`` steps, or ``None`` when it is not one."""
    if isinstance(raw, str | bytes) or not isinstance(raw, list | tuple) or not raw:
        return None
    steps = []
    for step in raw:
        if isinstance(step, str | bytes) or not isinstance(step, list | tuple) or len(step) != 2:
            return None
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in step):
            return None
        steps.append((step[0], step[1]))
    return tuple(steps)


def _warmup_start(raw: Any) -> dt.datetime | None:
    """Midnight UTC of a ``WARMUP_START`` (a date, a datetime or ``"YYYY-MM-DD"``), or ``None``."""
    if isinstance(raw, dt.datetime):
        return day_start(raw)
    if isinstance(raw, dt.date):
        return dt.datetime(raw.year, raw.month, raw.day, tzinfo=dt.UTC)
    if isinstance(raw, str):
        try:
            return _warmup_start(dt.date.fromisoformat(raw.strip()))
        except ValueError:
            return None
    return None


def _quota_from(raw: Mapping[str, Any]) -> Quota | None:
    found = parse_quota(raw.get("QUOTA"))
    steps = _warmup_steps(raw.get("WARMUP"))
    if found is None and steps is None:
        return None
    count, period = found if found is not None else (None, 86400.0)
    return Quota(
        count=count,
        period=period,
        counts_recipients=raw.get("COUNT", COUNT_RECIPIENTS) == COUNT_RECIPIENTS,
        warmup=steps or (),
        warmup_start=_warmup_start(raw.get("WARMUP_START")),
    )


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
        quota=_quota_from(raw),
    )


def shaping_from(raw: Mapping[str, Any]) -> dict[str, Limits]:
    return {pattern: _limits_from(limits) for key, limits in raw.items() if (pattern := shaping_pattern(key))}
