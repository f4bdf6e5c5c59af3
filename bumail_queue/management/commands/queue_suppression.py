"""``manage.py queue_suppression``: list, search, add to and remove from the suppression list."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bumail_queue.addresses import normal_address
from bumail_queue.errors import QueueError
from bumail_queue.items import reply_line
from bumail_queue.management.arguments import duration, positive_int
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.service import queue
from bumail_queue.suppression import Suppression

ACTIONS = ("list", "add", "remove", "purge")


class Command(BaseCommand):
    help = (
        "The suppression list: addresses that fail at once, with no session, until their entries expire. "
        "list [--search TEXT], add ADDRESS... [--note TEXT] [--for 30d], remove ADDRESS... or --domain DOMAIN, purge."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "action",
            choices=ACTIONS,
            help="list the entries in force, the newest first; add (suppress) or remove addresses; "
            "purge the entries that expired",
        )
        parser.add_argument("addresses", nargs="*", metavar="ADDRESS", help="for add and remove")
        parser.add_argument("--search", metavar="TEXT", help="list: only the addresses that hold TEXT (case aside)")
        parser.add_argument("--limit", type=positive_int, default=100, help="list: entries shown (default: 100)")
        parser.add_argument("--json", action="store_true", help="list: one JSON object, for scripts")
        parser.add_argument("--note", default="", help="add: why, shown with the entries")
        parser.add_argument(
            "--for", dest="lasts", type=duration, help="add: 30d, 12h, 2w... (default: SUPPRESSION_DURATION)"
        )
        parser.add_argument("--domain", help="remove: every address at this domain (after an outage there)")

    def handle(self, *args: Any, **options: Any) -> None:
        action, addresses = options["action"], options["addresses"]
        if action in ("list", "purge") and addresses:
            raise CommandError(f"{action} takes no address; to find one: list --search TEXT.")
        if action == "add" and not addresses:
            raise CommandError("Give the addresses to suppress.")
        with store_errors_in_one_line():
            if action == "list":
                self._list(options["search"], options["limit"], as_json=options["json"])
            elif action == "add":
                self._add(addresses, note=options["note"], lasts=options["lasts"])
            elif action == "remove":
                self._remove(addresses, options["domain"])
            else:
                dropped = queue.purge_suppressions()
                self.stdout.write(f"Dropped {dropped} expired entr{'y' if dropped == 1 else 'ies'}.")

    def _list(self, text: str | None, limit: int, *, as_json: bool) -> None:
        found = queue.search_suppressions(text=text, limit=limit + 1)
        shown, more = found[:limit], len(found) > limit
        total = None if text else queue.count_suppressions()
        if as_json:
            data = {"total": total, "more": more, "entries": [entry_json(entry) for entry in shown]}
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        for entry in shown:
            self.stdout.write(entry_line(entry))
        if not shown:
            self.stdout.write("No suppressed address matches." if text else "The suppression list is empty.")
        elif total is not None:
            self.stdout.write(f"{total} address{'es' if total != 1 else ''} suppressed.")
        if more:
            self.stdout.write(f"(more than {limit}; --limit to show more)")

    def _add(self, addresses: list[str], *, note: str, lasts: timedelta | None) -> None:
        for address in addresses:
            try:
                entry = queue.suppress(address, note=note, duration=lasts)
            except QueueError as error:
                if error.code != "INVALID":
                    raise
                raise CommandError(error.message) from error
            self.stdout.write(f"Suppressed {entry.address} until {entry.expires_at:%Y-%m-%d %H:%M %Z}.")

    def _remove(self, addresses: list[str], domain: str | None) -> None:
        if bool(addresses) == (domain is not None):
            raise CommandError("Give the addresses to remove, or --domain, not both.")
        try:
            removed = queue.unsuppress(addresses, domain=domain)
        except QueueError as error:
            if error.code != "INVALID":
                raise
            raise CommandError(error.message) from error
        unknown = [address for address in addresses if normal_address(address) not in set(removed)]
        for address in unknown:
            self.stderr.write(f"{address} is not suppressed.")
        count = len(removed)
        self.stdout.write(f"Removed {count} address{'es' if count != 1 else ''} from the suppression list.")
        if unknown:
            sys.exit(1)  # as queue_retry does for an id no item has: the others were removed


def entry_line(entry: Suppression) -> str:
    """Return an entry as ``list`` prints it: the address, why, since and until when, the reply."""
    return (
        f"{entry.address}  {entry.reason.value}  since {entry.created_at:%Y-%m-%d %H:%M} "
        f"until {entry.expires_at:%Y-%m-%d %H:%M %Z}  {reply_line(entry.reply) or '-'}"
    )


def entry_json(entry: Suppression) -> dict[str, Any]:
    return {
        "address": entry.address,
        "reason": entry.reason.value,
        "reply": entry.reply.to_dict(),
        "created_at": entry.created_at.isoformat(),
        "expires_at": entry.expires_at.isoformat(),
    }
