"""What ``queue_hold``, ``queue_release``, ``queue_cancel`` and ``queue_retry`` share:
the filter's options, the safety of ``--all``, and how a result is reported."""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bumail_queue.errors import QueueError
from bumail_queue.operations.bulk import BulkFilter, BulkResult
from bumail_queue.queries import ItemState

from .arguments import duration

#: The states a hold or a retry may be for: a held item stays held.
NOT_HELD = tuple(state for state in ItemState if state != ItemState.HELD)
#: The options that make a filter (``--state`` is the command's own where it has one).
FILTER_OPTIONS = ("domain", "channel", "state", "older_than", "sender", "recipient")


def add_filter_arguments(
    parser: argparse.ArgumentParser,
    *,
    states: tuple[ItemState, ...] = tuple(ItemState),
    domain: str = "only items with a recipient at this domain",
) -> None:
    """Add the filter's options (``--state`` offering ``states``, if any), ``--dry-run``,
    ``--all`` and ``--by``."""
    parser.add_argument("--domain", help=domain)
    parser.add_argument("--channel", help="only items of this channel")
    if states:
        parser.add_argument("--state", choices=[state.value for state in states], help="only items in this state")
    parser.add_argument(
        "--older-than", type=duration, metavar="AGE", help="only items queued longer ago than AGE (30m, 12h, 2d)"
    )
    parser.add_argument("--sender", metavar="PATTERN", help="only items from this sender (* for any text)")
    parser.add_argument(
        "--recipient", metavar="PATTERN", help="only items with a recipient like *@example.com or ann* (* for any text)"
    )
    parser.add_argument("--dry-run", action="store_true", help="change nothing: say how many and show a sample")
    parser.add_argument("--all", action="store_true", help="with no filter: act on every item")
    parser.add_argument("--by", help="who acts, for the audit entry (default: the operating system's user)")


def has_filter(options: dict[str, Any]) -> bool:
    """Return whether any of the filter's options was given."""
    return any(options.get(name) is not None for name in FILTER_OPTIONS)


def filter_from(options: dict[str, Any]) -> BulkFilter:
    """Return the filter the options give; refuse none without ``--all``."""
    if not has_filter(options) and not options["all"]:
        raise CommandError(
            "Give a filter (--domain, --channel, --state, --older-than, --sender, --recipient), "
            "or --all to act on every item."
        )
    if has_filter(options) and options["all"]:
        raise CommandError("Give a filter or --all, not both.")
    try:
        return BulkFilter(**{name: options.get(name) for name in FILTER_OPTIONS})
    except QueueError as error:
        raise CommandError(error.message) from error


def operator(options: dict[str, Any]) -> str:
    """Return who acts: ``--by``, else the operating system's user."""
    if options.get("by"):
        return str(options["by"]).strip()
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def items(count: int) -> str:
    return f"{count} item{'' if count == 1 else 's'}"


def report(command: BaseCommand, result: BulkResult) -> None:
    """Say how many items were (would be) changed and left alone, and show the sample."""
    past = result.action.past
    line = f"{items(result.count)} {'would be ' if result.dry_run else ''}{past}"
    if result.skipped:
        line += f"; {result.skipped} left alone (being delivered, or changed meanwhile)"
    command.stdout.write(f"{line}.")
    if result.sample:
        command.stdout.write("Sample:" if result.dry_run else "Among them:")
        for item in result.sample:
            recipients = ", ".join(item.recipients[:3]) + (" ..." if len(item.recipients) > 3 else "")
            command.stdout.write(f"  {item.id}  {recipients}  {item.subject or '(no subject)'}")
