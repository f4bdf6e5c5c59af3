"""``manage.py queue_resend``: queue an archived message again, with a new Message-ID."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from bumail_queue.management.bulk import operator
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.service import queue


class Command(BaseCommand):
    help = (
        "Queue the archived message of item ID again (ARCHIVE): the same octets with a new Message-ID, "
        "the same sender, channel and priority, to the original recipients or those --to names."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("id", metavar="ID", help="the item whose archived message to resend")
        parser.add_argument(
            "--to",
            action="append",
            metavar="ADDRESS",
            help="resend to this recipient of the original only (repeat for more; default: all of them)",
        )
        parser.add_argument("--by", help="who resends, for the archive's record (default: the operating system's user)")

    def handle(self, *args: Any, **options: Any) -> None:
        with store_errors_in_one_line():
            item = queue.resend(options["id"], recipients=options["to"], by=operator(options))
        recipients = ", ".join(r.address for r in item.recipients)
        self.stdout.write(f"Resent {options['id']} as item {item.id}, to {recipients}.")
