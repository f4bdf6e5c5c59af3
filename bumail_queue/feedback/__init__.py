"""Feedback: what comes back after the mail went, read and fed to the suppression list.

``parsing`` reads a returned message: an RFC 3464 delivery status notification, an
RFC 5965 feedback report, or another MTA's bounce format through ``flufl.bounce``.
"""

from __future__ import annotations

from .parsing import Report, ReportedRecipient, ReportKind, Source, parse_report

__all__ = ["Report", "ReportKind", "ReportedRecipient", "Source", "parse_report"]
