"""``manage.py queue_retry``: deferred mail due now, as Postfix's ``postqueue -f`` and ``-s``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bumail_queue.management.bulk import (
    FILTER_OPTIONS,
    NOT_HELD,
    add_filter_arguments,
    filter_from,
    operator,
    report,
)
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.queries import RetryResult
from bumail_queue.service import queue


class Command(BaseCommand):
    help = (
        "Make deferred mail due now: every item with a deferred recipient, those with one at --domain, "
        "or the items named; or, with another filter, --dry-run or --all, the items the filter matches. "
        "Items being delivered are left to their workers, held items stay held; no attempt is counted."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="ID", help="an item to make due, whatever its recipients' state")
        add_filter_arguments(
            parser,
            states=NOT_HELD,
            domain="only the items with a deferred recipient at this domain (with another filter: any recipient)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ids: list[str] = options["ids"]
        domain: str | None = options["domain"]
        by_filter = (
            options["dry_run"]
            or options["all"]
            or any(options.get(name) is not None for name in FILTER_OPTIONS if name != "domain")
        )
        if ids and by_filter:
            raise CommandError("Give a filter or item ids, not both.")
        if ids and domain is not None:
            raise CommandError("Give --domain or item ids, not both.")
        if by_filter:
            wanted = filter_from(options)
            with store_errors_in_one_line():
                report(self, queue.retry_matching(wanted, dry_run=options["dry_run"], by=operator(options)))
            return
        with store_errors_in_one_line():
            done = queue.retry_deferred(domain=domain, ids=ids or None)
        for item_id in done.leased:
            self.stdout.write(f"Item {item_id} is being delivered; left alone.")
        for item_id in done.missing:
            self.stderr.write(f"No item {item_id}.")
        self.stdout.write(summary_line(done, by_id=bool(ids)))
        if done.missing:
            # The others were made due; the status says that some id was wrong, as
            # makemigrations --check says there is work left: no CommandError line.
            sys.exit(1)


def summary_line(done: RetryResult, *, by_id: bool) -> str:
    """Say how many items were made due."""
    if done.due:
        return f"{done.due} item{'s' if done.due != 1 else ''} due now."
    return "No item made due." if by_id else "No deferred item matched."
