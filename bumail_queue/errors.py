"""The exceptions bumail_queue raises, each with a stable ``code``."""

from __future__ import annotations

import enum

from django.core.exceptions import ImproperlyConfigured


class ErrorCode(enum.StrEnum):
    """Why a queue operation failed. A ``str`` enum, so ``error.code == "FULL"`` holds."""

    #: The input cannot be queued: a bad address, a NUL or lone surrogate, a bad header.
    INVALID = "INVALID"
    #: The message is larger than ``MAX_MESSAGE_SIZE``.
    TOO_LARGE = "TOO_LARGE"
    #: The queue holds ``MAX_ITEMS`` items already.
    FULL = "FULL"
    #: The caller no longer holds the item's lease; nothing was recorded.
    LEASE_LOST = "LEASE_LOST"
    #: The store holds the item but lost its message.
    MESSAGE_UNREADABLE = "MESSAGE_UNREADABLE"
    #: A setting or option is wrong.
    INVALID_OPTION = "INVALID_OPTION"
    #: The store (database, Redis) could not be reached or refused the operation.
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    #: The store has no room for the write (Redis at ``maxmemory``); nothing was written.
    STORE_FULL = "STORE_FULL"
    #: The archive no longer keeps the message (never archived, redacted, or deleted).
    NOT_KEPT = "NOT_KEPT"


class QueueError(Exception):
    """A queue operation failed; ``code`` says why, the message says what to do.

    Messages never contain a password. ``item_id`` and ``recipient`` carry context
    when there is one.
    """

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        *,
        item_id: str | None = None,
        recipient: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.item_id = item_id
        self.recipient = recipient

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.value!r}, {self.message!r})"


def first_line(error: BaseException) -> str:
    """Return the first line of ``error``'s text (a driver's message may run to many), or its type."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class QueueConfigurationError(QueueError, ImproperlyConfigured):
    """``BUMAIL_QUEUE`` (or a mailer's ``OPTIONS``) is wrong; code ``INVALID_OPTION``."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_OPTION, message)
