"""``manage.py queue_tlsrpt``: the day's TLS reports (RFC 8460) of the MTA-STS policy domains, as JSON."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, timedelta
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from bumail_queue.conf import get_settings, normalise_domain
from bumail_queue.delivery.tlsrpt import reports
from bumail_queue.management.arguments import iso_date
from bumail_queue.management.commands.queue_status import store_errors_in_one_line
from bumail_queue.stores import get_store


class Command(BaseCommand):
    help = (
        "Print the RFC 8460 TLS report of each MTA-STS policy domain for one day (UTC): a JSON array, "
        "one report per domain, from the sessions the workers counted. Sends nothing."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--date", type=iso_date, help="the day, YYYY-MM-DD (default: yesterday, UTC)")
        parser.add_argument("--domain", help="only this policy domain's report")
        parser.add_argument("--organization", help="the report's organization-name (default: HOSTNAME)")
        parser.add_argument("--contact", help="the report's contact-info (default: postmaster@HOSTNAME)")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = get_settings()
        day = options["date"] or (timezone.now().astimezone(UTC) - timedelta(days=1)).date()
        with store_errors_in_one_line():
            counts = get_store().tls_session_counts(day)
        if options["domain"]:
            domain = normalise_domain(options["domain"])
            counts = [count for count in counts if count.domain == domain]
        made = reports(
            counts,
            day=day,
            organization=options["organization"] or settings.hostname,
            contact=options["contact"] or f"postmaster@{settings.hostname}",
            sender=settings.hostname,
        )
        self.stdout.write(json.dumps(made, indent=2, ensure_ascii=False))
