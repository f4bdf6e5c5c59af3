"""``manage.py queue_inbound``: a process taking returned mail over LMTP (and SMTP), as
a Postfix in front would hand it over, on the ORM store and Redis."""

from __future__ import annotations

import re
import signal
import socket
import uuid

import pytest
from django.test import override_settings

from bumail_queue.service import QueueService
from bumail_queue.suppression import SuppressionReason
from bumail_queue.verp import return_path
from tests.feedback.test_parsing import ARF, POSTFIX_DSN, crlf
from tests.helpers import read_all, start_command, start_worker, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TEMPLATE = "bounces+{token}@example.com"
SETTINGS = {"HOSTNAME": "mta.example.com", "RETURN_PATH": TEMPLATE, "FEEDBACK_ADDRESSES": ["fbl@example.com"]}


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": "orm"}


@pytest.fixture
def inbound(store_settings):
    """A running ``queue_inbound`` and the port it listens on; SIGTERM at the end."""
    settings = {**SETTINGS, **store_settings}
    process = start_command(settings, "queue_inbound", "--listen", "127.0.0.1:0")
    lines, reader = read_all(process)
    try:
        assert wait_until(lambda: any("listening on" in line for line in lines), 30), "".join(lines)
        port = int(re.search(r"listening on lmtp://127\.0\.0\.1:(\d+)", "".join(lines))[1])
        with override_settings(BUMAIL_QUEUE=settings):
            yield port
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        reader.join(5)
        assert "stopped" in "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()


class Client:
    """An LMTP client that reads every reply (smtplib reads one after DATA)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.file = self.sock.makefile("rb")
        self.reply()  # the greeting

    def reply(self):
        lines = []
        while True:
            line = self.file.readline().decode()
            lines.append(line.rstrip())
            if line[3:4] != "-":
                return "\n".join(lines)

    def command(self, line):
        self.sock.sendall(line.encode() + b"\r\n")
        return self.reply()

    def close(self):
        self.command("QUIT")
        self.file.close()
        self.sock.close()

    def data(self, raw, replies):
        assert self.command("DATA").startswith("354")
        self.sock.sendall(raw.replace(b"\r\n.", b"\r\n..") + b".\r\n")
        return [self.reply() for _ in range(replies)]


def test_returned_mail_to_a_return_path_or_a_feedback_address_is_read_and_acted_on(inbound):
    item_id = str(uuid.uuid4())
    bounce_to = return_path(TEMPLATE, item_id, "nobody@example.net")
    client = Client(inbound)
    assert client.command("LHLO mx.example.com").startswith("250")
    assert client.command("MAIL FROM:<>").startswith("250")
    assert client.command("RCPT TO:<someone@example.com>").startswith("550 5.1.1")  # not ours to read
    assert client.command(f"RCPT TO:<{bounce_to}>").startswith("250")
    assert client.command("RCPT TO:<fbl@example.com>").startswith("250")
    # LMTP: one reply for each recipient taken.
    assert client.data(crlf(POSTFIX_DSN), 2) == ["250 2.0.0 Processed", "250 2.0.0 Processed"]
    assert client.command("MAIL FROM:<abuse@fbl.example.net>").startswith("250")
    assert client.command("RCPT TO:<FBL@example.com>").startswith("250")
    assert client.data(crlf(ARF), 1) == ["250 2.0.0 Processed"]
    client.close()
    found = QueueService().suppressed(["nobody@example.net", "Carol@example.net"])
    assert (found["nobody@example.net"].reason, found["Carol@example.net"].reason) == (
        SuppressionReason.BOUNCED,
        SuppressionReason.COMPLAINED,
    )


def test_the_worker_takes_returned_mail_itself_with_inbound(store_settings):
    settings = {**SETTINGS, **store_settings}
    process = start_worker(settings, "--inbound", "127.0.0.1:0")
    lines, reader = read_all(process)
    try:
        assert wait_until(lambda: "inbound listening on" in "".join(lines), 30), "".join(lines)
        port = int(re.search(r"inbound listening on lmtp://127\.0\.0\.1:(\d+)", "".join(lines))[1])
        bounce_to = return_path(TEMPLATE, str(uuid.uuid4()), "nobody@example.net")
        client = Client(port)
        assert client.command("LHLO mx.example.com").startswith("250")
        assert client.command("MAIL FROM:<>").startswith("250")
        assert client.command(f"RCPT TO:<{bounce_to}>").startswith("250")
        assert client.data(crlf(POSTFIX_DSN), 1) == ["250 2.0.0 Processed"]
        client.close()
        with override_settings(BUMAIL_QUEUE=settings):
            found = QueueService().suppressed(["nobody@example.net"])
        assert found["nobody@example.net"].reason == SuppressionReason.BOUNCED
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        reader.join(5)
        # The listener stopped with the worker: nothing listens on its port any more.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if process.poll() is None:
            process.kill()


def test_inbound_on_a_port_taken_is_a_clear_error(store_settings):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start_worker({**SETTINGS, **store_settings}, "--inbound", f"127.0.0.1:{port}")
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 1
    assert f"Cannot listen on 127.0.0.1 port {port}: Address already in use." in output
    assert "Traceback" not in output
