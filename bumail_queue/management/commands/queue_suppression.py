"""``manage.py queue_suppression``: list, search, add to and remove from the suppression list;
show and forget what it holds about one address."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bumail_queue.addresses import normal_address
from bumail_queue.errors import QueueError
from bumail_queue.items import Reply, check_channel, reply_line
from bumail_queue.management.arguments import duration, positive_int
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.service import queue
from bumail_queue.suppression import (
    FORGOTTEN_LABEL,
    GLOBAL_SCOPE,
    Suppression,
    SuppressionReason,
    channel_scope,
    scope_label,
)

ACTIONS = ("list", "show", "add", "remove", "forget", "purge", "export", "import")
#: The columns of ``export`` and ``import``, in this order, with a header line.
CSV_COLUMNS = ("address", "reason", "created_at", "expires_at", "reply_code", "reply_status", "reply_text", "scope")
#: The columns of an export made before entries had scopes: all global, and imported so.
UNSCOPED_CSV_COLUMNS = CSV_COLUMNS[:-1]
EXPORT_PAGE = 1000


class Command(BaseCommand):
    help = (
        "The suppression list: addresses that fail at once, with no session, until their entries expire. "
        "list [--search TEXT] [--channel NAME] [--reason REASON], show ADDRESS (every scope), "
        "add ADDRESS... [--note TEXT] [--for 30d] [--channel NAME], remove ADDRESS... or --domain DOMAIN [--channel NAME], "
        "forget ADDRESS... (every scope), purge, export (CSV to stdout), import FILE (CSV, - for stdin)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "action",
            choices=ACTIONS,
            help="list the entries in force, the newest first; show an address's entries in every scope; "
            "add (suppress) or remove addresses; forget addresses in every scope; "
            "purge the entries that expired; export them as CSV; import a CSV of them",
        )
        parser.add_argument(
            "addresses", nargs="*", metavar="ADDRESS", help="for show, add, remove and forget; import: the file"
        )
        parser.add_argument("--search", metavar="TEXT", help="list: only the addresses that hold TEXT (case aside)")
        parser.add_argument("--limit", type=positive_int, default=100, help="list: entries shown (default: 100)")
        parser.add_argument("--json", action="store_true", help="list: one JSON object, for scripts")
        parser.add_argument("--note", default="", help="add: why, shown with the entries")
        parser.add_argument(
            "--for", dest="lasts", type=duration, help="add: 30d, 12h, 2w... (default: SUPPRESSION_DURATION)"
        )
        parser.add_argument("--domain", help="remove: every address at this domain (after an outage there)")
        parser.add_argument(
            "--channel",
            help="list, add, remove: the entries of this channel's scope (its mail alone) rather than all mail's",
        )
        parser.add_argument(
            "--reason", choices=[reason.value for reason in SuppressionReason], help="list: only entries of this reason"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action, addresses = options["action"], options["addresses"]
        if action in ("list", "purge", "export") and addresses:
            raise CommandError(f"{action} takes no address; to find one: list --search TEXT.")
        if action == "import" and len(addresses) != 1:
            raise CommandError("Give the CSV file to import (- for standard input).")
        if action in ("add", "show", "forget") and not addresses:
            raise CommandError(f"Give the addresses to {'suppress' if action == 'add' else action}.")
        scope = self._scope(options["channel"])
        with store_errors_in_one_line():
            if action == "list":
                wanted = {"text": options["search"], "scope": scope, "reason": options["reason"]}
                self._list(wanted, options["limit"], as_json=options["json"])
            elif action == "show":
                self._show(addresses, as_json=options["json"])
            elif action == "add":
                self._add(addresses, note=options["note"], lasts=options["lasts"], scope=scope or GLOBAL_SCOPE)
            elif action == "remove":
                self._remove(addresses, options["domain"], scope or GLOBAL_SCOPE)
            elif action == "forget":
                self._forget(addresses)
            elif action == "export":
                self._export()
            elif action == "import":
                self._import(addresses[0])
            else:
                dropped = queue.purge_suppressions()
                self.stdout.write(f"Dropped {dropped} expired entr{'y' if dropped == 1 else 'ies'}.")

    @staticmethod
    def _scope(channel: str | None) -> str | None:
        if channel is None:
            return None
        try:
            return channel_scope(check_channel(channel, "--channel"))
        except QueueError as error:
            raise CommandError(error.message) from error

    def _list(self, wanted: dict[str, Any], limit: int, *, as_json: bool) -> None:
        found = queue.search_suppressions(**wanted, limit=limit + 1)
        shown, more = found[:limit], len(found) > limit
        text = any(value is not None for value in wanted.values())
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

    def _show(self, addresses: list[str], *, as_json: bool) -> None:
        found = {address: queue.suppressions_for(address) for address in addresses}
        if as_json:
            data = {address: [entry_json(entry) for entry in entries] for address, entries in found.items()}
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        for address, entries in found.items():
            if not entries:
                self.stdout.write(f"{address} is not suppressed.")
            for entry in entries:
                self.stdout.write(entry_line(entry))

    def _add(self, addresses: list[str], *, note: str, lasts: timedelta | None, scope: str) -> None:
        for address in addresses:
            try:
                entry = queue.suppress(address, note=note, duration=lasts, scope=scope)
            except QueueError as error:
                if error.code != "INVALID":
                    raise
                raise CommandError(error.message) from error
            self.stdout.write(
                f"Suppressed {entry.address}{f' for {entry.scope}' if entry.scope else ''} "
                f"until {entry.expires_at:%Y-%m-%d %H:%M %Z}."
            )

    def _forget(self, addresses: list[str]) -> None:
        for address in addresses:
            try:
                gone = queue.forget_suppressions(address)
            except QueueError as error:
                raise CommandError(error.message) from error
            scopes = ", ".join(scope_label(entry.scope) for entry in gone)
            self.stdout.write(
                f"Forgot {address}: {len(gone)} entr{'y' if len(gone) == 1 else 'ies'}{f' ({scopes})' if gone else ''}."
            )

    def _remove(self, addresses: list[str], domain: str | None, scope: str) -> None:
        if bool(addresses) == (domain is not None):
            raise CommandError("Give the addresses to remove, or --domain, not both.")
        try:
            removed = queue.unsuppress(addresses, domain=domain, scope=scope)
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

    def _export(self) -> None:
        writer = csv.writer(self.stdout, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        offset = 0
        while page := queue.search_suppressions(offset=offset, limit=EXPORT_PAGE):
            writer.writerows(csv_row(entry) for entry in page)
            offset += len(page)

    def _import(self, path: str) -> None:
        try:
            if path == "-":
                entries = entries_from_csv(sys.stdin)
            else:
                with open(path, newline="", encoding="utf-8") as source:
                    entries = entries_from_csv(source)
            added = queue.add_suppressions(entries)
        except OSError as error:
            raise CommandError(f"Cannot read {path}: {error.strerror or error}.") from error
        except (ValueError, QueueError) as error:
            raise CommandError(f"{path}: {getattr(error, 'message', error)} Nothing was imported.") from error
        self.stdout.write(f"Imported {added} entr{'y' if added == 1 else 'ies'}.")


def csv_row(entry: Suppression) -> list[str]:
    reply = entry.reply
    return [
        entry.address,
        entry.reason.value,
        entry.created_at.isoformat(),
        entry.expires_at.isoformat(),
        "" if reply.code is None else str(reply.code),
        reply.status,
        reply.text,
        entry.scope,
    ]


def entries_from_csv(source: Iterable[str]) -> list[Suppression]:
    """The entries of an ``export``'s CSV; ``ValueError`` names the first line that is not one."""
    reader = csv.DictReader(source)
    if reader.fieldnames is None or tuple(reader.fieldnames) not in (CSV_COLUMNS, UNSCOPED_CSV_COLUMNS):
        raise ValueError(f"the first line must be the columns {','.join(CSV_COLUMNS)}.")
    entries = []
    for row in reader:
        try:
            entries.append(
                Suppression(
                    address=row["address"],
                    reason=SuppressionReason(row["reason"]),
                    reply=Reply(code=int(row["reply_code"]) if row["reply_code"] else None,
                                status=row["reply_status"], text=row["reply_text"]),
                    created_at=aware(row["created_at"]),
                    expires_at=aware(row["expires_at"]),
                    scope=row.get("scope") or GLOBAL_SCOPE,
                )
            )  # fmt: skip
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"line {reader.line_num} is no entry ({error}).") from error
    return entries


def aware(text: str) -> datetime:
    """An ISO 8601 time; one without an offset is UTC."""
    value = datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def entry_line(entry: Suppression) -> str:
    """Return an entry as ``list`` prints it: the address, why, since and until when, the reply."""
    return (
        f"{shown_address(entry)}  {f'{entry.scope}  ' if entry.scope else ''}{entry.reason.value}  since {entry.created_at:%Y-%m-%d %H:%M} "
        f"until {entry.expires_at:%Y-%m-%d %H:%M %Z}  {reply_line(entry.reply) or '-'}"
    )


def shown_address(entry: Suppression) -> str:
    """Return how a line names an entry's address: an erased one's as such, with its key."""
    return f"{FORGOTTEN_LABEL} {entry.address}" if entry.forgotten else entry.address


def entry_json(entry: Suppression) -> dict[str, Any]:
    return {
        "address": entry.address,
        "forgotten": entry.forgotten,
        "scope": entry.scope,
        "reason": entry.reason.value,
        "reply": entry.reply.to_dict(),
        "created_at": entry.created_at.isoformat(),
        "expires_at": entry.expires_at.isoformat(),
    }
