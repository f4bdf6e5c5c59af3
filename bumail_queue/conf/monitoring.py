"""``METRICS_DOMAINS``, ``METRICS_TOKEN`` and the suppression list's keys."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .defaults import DEFAULTS, MAX_METRICS_DOMAINS, MIN_METRICS_TOKEN
from .dkim import is_dkim_domain
from .names import normalise_domain
from .validator import Validator

_TOKEN = re.compile(r"[\x21-\x7e]+")


def check_metrics(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check ``METRICS_DOMAINS`` (a bounded list of domains: label values) and
    ``METRICS_TOKEN`` (never repeated in a message: it is a secret)."""
    domains = raw.get("METRICS_DOMAINS", DEFAULTS["METRICS_DOMAINS"])
    if isinstance(domains, str) or not isinstance(domains, list | tuple | set | frozenset):
        check.add(
            "bumail_queue.E026",
            "METRICS_DOMAINS",
            f"BUMAIL_QUEUE['METRICS_DOMAINS'] must be a list of recipient domains such as ['gmail.com']; got {domains!r}.",
        )
    else:
        bad = [d for d in domains if not (isinstance(d, str) and is_dkim_domain(d))]
        if bad:
            check.add(
                "bumail_queue.E026",
                "METRICS_DOMAINS",
                f"BUMAIL_QUEUE['METRICS_DOMAINS'] must hold domain names such as 'gmail.com'; these are not: "
                f"{', '.join(map(repr, bad))}.",
            )
        elif len({normalise_domain(d) for d in domains}) > MAX_METRICS_DOMAINS:
            check.add(
                "bumail_queue.E026",
                "METRICS_DOMAINS",
                f"BUMAIL_QUEUE['METRICS_DOMAINS'] names {len(domains)} domains; at most {MAX_METRICS_DOMAINS} may "
                "have a label of their own (each multiplies the series Prometheus keeps).",
            )
    token = raw.get("METRICS_TOKEN")
    if token is not None and not (
        isinstance(token, str) and len(token) >= MIN_METRICS_TOKEN and _TOKEN.fullmatch(token)
    ):
        check.add(
            "bumail_queue.E026",
            "METRICS_TOKEN",
            f"BUMAIL_QUEUE['METRICS_TOKEN'] must be None or a string of at least {MIN_METRICS_TOKEN} printable "
            "ASCII characters without spaces (python -c 'import secrets; print(secrets.token_urlsafe(32))' "
            "makes one).",
        )


def check_suppression(check: Validator, raw: Mapping[str, Any]) -> None:
    for key in ("SUPPRESSION", "SUPPRESSION_DSN"):
        if not isinstance(raw.get(key, DEFAULTS[key]), bool):
            check.add("bumail_queue.E030", key, f"BUMAIL_QUEUE['{key}'] must be True or False; got {raw[key]!r}.")
    check.duration(raw, "SUPPRESSION_DURATION", "bumail_queue.E030")
    if raw.get("SUPPRESSION_EXPIRY_WINDOW", DEFAULTS["SUPPRESSION_EXPIRY_WINDOW"]) is not None:
        check.duration(raw, "SUPPRESSION_EXPIRY_WINDOW", "bumail_queue.E030")
