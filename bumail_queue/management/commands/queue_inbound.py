"""``manage.py queue_inbound``: take returned mail from an MTA in front, over LMTP or SMTP."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import signal
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from bumail_queue.conf import get_settings
from bumail_queue.feedback import inbound
from bumail_queue.feedback.processing import process_returned_mail


def host_and_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:2526`` for IPv6), the port from 0 (any free one) to 65535."""
    host, colon, port = value.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT, such as 127.0.0.1:2526")
    return host, int(port)


class Command(BaseCommand):
    help = (
        "Take returned mail (bounces, feedback-loop complaints) that an MTA in front hands over, over LMTP "
        "(or SMTP with --smtp): each message to a RETURN_PATH or FEEDBACK_ADDRESSES address is read, and "
        "the suppression list, the delivery log and the signals updated before it is accepted."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--listen", type=host_and_port, required=True, help="HOST:PORT to listen on, e.g. 127.0.0.1:2526"
        )
        parser.add_argument("--smtp", action="store_true", help="speak SMTP rather than LMTP")

    def handle(self, *args: Any, **options: Any) -> None:
        if importlib.util.find_spec("aiosmtpd") is None:
            raise CommandError("queue_inbound needs aiosmtpd: pip install 'bumail-queue[feedback]'.")
        host, port = options["listen"]
        protocol = "smtp" if options["smtp"] else "lmtp"
        try:
            asyncio.run(self._serve(host, port, lmtp=not options["smtp"], protocol=protocol))
        except OSError as error:
            raise CommandError(f"Cannot listen on {host} port {port}: {error.strerror or error}.") from error

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
