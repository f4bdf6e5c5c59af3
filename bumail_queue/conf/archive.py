"""``ARCHIVE`` and ``REDACT_AFTER``: which channels keep their delivered mail, and how long.

``ARCHIVE`` maps a channel to how long its delivered messages are kept whole. The
entry ``"default"`` is the channel named so, and also every channel the dict does not
name, as the ``"default"`` database alias is the one used when none is said: so
``{"default": "7d", "newsletter": "0d"}`` keeps all mail but the newsletters'. After
that, only the header section is kept, until ``REDACT_AFTER`` counted from the
archiving; then the row goes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from bumail_queue.items import CHANNEL_PATTERN, DEFAULT_CHANNEL

from .defaults import DEFAULTS, MAX_DURATION_SECONDS
from .validator import Validator

_CHECK_ID: Final = "bumail_queue.E036"
_DURATION: Final = re.compile(r"([0-9]+)([smhdw])")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_ALLOWED: Final = "a duration such as '7d', '12h', '30m' or '2w', a timedelta or a number of seconds"


def archive_seconds(value: Any) -> float | None:
    """Return a duration of ``ARCHIVE`` or ``REDACT_AFTER`` in seconds (0: off), or
    ``None`` when it is not one: ``"7d"``, ``"12h"``, ``"1d12h"``, a ``timedelta``, or a
    number of seconds, from 0 to 10 years."""
    if isinstance(value, str):
        text = value.strip().lower()
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            return None
        seconds: Any = sum(int(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    elif isinstance(value, timedelta):
        seconds = value.total_seconds()
    else:
        seconds = value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    return float(seconds) if 0 <= seconds <= MAX_DURATION_SECONDS else None


def check_archive(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check ``ARCHIVE`` (a dict of channel name to duration) and ``REDACT_AFTER`` (a
    duration at least as long as every channel's ``ARCHIVE``)."""
    channels = raw.get("ARCHIVE", DEFAULTS["ARCHIVE"])
    redact_after = archive_seconds(raw.get("REDACT_AFTER", DEFAULTS["REDACT_AFTER"]))
    if redact_after is None:
        check.add(
            _CHECK_ID,
            "REDACT_AFTER",
            f"BUMAIL_QUEUE['REDACT_AFTER'] must be {_ALLOWED}, from 0 to 10 years; got {raw.get('REDACT_AFTER')!r}.",
        )
    if not isinstance(channels, Mapping):
        check.add(
            _CHECK_ID,
            "ARCHIVE",
            "BUMAIL_QUEUE['ARCHIVE'] must be a dict of channel to duration, such as "
            f"{{'default': '7d', 'newsletter': '0d'}}; got {type(channels).__name__}.",
        )
        return
    for channel, value in channels.items():
        if not isinstance(channel, str) or not CHANNEL_PATTERN.fullmatch(channel):
            check.add(
                _CHECK_ID, "ARCHIVE", f"BUMAIL_QUEUE['ARCHIVE'] has a key that is not a channel name: {channel!r}."
            )
            continue
        seconds = archive_seconds(value)
        where = f"BUMAIL_QUEUE['ARCHIVE'][{channel!r}]"
        if seconds is None:
            check.add(
                _CHECK_ID, "ARCHIVE", f"{where} must be {_ALLOWED}, from 0 (not archived) to 10 years; got {value!r}."
            )
        elif redact_after is not None and seconds > redact_after:
            check.add(
                _CHECK_ID,
                "REDACT_AFTER",
                f"BUMAIL_QUEUE['REDACT_AFTER'] ({raw.get('REDACT_AFTER', DEFAULTS['REDACT_AFTER'])!r}) is shorter than "
                f"{where} ({value!r}): the header section is kept until REDACT_AFTER, so it must be at least "
                "as long as the time the whole message is kept.",
            )


def archive_from(channels: Mapping[str, Any]) -> dict[str, timedelta]:
    """``ARCHIVE`` of valid settings, typed; a channel archived for 0 keeps its entry,
    so that it is not archived even when ``"default"`` is."""
    return {channel: timedelta(seconds=archive_seconds(value) or 0) for channel, value in channels.items()}


def redact_after_from(value: Any) -> timedelta:
    """``REDACT_AFTER`` of valid settings, typed."""
    return timedelta(seconds=archive_seconds(value) or 0)


def archive_duration(archive: Mapping[str, timedelta], channel: str) -> timedelta | None:
    """How long ``channel``'s delivered mail is kept whole: its own entry, else the
    ``"default"`` entry; ``None`` when it is not archived."""
    kept = archive.get(channel, archive.get(DEFAULT_CHANNEL))
    return kept if kept else None
