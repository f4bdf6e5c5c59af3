"""The SMTP client: deliver an envelope as a careful MTA's client does, on :mod:`smtplib`.

What it does, step by step and outcome by outcome, is in ``docs/delivery.md``.
The modules, from the bottom up: ``replies`` (reply text and status codes),
``failures`` (what goes wrong, as exceptions), ``tls`` (the route's TLS policy),
``connection`` (smtplib's client, bounded in time and size), ``pool`` (sessions kept
for reuse), ``unreachable`` (the hosts that did not answer, remembered a while),
``handshake`` (greeting to AUTH), ``transactions`` (MAIL to the message) and
``transport`` (:class:`SMTPTransport`, which tries the hosts).
Each SMTP step logs at most one DEBUG line on this package's logger.
"""

from __future__ import annotations

from .connection import REDACTED
from .failures import RouteOptionError
from .replies import MAX_REPLY_LINE, MAX_REPLY_LINES, MAX_REPLY_TEXT, clean_reply_text, reply_from
from .transactions import BLOCK_SIZE
from .transport import SMTPDelivery, SMTPTransport

__all__ = [
    "BLOCK_SIZE",
    "MAX_REPLY_LINE",
    "MAX_REPLY_LINES",
    "MAX_REPLY_TEXT",
    "REDACTED",
    "RouteOptionError",
    "SMTPDelivery",
    "SMTPTransport",
    "clean_reply_text",
    "reply_from",
]
