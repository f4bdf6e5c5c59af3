"""A loopback HTTP server that answers as Postmark's email API documents it.

anymail's Postmark backend, pointed at it (``OPTIONS = {"api_url": server.url, ...}``),
sends it what it would send Postmark. ``PostmarkServer`` answers ``POST /email`` with
``answer`` (a :class:`Answer`, the default accepting) and keeps each request's JSON in
``requests`` and its server token in ``tokens``. The answers Postmark documents:

``Answer.accepted()``
    200, ``ErrorCode`` 0, a ``MessageID``: every recipient sent.
``Answer.inactive(*addresses)``
    Those recipients were marked inactive (a hard bounce, a complaint): 200 naming them
    when some recipients are left, 422 with ``ErrorCode`` 406 when none is.
``Answer.invalid_request()``
    422, ``ErrorCode`` 300, about the sender: the message is refused.
``Answer.status(code, retry_after=None)``
    Any other status (429 with ``Retry-After``, 500), with an error body.
``Answer.hang()``
    Nothing until the client gives up.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

_HANG_LIMIT = 30.0


@dataclasses.dataclass(frozen=True)
class Answer:
    kind: str = "accepted"
    addresses: tuple[str, ...] = ()
    code: int = 200
    retry_after: str | None = None

    @classmethod
    def accepted(cls) -> Answer:
        return cls()

    @classmethod
    def inactive(cls, *addresses: str) -> Answer:
        return cls(kind="inactive", addresses=addresses)

    @classmethod
    def invalid_request(cls) -> Answer:
        return cls(kind="invalid", code=422)

    @classmethod
    def status(cls, code: int, retry_after: str | None = None) -> Answer:
        return cls(kind="status", code=code, retry_after=retry_after)

    @classmethod
    def hang(cls) -> Answer:
        return cls(kind="hang")


class PostmarkServer:
    """Postmark's ``/email`` endpoint on 127.0.0.1, answering ``answer``."""

    def __init__(self) -> None:
        self.answer = Answer.accepted()
        self.requests: list[dict[str, Any]] = []
        self.tokens: list[str] = []
        self.message_ids: list[str] = []
        self._stopped = threading.Event()
        self._http = _QuietServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self.port: int = self._http.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _respond(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        answer = self.answer
        recipients = [
            a.strip() for field in ("To", "Cc", "Bcc") for a in (body.get(field) or "").split(",") if a.strip()
        ]
        bare = [r.split("<")[-1].rstrip(">").lower() for r in recipients]
        if answer.kind == "inactive":
            inactive = [a for a in bare if a in answer.addresses]
            found = ", ".join(inactive)
            if len(inactive) == len(bare):
                text = (
                    "You tried to send to a recipient that has been marked as inactive.\n"
                    f"Found inactive addresses: {found}.\n"
                    "Inactive recipients are ones that have generated a hard bounce or a spam complaint. "
                )
                return 422, {"ErrorCode": 406, "Message": text}, {}
            message = (
                f"Message OK, but will not deliver to these inactive addresses: {found}. "
                "Inactive recipients are ones that have generated a hard bounce or a spam complaint."
            )
            return 200, self._sent(body, message), {}
        if answer.kind == "invalid":
            return 422, {"ErrorCode": 300, "Message": "Invalid 'From' address: 'nobody'."}, {}
        if answer.kind == "status":
            headers = {"Retry-After": answer.retry_after} if answer.retry_after else {}
            return answer.code, {"ErrorCode": 100, "Message": f"Service answered {answer.code}"}, headers
        return 200, self._sent(body, "OK"), {}

    def _sent(self, body: dict[str, Any], message: str) -> dict[str, Any]:
        message_id = str(uuid.uuid4())
        self.message_ids.append(message_id)
        return {
            "To": body.get("To", ""),
            "SubmittedAt": "2026-03-01T09:00:00Z",
            "MessageID": message_id,
            "ErrorCode": 0,
            "Message": message,
        }

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # An answer's headers and body go in two sends: with Nagle's algorithm the
            # body would wait for the client's delayed ACK (40 ms) on a kept connection.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                server.requests.append(body)
                server.tokens.append(self.headers.get("X-Postmark-Server-Token", ""))
                if server.answer.kind == "hang":
                    deadline = time.monotonic() + _HANG_LIMIT
                    while time.monotonic() < deadline and not server._stopped.is_set():
                        time.sleep(0.05)
                    return
                code, data, headers = server._respond(body)
                payload = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        return Handler

    def start(self) -> PostmarkServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(10)


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on a hanging answer


@pytest.fixture
def postmark() -> Iterator[PostmarkServer]:
    server = PostmarkServer().start()
    yield server
    server.stop()


def route(server: PostmarkServer, **options: Any) -> dict[str, Any]:
    """A ``backend`` route through anymail's Postmark backend to ``server``."""
    return {
        "TYPE": "backend",
        "BACKEND": "anymail.backends.postmark.EmailBackend",
        "NAME": "postmark",
        "OPTIONS": {"server_token": "pm-test-s3cret-token", "api_url": server.url, "requests_timeout": 1, **options},
    }
