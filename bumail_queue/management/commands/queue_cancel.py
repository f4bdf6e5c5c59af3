"""``manage.py queue_cancel``: cancel the items a filter matches, as Postfix's ``postsuper -d``."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from bumail_queue.management.bulk import add_filter_arguments, filter_from, operator, report
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.service import queue


class Command(BaseCommand):
    help = (
        "Cancel the items a filter matches, as the admin's Cancel does: no DSN, each recipient not final "
        "logged as cancelled. --dry-run says how many, and changes nothing."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_filter_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = filter_from(options)
        with store_errors_in_one_line():
            result = queue.cancel_matching(wanted, dry_run=options["dry_run"], by=operator(options))
        report(self, result)
