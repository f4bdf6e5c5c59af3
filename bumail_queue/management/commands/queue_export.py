"""``manage.py queue_export ADDRESS``: what the queue holds about one address, as JSON
(GDPR article 15); see docs/operations.md."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.service import queue


class Command(BaseCommand):
    help = (
        "Write everything held about an address as JSON: queued items (with their messages' header "
        "sections), delivery log entries, archived messages, suppression entries, returned mail, bulk "
        "actions that named it. To standard output, or --output FILE."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("address", metavar="ADDRESS", help="the address to export")
        parser.add_argument("--output", metavar="FILE", help="write to FILE rather than standard output")

    def handle(self, *args: Any, **options: Any) -> None:
        with store_errors_in_one_line():
            data = queue.export_address(options["address"])
        text = json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False)
        if options["output"] is None:
            self.stdout.write(text)
            return
        try:
            with open(options["output"], "w", encoding="utf-8") as output:
                output.write(text + "\n")
        except OSError as error:
            raise CommandError(f"Cannot write {options['output']}: {error.strerror or error}.") from error
        self.stdout.write(f"Wrote {options['output']}.")
