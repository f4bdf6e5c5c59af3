"""An SMTP sink on loopback that answers like a server far away (aiosmtpd).

    python bench/distant_sink.py --port P --delay-ms 50 [--every-round-trip] [--no-pipelining] --count-file F

It accepts every message and forgets it, keeping only each one's ``Subject``. Two ways
to be distant:

- by default (the peer harness's S6), it waits ``--delay-ms`` before each reply to a
  final dot, as a smarthost that takes that long to queue each message;
- ``--every-round-trip``: it waits ``--delay-ms`` before each reply the client is
  waiting for, that is before a reply when nothing more of the client's has arrived. A
  client that pipelines (RFC 2920) waits once for a whole group, so this is a server
  ``--delay-ms`` of round-trip time away, which is what pipelining saves.

It offers PIPELINING unless ``--no-pipelining`` (aiosmtpd reads pipelined commands
one after another, though it does not say so). On SIGTERM it writes
``<messages> <unique subjects>`` to ``--count-file`` and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
from typing import Any

from aiosmtpd.smtp import SMTP

SUBJECT = re.compile(rb"^Subject: ([^\r\n]*)", re.MULTILINE)


class Counter:
    """Counts the messages received and their distinct subjects."""

    def __init__(self) -> None:
        self.messages = 0
        self.subjects: set[bytes] = set()


class Handler:
    def __init__(self, counter: Counter, *, dot_delay: float, pipelining: bool) -> None:
        self.counter = counter
        self.dot_delay = dot_delay
        self.pipelining = pipelining

    async def handle_EHLO(  # noqa: N802 - aiosmtpd's hook names
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname
        if not self.pipelining:
            return responses
        return [responses[0], "250-PIPELINING", *responses[1:]]

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        found = SUBJECT.search(envelope.original_content or b"")
        self.counter.messages += 1
        self.counter.subjects.add(found.group(1) if found else b"")
        if self.dot_delay:
            await asyncio.sleep(self.dot_delay)
        return "250 2.0.0 Ok: queued"


class DistantSMTP(SMTP):
    """aiosmtpd's server, each reply the client waits for delayed by a round trip."""

    round_trip = 0.0

    async def push(self, status: str) -> None:
        # Nothing more of the client's has arrived: it is waiting for this reply, which
        # reaches it a round trip after it wrote. Replies within a pipelined group do not wait.
        if self.round_trip and not self._reader._buffer:  # type: ignore[attr-defined]
            await asyncio.sleep(self.round_trip)
        await super().push(status)


async def serve(args: argparse.Namespace) -> Counter:
    counter = Counter()
    delay = args.delay_ms / 1000
    handler = Handler(counter, dot_delay=0.0 if args.every_round_trip else delay, pipelining=not args.no_pipelining)

    def protocol() -> DistantSMTP:
        server = DistantSMTP(handler, hostname="distant.bench", ident="distant sink", data_size_limit=None)
        server.round_trip = delay if args.every_round_trip else 0.0
        return server

    loop = asyncio.get_running_loop()
    listener = await loop.create_server(protocol, host="127.0.0.1", port=args.port, backlog=256)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    listener.close()
    return counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=50)
    parser.add_argument("--every-round-trip", action="store_true")
    parser.add_argument("--no-pipelining", action="store_true")
    parser.add_argument("--count-file", required=True)
    args = parser.parse_args()
    counter = asyncio.run(serve(args))
    with open(args.count_file, "w") as out:
        out.write(f"{counter.messages} {len(counter.subjects)}\n")


if __name__ == "__main__":
    main()
