"""The queue's signals, sent with ``send_robust`` once an outcome is recorded.

For one attempt the order is: a ``MESSAGE_UNREADABLE`` ``error``, each recipient's
``delivered`` / ``deferred`` / ``failed``, then the ``dsn`` signals. A receiver that
raises is logged and ignored.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

#: A recipient was delivered. kwargs: ``item_id``, ``recipient``, ``reply``, ``envelope_sender``, ``remote_host``,
#: ``tls``, ``subject`` and ``message_id`` (the message's, ``""`` when it has none).
delivered = Signal()
#: A recipient was deferred. kwargs: ``item_id``, ``recipient``, ``reply``, ``next_attempt_at``, ``envelope_sender``,
#: ``remote_host``, ``tls``, ``subject``, ``message_id``.
deferred = Signal()
#: A recipient failed for good. kwargs: ``item_id``, ``recipient``, ``reply``, ``envelope_sender``, ``remote_host``,
#: ``tls``, ``subject``, ``message_id``.
failed = Signal()
#: A DSN was queued. kwargs: ``kind`` (``"failed"``/``"delayed"``), ``dsn_id``, ``of``, ``to``, ``recipients``.
dsn = Signal()
#: Something went wrong beside an outcome. kwargs: ``error``, ``item_id`` (or ``None``).
error = Signal()
#: An item was cancelled (``queue.cancel``, the admin), no DSN sent. kwargs: ``item_id``,
#: ``item`` (the ``QueueItem`` as it stood), ``recipients`` (the addresses not final yet),
#: ``subject``, ``message_id``.
cancelled = Signal()
#: Mail handed on came back as a permanent failure (a bounce read by ``queue_inbound``).
#: kwargs: ``item_id`` (``None`` when nothing says which), ``recipient``, ``reply``, ``source``
#: (``"rfc3464"``, ``"flufl.bounce"``).
bounced = Signal()
#: A recipient reported mail as spam (an RFC 5965 report). kwargs: ``item_id`` (or ``None``),
#: ``recipient``, ``feedback_type`` (``"abuse"``, ``"fraud"``...).
complained = Signal()
#: A recipient unsubscribed: at an ESP (its webhook, through anymail), or with one click
#: (RFC 8058, ``bumail_queue.urls``). kwargs: ``item_id`` (or ``None``), ``recipient``,
#: ``source`` (``"anymail:postmark"``..., ``"one-click"``), ``channel`` (the channel left,
#: one-click; ``None``: all mail).
unsubscribed = Signal()


def send(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal`` robustly: a receiver's exception is logged, never raised."""
    for receiver, result in signal.send_robust(sender=signal, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "signal receiver failed receiver=%r", receiver, exc_info=(type(result), result, result.__traceback__)
            )
