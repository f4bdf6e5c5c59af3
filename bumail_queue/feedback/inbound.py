"""The listener of ``manage.py queue_inbound``: returned mail handed over by an MTA in front.

An LMTP server (RFC 2033; plain SMTP with ``--smtp``) on the address given, for a
Postfix or an Exim that receives the bounce domain's mail to hand it over. It takes
only mail to the addresses the queue reads: a ``RETURN_PATH`` address whose token
reads back, and the ``FEEDBACK_ADDRESSES`` (a feedback loop's, an abuse box). Any other
recipient is refused ``550 5.1.1``, so the MTA in front bounces it or routes it
elsewhere. Each message is processed (``processing.process_returned_mail``) before
its reply: ``250`` once its changes are written, ``451 4.3.0`` when they could not be
(the store or the database is down), so that the MTA in front keeps it and tries
again; nothing is accepted and lost.

aiosmtpd is the server: it speaks SMTP and LMTP, bounds a line and a message, and runs
on asyncio; the processing, Django's ORM and the store, runs on a few threads of its
own. aiosmtpd's LMTP answers a message's data once; LMTP wants a reply for each
recipient, so the handler sends the others itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections

from bumail_queue.addresses import ascii_lower, normal_address
from bumail_queue.conf import QueueSettings
from bumail_queue.verp import read_return_path

logger = logging.getLogger("bumail_queue.feedback")

MESSAGE_SIZE_LIMIT = 10 * 1024 * 1024
"""The largest message taken (octets): a bounce returns headers, or a message the
queue sent, within ``MAX_MESSAGE_SIZE``; more is refused ``552`` by aiosmtpd."""
PROCESSING_THREADS = 4

Process = Callable[[bytes, list[str]], object]


class FeedbackHandler:
    """aiosmtpd's handler: which recipients are taken, and what a message's data does."""

    def __init__(
        self, *, settings: QueueSettings, process: Process, executor: concurrent.futures.Executor, lmtp: bool
    ) -> None:
        self.settings = settings
        self.lmtp = lmtp
        self.process = process
        self.executor = executor

    def accepts(self, address: str) -> bool:
        """Whether ``address`` is one the queue reads mail to."""
        # Compared without case: these are the site's own mailboxes, which its MTA takes so.
        if ascii_lower(normal_address(address)) in self.settings.feedback_addresses:
            return True
        template = self.settings.return_path
        return template is not None and read_return_path(template, address) is not None

    async def handle_RCPT(  # noqa: N802 (aiosmtpd's name)
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]
    ) -> str:
        if not self.accepts(address):
            return f"550 5.1.1 <{address}>: not an address this queue reads mail to"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        content = envelope.original_content or envelope.content
        raw = content if isinstance(content, bytes) else str(content).encode("utf-8", "surrogateescape")
        recipients = list(envelope.rcpt_tos)
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, self._process, raw, recipients)
        except Exception:  # the store or the database: the MTA in front keeps it, and tries again
            logger.exception("returned mail not processed recipients=%s", ",".join(recipients))
            reply = "451 4.3.0 The message could not be processed now; try again later"
        else:
            reply = "250 2.0.0 Processed"
        if self.lmtp:
            for _ in recipients[1:]:  # LMTP: a reply for each recipient, the last one returned
                await server.push(reply)
        return reply

    def _process(self, raw: bytes, recipients: list[str]) -> None:
        try:
            self.process(raw, recipients)
        finally:
            connections.close_all()  # this thread's own


async def serve(
    *,
    settings: QueueSettings,
    process: Process,
    host: str,
    port: int,
    lmtp: bool,
    stop: asyncio.Event,
    ready: Callable[[Sequence[Any]], None],
) -> None:
    """Serve until ``stop`` is set; ``ready`` gets the listening socket's address."""
    from aiosmtpd.lmtp import LMTP
    from aiosmtpd.smtp import SMTP

    with concurrent.futures.ThreadPoolExecutor(PROCESSING_THREADS, thread_name_prefix="bumail-queue-inbound") as pool:
        handler = FeedbackHandler(settings=settings, process=process, executor=pool, lmtp=lmtp)
        protocol = LMTP if lmtp else SMTP
        server = await asyncio.get_running_loop().create_server(
            lambda: protocol(
                handler, hostname=settings.hostname, data_size_limit=MESSAGE_SIZE_LIMIT, decode_data=False
            ),
            host,
            port,
        )
        ready(server.sockets[0].getsockname())
        try:
            await stop.wait()
        finally:
            server.close()
            await server.wait_closed()


class Listener:
    """The listener on a thread of its own, as ``queue_worker --inbound`` runs it beside
    the worker: started by ``start()``, which returns once it listens (or raises the
    ``OSError`` of its socket), and stopped by ``close()``."""

    def __init__(self, *, settings: QueueSettings, process: Process, host: str, port: int, lmtp: bool) -> None:
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._started: concurrent.futures.Future[tuple[str, int]] = concurrent.futures.Future()
        self._settings, self._process, self._host, self._port, self._lmtp = settings, process, host, port, lmtp
        self._thread = threading.Thread(target=self._run, name="bumail-queue-inbound-listener", daemon=True)

    def start(self) -> tuple[str, int]:
        """Start listening; return the host and port listened on."""
        self._thread.start()
        return self._started.result()

    def close(self) -> None:
        """Stop listening; a message being processed is finished first."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()

    def _run(self) -> None:
        def ready(address: Sequence[Any]) -> None:
            self._started.set_result((str(address[0]), int(address[1])))

        try:
            self._loop.run_until_complete(
                serve(
                    settings=self._settings,
                    process=self._process,
                    host=self._host,
                    port=self._port,
                    lmtp=self._lmtp,
                    stop=self._stop,
                    ready=ready,
                )
            )
        except BaseException as error:
            if not self._started.done():
                self._started.set_exception(error)
            else:
                logger.exception("the inbound listener stopped")
        finally:
            self._loop.close()
