"""``manage.py queue_release``: release held items, as Postfix's ``postsuper -H``."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from bumail_queue.management.bulk import add_filter_arguments, filter_from, operator, report
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.service import queue


class Command(BaseCommand):
    help = "Release the held items a filter matches: each is due now. --dry-run says how many, and changes nothing."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_filter_arguments(parser, states=())

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = filter_from(options)
        with store_errors_in_one_line():
            result = queue.release(wanted, dry_run=options["dry_run"], by=operator(options))
        report(self, result)
