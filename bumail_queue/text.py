"""Checks on text a store keeps: no NUL, no lone surrogate.

PostgreSQL cannot keep either in ``text`` or ``jsonb``, and Redis would hand back
something else than was given, so every store refuses them up front (``INVALID``)
rather than fail half-way through a write.
"""

from __future__ import annotations

from .errors import ErrorCode, QueueError


def unkeepable_reason(value: str) -> str | None:
    """Say why ``value`` cannot be kept, or return ``None`` when it can."""
    if "\x00" in value:
        return "it holds a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "it holds a lone surrogate, which is not valid Unicode text"
    return None


def require_keepable(value: str, what: str) -> str:
    """Return ``value``, or raise ``QueueError(INVALID)`` naming ``what`` was wrong."""
    reason = unkeepable_reason(value)
    if reason is not None:
        raise QueueError(ErrorCode.INVALID, f"The {what} cannot be queued: {reason}.")
    return value


def is_keepable(value: str) -> bool:
    """Return whether ``value`` holds neither a NUL nor a lone surrogate."""
    return unkeepable_reason(value) is None
