"""``manage.py queue_purge``: delete old delivery log entries, in batches, and apply the
archive's retention (``ARCHIVE``, ``REDACT_AFTER``)."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from bumail_queue import archive, delivery_log
from bumail_queue.conf import get_settings
from bumail_queue.management.arguments import describe_duration, duration, positive_int
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.models import DeliveryLog
from bumail_queue.stores import get_store

#: A larger batch is one long transaction, and its ids overflow SQLite's bound parameters.
MAX_BATCH_SIZE = 10_000


def batch_size(value: str) -> int:
    """A whole number from 1 to ``MAX_BATCH_SIZE``."""
    number = positive_int(value)
    if number > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"{value!r} is more than {MAX_BATCH_SIZE}")
    return number


class Command(BaseCommand):
    help = (
        "Delete delivery log entries older than --older-than (default: DELIVERY_LOG_RETENTION), in batches, "
        "and the TLS report counts of the days before; drop the archived messages past ARCHIVE's time "
        "(their headers stay) and delete those past REDACT_AFTER."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--older-than", type=duration, help="e.g. 30d, 12h, 2w (default: DELIVERY_LOG_RETENTION)")
        parser.add_argument(
            "--batch-size",
            type=batch_size,
            default=delivery_log.PURGE_BATCH_SIZE,
            help=f"rows deleted per statement, at most {MAX_BATCH_SIZE} (default: %(default)s)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = get_settings()
        now = timezone.now()
        self._purge_archive(now, dry_run=options["dry_run"], batch_size=options["batch_size"])
        older_than: timedelta | None = options["older_than"] or settings.delivery_log_retention
        if older_than is None:
            raise CommandError("DELIVERY_LOG_RETENTION is None (keep forever): give --older-than to purge.")
        cutoff = now - older_than
        age = describe_duration(older_than)
        if options["dry_run"]:
            with store_errors_in_one_line():
                count = DeliveryLog.objects.using(settings.database).filter(logged_at__lt=cutoff).count()
            self.stdout.write(
                f"Would delete {count} delivery log entr{'y' if count == 1 else 'ies'} older than {age} (before {cutoff:%Y-%m-%d %H:%M:%S %Z})."
            )
            return
        with store_errors_in_one_line():
            deleted = delivery_log.purge(older_than=older_than, now=now, batch_size=options["batch_size"])
            # A day's TLS report goes once the whole day is older than the cutoff.
            kinds = get_store().purge_tls_session_counts(before=cutoff.date())
        self.stdout.write(
            f"Deleted {deleted} delivery log entr{'y' if deleted == 1 else 'ies'} older than {age} (before {cutoff:%Y-%m-%d %H:%M:%S %Z})."
        )
        self.stdout.write(
            f"Deleted {kinds} TLS report count{'' if kinds == 1 else 's'} of the days before {cutoff:%Y-%m-%d}."
        )

    def _purge_archive(self, now: datetime, *, dry_run: bool, batch_size: int) -> None:
        """The archive's retention, whatever ``--older-than`` says: each row carries its
        own times, set by ``ARCHIVE`` and ``REDACT_AFTER`` as it was archived."""
        with store_errors_in_one_line():
            if dry_run:
                bodies, rows = archive.due_counts(now=now)
            else:
                bodies, rows = archive.purge(now=now, batch_size=batch_size)
        if bodies or rows:
            verb = ("Would drop", "would delete") if dry_run else ("Dropped", "deleted")
            self.stdout.write(
                f"{verb[0]} the body of {bodies} archived message{'' if bodies == 1 else 's'} past ARCHIVE; "
                f"{verb[1]} {rows} past REDACT_AFTER."
            )
