"""The validator every area's checks add their problems to, and the value checks they share."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .defaults import DEFAULTS, MAX_DURATION_SECONDS


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One thing wrong with ``BUMAIL_QUEUE``: the check id, the key, and what to do."""

    id: str
    key: str
    message: str


class Validator:
    """Collects every problem of one raw ``BUMAIL_QUEUE`` rather than stopping at the first."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, check_id: str, key: str, message: str) -> None:
        self.problems.append(Problem(id=check_id, key=key, message=message))

    def positive_int(self, raw: Mapping[str, Any], key: str, check_id: str, *, optional: bool = False) -> None:
        value = raw.get(key, DEFAULTS[key])
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            allowed = "a whole number above 0" + (", or None" if optional else "")
            self.add(check_id, key, f"BUMAIL_QUEUE['{key}'] must be {allowed}; got {value!r}.")

    def port(self, raw: Mapping[str, Any], key: str, check_id: str) -> None:
        value = raw.get(key, DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            self.add(check_id, key, f"BUMAIL_QUEUE['{key}'] must be a port number from 1 to 65535; got {value!r}.")

    def duration(self, raw: Mapping[str, Any], key: str, check_id: str, *, zero_is_off: bool = False) -> float | None:
        """Check a duration; return it in seconds, or ``None`` when it is not valid.

        ``zero_is_off``: 0 is valid too, and turns the setting's feature off.
        """
        value = raw.get(key, DEFAULTS[key])
        seconds = 0.0 if zero_is_off and _is_zero(value) else duration_seconds(value)
        if seconds is None:
            allowed = "from 0 (off) to 10 years" if zero_is_off else "above 0 and at most 10 years"
            self.add(
                check_id,
                key,
                f"BUMAIL_QUEUE['{key}'] must be a timedelta or a number of seconds {allowed}; got {value!r}.",
            )
        return seconds


def duration_seconds(value: Any) -> float | None:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return None
    return float(seconds) if 0 < seconds <= MAX_DURATION_SECONDS else None


def _is_zero(value: Any) -> bool:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    return not isinstance(seconds, bool) and isinstance(seconds, int | float) and seconds == 0


def as_timedelta(value: timedelta | float) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=value)
