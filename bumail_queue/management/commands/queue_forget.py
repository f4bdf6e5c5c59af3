"""``manage.py queue_forget ADDRESS``: erase one address (GDPR article 17); see docs/operations.md."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.service import queue

#: Item ids a dry run lists.
IDS_SHOWN = 50


class Command(BaseCommand):
    help = (
        "Erase an address: delete every queued item it sends or receives (with its message, for every "
        "recipient), its delivery log entries, archived messages, returned mail; redact it in bulk "
        "actions and in other log entries; key its suppression entries by an HMAC, so that mail to it "
        "stays suppressed. --dry-run says what would go and changes nothing."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("address", metavar="ADDRESS", help="the address to erase")
        parser.add_argument("--dry-run", action="store_true", help="say what would be erased; change nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        with store_errors_in_one_line():
            result = queue.forget_address(options["address"], dry_run=options["dry_run"])
        if result.dry_run:
            self.stdout.write(f"Would erase: {result.summary()}.")
            for item_id in result.items[:IDS_SHOWN]:
                self.stdout.write(f"  item {item_id}")
            if len(result.items) > IDS_SHOWN:
                self.stdout.write(f"  ... and {len(result.items) - IDS_SHOWN} more items")
            self.stdout.write("Nothing was changed (--dry-run).")
        else:
            self.stdout.write(f"Erased: {result.summary()}.")
