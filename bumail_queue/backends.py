"""``QueueEmailBackend``: Django's email API, turned into durable enqueues.

Works as ``EMAIL_BACKEND`` (Django 5.2, 6.0) and as a ``MAILERS`` entry (Django 6.1+).
It delivers nothing itself: it only queues.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import django.core.mail
from django.core.mail import EmailMessage
from django.core.mail.backends.base import BaseEmailBackend

from .errors import ErrorCode, QueueConfigurationError, QueueError
from .items import DEFAULT_CHANNEL, DEFAULT_PRIORITY, check_channel, check_priority

# Django 6.1 reports unknown MAILERS OPTIONS itself (InvalidMailer); before it, we do.
_DJANGO_CHECKS_OPTIONS = hasattr(django.core.mail, "mailers")

# Django < 6.1 passes these from send_mail(auth_user=..., auth_password=...); a queue
# has no use for SMTP credentials of the caller, so they are accepted and ignored.
_LEGACY_CONNECTION_KWARGS = frozenset({"username", "password"})


class QueueEmailBackend(BaseEmailBackend):
    """Queue every message it is given; ``send_messages`` returns how many were queued.

    Its options (``MAILERS`` ``OPTIONS`` on Django 6.1, ``get_connection()``'s keyword
    arguments before) are ``priority`` and ``channel``, given to every message it
    queues (``queue.enqueue``'s arguments). A value that is none of theirs is a
    ``QueueConfigurationError``; an unknown option is refused (``InvalidMailer`` on
    Django 6.1, ``QueueConfigurationError`` before). ``fail_silently``, where Django
    still passes it, turns a refused enqueue into a return value of 0.
    """

    def __init__(
        self,
        fail_silently: bool = False,  # noqa: FBT001, FBT002 - Django's signature
        *,
        priority: int = DEFAULT_PRIORITY,
        channel: str = DEFAULT_CHANNEL,
        **kwargs: Any,
    ) -> None:
        try:
            self.priority = check_priority(priority, "QueueEmailBackend's option 'priority'")
            self.channel = check_channel(channel, "QueueEmailBackend's option 'channel'")
        except QueueError as error:
            raise QueueConfigurationError(error.message) from None
        if not _DJANGO_CHECKS_OPTIONS:
            unknown = sorted(set(kwargs) - _LEGACY_CONNECTION_KWARGS)
            if unknown:
                raise QueueConfigurationError(
                    f"QueueEmailBackend takes the options 'priority' and 'channel'; got {', '.join(map(repr, unknown))}."
                )
            super().__init__(fail_silently=fail_silently)
        else:
            # fail_silently is kept here rather than handed to Django 6.1's base class,
            # which would raise its deprecation warning on our behalf.
            super().__init__(**kwargs)
        self.fail_silently = fail_silently

    def send_messages(self, email_messages: Iterable[EmailMessage]) -> int:
        """Queue the messages in one step (all or none); return how many were queued."""
        from .service import queue

        # As Django's SMTP backend does, a message without recipients is skipped.
        messages: Sequence[EmailMessage] = [m for m in email_messages if m.recipients()]
        if not messages:
            return 0
        try:
            return len(queue.enqueue_many(messages, priority=self.priority, channel=self.channel))
        except QueueError as error:
            # fail_silently covers a refused send, never a broken configuration.
            if self.fail_silently and error.code != ErrorCode.INVALID_OPTION:
                return 0
            raise
