"""``manage.py queue_hold``: hold the items a filter matches, as Postfix's ``postsuper -h``."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from bumail_queue.management.bulk import NOT_HELD, add_filter_arguments, filter_from, operator, report
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.service import queue


class Command(BaseCommand):
    help = (
        "Hold the items a filter matches: none is delivered until queue_release. Items being delivered "
        "are left to their workers. --dry-run says how many, and changes nothing."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_filter_arguments(parser, states=NOT_HELD)

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = filter_from(options)
        with store_errors_in_one_line():
            result = queue.hold(wanted, dry_run=options["dry_run"], by=operator(options))
        report(self, result)
