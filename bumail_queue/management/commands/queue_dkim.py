"""``manage.py queue_dkim``: does the DNS publish the key each ``DKIM`` signer signs with?"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bumail_queue.conf import get_settings
from bumail_queue.delivery.dkim import DKIMError, check_publication, describe, load_key, public_key_record
from bumail_queue.delivery.dns import make_resolver
from bumail_queue.errors import QueueConfigurationError


class Command(BaseCommand):
    help = (
        "Check each DKIM signer: its key can be read, and the DNS (DNS_NAMESERVERS, or the system's) "
        "publishes it at <selector>._domainkey.<domain>. Exits 1 when one does not."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--records", action="store_true", help="only print the TXT record each signer needs, for the zone file"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        settings = get_settings()
        if not settings.dkim:
            raise CommandError("BUMAIL_QUEUE['DKIM'] names no signer: nothing signs the mail.")
        try:
            resolver = None if options["records"] else make_resolver(settings.dns_nameservers)
        except QueueConfigurationError as error:
            raise CommandError(error.message) from error
        failed = 0
        for signer in settings.dkim:
            try:
                key = load_key(signer)
            except DKIMError as error:
                self.stdout.write(f"{describe(signer)}: cannot sign: {error}.")
                failed += 1
                continue
            if resolver is None:
                self.stdout.write(f'{signer.selector}._domainkey.{signer.domain} TXT "{public_key_record(key)}"')
                continue
            publication = check_publication(key, resolver)
            verdict = "ok" if publication.matches else "NOT PUBLISHED"
            self.stdout.write(f"{describe(signer)}: {verdict}: {publication.text}.")
            failed += not publication.matches
        if failed:
            raise CommandError(f"{failed} of {len(settings.dkim)} DKIM signers would not verify.", returncode=1)
