"""``UNSUBSCRIBE``: the channels whose mail gets one-click unsubscribe (RFC 8058)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final
from urllib.parse import urlsplit

from bumail_queue.items import CHANNEL_PATTERN

from .defaults import MAX_DURATION_SECONDS
from .names import HOSTNAME
from .validator import Validator, as_timedelta, duration_seconds

DEFAULT_UNSUBSCRIBE_DURATION: Final = timedelta(days=3650)
"""How long an unsubscribe lasts unless the channel's ``DURATION`` says: ten years,
the most any duration of the settings may be (an unsubscribe is meant for good)."""

_KEYS: Final = ("URL", "DURATION")
_CHECK_ID: Final = "bumail_queue.E034"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ChannelUnsubscribe:
    """A channel's ``UNSUBSCRIBE`` entry: where its one-click URLs start (``https://``,
    ending in ``/``) and how long an unsubscribe from it lasts."""

    url: str
    duration: timedelta = DEFAULT_UNSUBSCRIBE_DURATION


def check_unsubscribe(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check ``UNSUBSCRIBE``: a dict of channel name to ``{"URL", "DURATION"}``, each
    ``URL`` an absolute ``https://`` URL of ASCII, without a query or a fragment."""
    channels = raw.get("UNSUBSCRIBE", {})
    if not isinstance(channels, Mapping):
        check.add(
            _CHECK_ID,
            "UNSUBSCRIBE",
            "BUMAIL_QUEUE['UNSUBSCRIBE'] must be a dict of channel to "
            "{'URL': 'https://www.example.com/mail/unsubscribe/'}; "
            f"got {type(channels).__name__}.",
        )
        return
    for channel, entry in channels.items():
        if not isinstance(channel, str) or not CHANNEL_PATTERN.fullmatch(channel):
            check.add(
                _CHECK_ID,
                "UNSUBSCRIBE",
                f"BUMAIL_QUEUE['UNSUBSCRIBE'] has a key that is not a channel name: {channel!r}.",
            )
            continue
        _check_entry(check, entry, f"BUMAIL_QUEUE['UNSUBSCRIBE'][{channel!r}]")


def _check_entry(check: Validator, entry: Any, where: str) -> None:
    if not isinstance(entry, Mapping):
        check.add(_CHECK_ID, "UNSUBSCRIBE", f"{where} must be a dict with a 'URL'; got {type(entry).__name__}.")
        return
    unknown = sorted(set(entry) - set(_KEYS), key=repr)
    if unknown:
        check.add(
            _CHECK_ID,
            "UNSUBSCRIBE",
            f"{where} has unknown keys {', '.join(map(repr, unknown))}; the keys are {', '.join(_KEYS)}.",
        )
    problem = url_problem(entry.get("URL"))
    if problem is not None:
        check.add(
            _CHECK_ID,
            "UNSUBSCRIBE",
            f"{where}['URL'] must be the https:// URL where bumail_queue.urls' unsubscribe view is, such as "
            f"'https://www.example.com/mail/unsubscribe/'; {entry.get('URL')!r} {problem}.",
        )
    duration = entry.get("DURATION")
    if duration is not None and duration_seconds(duration) is None:
        check.add(
            _CHECK_ID,
            "UNSUBSCRIBE",
            f"{where}['DURATION'] must be a timedelta or a number of seconds above 0 and at most "
            f"{MAX_DURATION_SECONDS // (366 * 24 * 3600)} years; got {duration!r}.",
        )


def url_problem(url: Any) -> str | None:
    """Say why ``url`` cannot start the one-click URLs, or return ``None``."""
    if not isinstance(url, str) or not url:
        return "is not a string"
    if not url.isascii() or any(c.isspace() or c in '<>"' for c in url):
        return "holds characters a URL in a header field cannot (non-ASCII, a space, '<', '>' or '\"')"
    parts = urlsplit(url)
    if parts.scheme != "https":
        return "is not https:// (RFC 8058 §3.1 wants HTTPS)"
    if not parts.hostname or not HOSTNAME.fullmatch(parts.hostname) or "@" in parts.netloc:
        return "has no host name"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return "has a query or a fragment; the token follows the URL's path"
    return None


def unsubscribe_from(channels: Mapping[str, Mapping[str, Any]]) -> dict[str, ChannelUnsubscribe]:
    """``UNSUBSCRIBE`` of valid settings, typed: each ``URL`` ending in ``/``."""
    return {
        channel: ChannelUnsubscribe(
            url=entry["URL"] if entry["URL"].endswith("/") else entry["URL"] + "/",
            duration=DEFAULT_UNSUBSCRIBE_DURATION if entry.get("DURATION") is None else as_timedelta(entry["DURATION"]),
        )
        for channel, entry in channels.items()
    }
