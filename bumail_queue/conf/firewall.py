"""``ALLOW_RECIPIENTS`` and ``REDIRECT_TO``: the staging firewall (docs/operations.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from bumail_queue.addresses import mailbox_problem
from bumail_queue.firewall import RecipientPattern, parse_pattern, pattern_problem

from .validator import Validator

_CHECK_ID: Final = "bumail_queue.E035"
_EXAMPLE: Final = "['example.com', '*.example.org', 'qa+*@example.net']"


def check_firewall(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check ``ALLOW_RECIPIENTS`` (``None``, or a list of domain and address patterns)
    and ``REDIRECT_TO`` (``None``, or an address, with ``ALLOW_RECIPIENTS`` set)."""
    allow = raw.get("ALLOW_RECIPIENTS")
    if allow is not None:
        if isinstance(allow, str) or not isinstance(allow, list | tuple | set | frozenset):
            check.add(
                _CHECK_ID,
                "ALLOW_RECIPIENTS",
                f"BUMAIL_QUEUE['ALLOW_RECIPIENTS'] must be None or a list of domain and address patterns "
                f"such as {_EXAMPLE}; got {allow!r}.",
            )
        else:
            for pattern in allow:
                problem = pattern_problem(pattern)
                if problem is not None:
                    check.add(
                        _CHECK_ID,
                        "ALLOW_RECIPIENTS",
                        f"BUMAIL_QUEUE['ALLOW_RECIPIENTS'] holds {pattern!r}, which {problem}.",
                    )
    redirect_to = raw.get("REDIRECT_TO")
    if redirect_to is None:
        return
    problem = "it is not a string" if not isinstance(redirect_to, str) else mailbox_problem(redirect_to)
    if problem:
        check.add(
            _CHECK_ID,
            "REDIRECT_TO",
            f"BUMAIL_QUEUE['REDIRECT_TO'] must be an address such as 'staging-mail@example.com'; "
            f"{redirect_to!r} is not ({problem}).",
        )
    elif allow is None:
        check.add(
            _CHECK_ID,
            "REDIRECT_TO",
            "BUMAIL_QUEUE['REDIRECT_TO'] takes the mail ALLOW_RECIPIENTS does not allow, and ALLOW_RECIPIENTS "
            "is not set: set it too (ALLOW_RECIPIENTS = [] redirects all mail).",
        )


def allow_recipients_from(allow: Iterable[str] | None) -> tuple[RecipientPattern, ...] | None:
    """The compiled patterns of a valid ``ALLOW_RECIPIENTS``, or ``None`` when it is not set."""
    if allow is None:
        return None
    # A set's order is no one's: the patterns are kept sorted, so that each process
    # tries them in the same order (any order allows the same addresses).
    patterns = sorted(allow) if isinstance(allow, set | frozenset) else list(allow)
    return tuple(map(parse_pattern, patterns))
