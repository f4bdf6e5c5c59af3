"""Throwaway Redis servers on loopback, for tests that stop, restart or fill one.

``redis_servers`` is a factory fixture: ``redis_servers(*args)`` starts a
``redis-server`` of its own on a free port, in a directory of the test's, with the
extra configuration ``args`` (``"--maxmemory", "4mb"``), and returns a
:class:`RedisTestServer`. Every server it started is killed after the test. The
shared test Redis (``REDIS_URL``) is never touched by these.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    """Return a loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisTestServer:
    """A ``redis-server`` process this test started; ``url`` reaches its database 0."""

    def __init__(self, directory: Path, args: tuple[str, ...]) -> None:
        self.directory = directory
        self.args = args
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisTestServer:
        """Start (again, on the same port and directory); return once it answers."""
        binary = shutil.which("redis-server")
        if binary is None:
            message = "redis-server is not installed (Debian: apt-get install redis-server)"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        self.process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.directory),
             "--save", "", "--daemonize", "no", "--logfile", str(self.directory / "redis.log"), *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = self.client()
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server did not start; see {self.directory / 'redis.log'}") from None
                time.sleep(0.02)
            finally:
                client.close()
        return self

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=10)


@pytest.fixture
def redis_servers(tmp_path: Path) -> Iterator[Callable[..., RedisTestServer]]:
    started: list[RedisTestServer] = []

    def start(*args: str) -> RedisTestServer:
        directory = tmp_path / f"redis-{len(started)}"
        directory.mkdir()
        server = RedisTestServer(directory, args)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.kill()
