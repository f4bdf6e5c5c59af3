"""``manage.py queue_inbound``: take returned mail from an MTA in front, over LMTP or SMTP,
or fetch it from a mailbox of ``INBOUND_MAILBOXES`` over IMAP or POP3."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import signal
import threading
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from bumail_queue.conf import get_settings
from bumail_queue.conf.mailboxes import SCHEMES, shown_url, url_problem
from bumail_queue.feedback import inbound
from bumail_queue.feedback.mailbox import MailboxError, fetch_mailbox
from bumail_queue.feedback.processing import process_returned_mail
from bumail_queue.management.arguments import host_and_port, listen_error

from .queue_status import store_errors_in_one_line


def seconds(value: str) -> float:
    """A number of seconds from 1 to a day."""
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 1 <= number <= 86400:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds from 1 to 86400")
    return number


class Command(BaseCommand):
    help = (
        "Take returned mail (bounces, feedback-loop complaints) that an MTA in front hands over, over LMTP "
        "(or SMTP with --smtp): each message to a RETURN_PATH or FEEDBACK_ADDRESSES address is read, and "
        "the suppression list, the delivery log and the signals updated before it is accepted. With --imap "
        "or --pop3, fetch it from a mailbox of INBOUND_MAILBOXES instead: one pass, each message processed "
        "once, then deleted or moved."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--listen", type=host_and_port, help="HOST:PORT to listen on, e.g. 127.0.0.1:2526")
        source.add_argument("--imap", metavar="URL", help="fetch from this IMAP mailbox of INBOUND_MAILBOXES")
        source.add_argument("--pop3", metavar="URL", help="fetch from this POP3 mailbox of INBOUND_MAILBOXES")
        parser.add_argument("--smtp", action="store_true", help="speak SMTP rather than LMTP")
        parser.add_argument(
            "--every", type=seconds, metavar="SECONDS", help="with --imap or --pop3: fetch again every SECONDS"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        url = options["imap"] or options["pop3"]
        if url is not None and options["smtp"]:
            raise CommandError("--smtp goes with --listen.")
        if url is not None:
            self._fetch(url, "imap" if options["imap"] else "pop3", options["every"])
            return
        if options["every"] is not None:
            raise CommandError("--every goes with --imap or --pop3.")
        if importlib.util.find_spec("aiosmtpd") is None:
            raise CommandError("queue_inbound needs aiosmtpd: pip install 'bumail-queue[feedback]'.")
        host, port = options["listen"]
        protocol = "smtp" if options["smtp"] else "lmtp"
        try:
            asyncio.run(self._serve(host, port, lmtp=not options["smtp"], protocol=protocol))
        except OSError as error:
            raise CommandError(f"Cannot listen on {host} port {port}: {listen_error(error)}.") from error

    async def _serve(self, host: str, port: int, *, lmtp: bool, protocol: str) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, stop.set)

        def ready(address: Sequence[Any]) -> None:
            self.stdout.write(f"listening on {protocol}://{address[0]}:{address[1]}")
            self.stdout.flush()

        await inbound.serve(
            settings=get_settings(),
            process=lambda raw, recipients: process_returned_mail(raw, recipients=recipients),
            host=host,
            port=port,
            lmtp=lmtp,
            stop=stop,
            ready=ready,
        )
        self.stdout.write("stopped")

    def _fetch(self, url: str, protocol: str, every: float | None) -> None:
        problem = url_problem(url)
        if problem:
            raise CommandError(f"{shown_url(url)} is not a mailbox URL: {problem}.")
        schemes = [s for s, (p, _, _) in SCHEMES.items() if p == protocol]
        if url.split(":", 1)[0] not in schemes:
            raise CommandError(f"--{protocol} takes a URL starting {' or '.join(f'{s}://' for s in schemes)}.")
        settings = get_settings()
        mailbox = settings.inbound_mailboxes.get(url)
        if mailbox is None:
            known = ", ".join(settings.inbound_mailboxes) or "none"
            raise CommandError(f"{url} is not a key of BUMAIL_QUEUE['INBOUND_MAILBOXES'] (its keys: {known}).")
        stop = threading.Event()
        if every is not None:
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, lambda *_: stop.set())
        while True:
            close_old_connections()
            try:
                with store_errors_in_one_line():
                    counts = fetch_mailbox(
                        mailbox,
                        settings=settings,
                        process=lambda raw, recipients: process_returned_mail(raw, recipients=recipients),
                    )
            except (MailboxError, CommandError) as error:
                if every is None:
                    raise CommandError(str(error)) from None
                self.stderr.write(str(error))
            else:
                self.stdout.write(f"{url}: {counts}")
            self.stdout.flush()
            if every is None or stop.wait(every):
                return
