"""A real Postfix on loopback as the recipients' server: its own DSNs come back through
``queue_inbound`` and suppress each unknown user, on the ORM store and Redis.

Postfix is the mailbox server of ``example.test``: it takes every recipient in the
session, delivers ``known@`` to a maildir, and bounces the others afterwards with DSNs
of its own (``5.1.1``), to each recipient's ``RETURN_PATH``. It hands them to
``queue_inbound`` with the very lines docs/feedback.md shows under *Postfix in front*,
read from the page. A ``queue_worker`` process delivers first; the listener starts once
every outcome is recorded (until then Postfix keeps the DSNs and tries again), so a
DSN is never read before the delivery it is about.
"""

from __future__ import annotations

import contextlib
import re
import signal
from pathlib import Path

import pytest
from django.test import override_settings

from bumail_queue.models import DeliveryLog
from bumail_queue.service import QueueService
from bumail_queue.suppression import SuppressionReason
from bumail_queue.verp import read_return_path
from tests.helpers import ROOT, read_all, running_worker, start_command, wait_until
from tests.servers.postfix import postfix_server, unused_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOCS = ROOT / "docs" / "feedback.md"
TEMPLATE = "bounces+{token}@bounces.example.com"  # the bounce domain of the docs' lines
DOMAIN = "example.test"
KNOWN = f"known@{DOMAIN}"
UNKNOWN = [f"nobody{n}@{DOMAIN}" for n in range(1, 5)]
SENDER = "app@sender.test"
#: Each message's recipients: one to the known user, one with several of both kinds.
MESSAGES = {
    "Welcome": [KNOWN],
    "Hello one": [UNKNOWN[0]],
    "Team news": [KNOWN, UNKNOWN[1], UNKNOWN[2]],
    "Hello four": [UNKNOWN[3]],
}
#: Bounds for a busy machine: Postfix tries the deferred DSNs again within seconds.
DEADLINE = 180


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": "orm"}


def postfix_in_front(config_directory: Path, port: int) -> tuple[str, dict[str, str]]:
    """The ``main.cf`` lines and the transport table of the docs' *Postfix in front*,
    in ``config_directory`` rather than ``/etc/postfix``, to ``port`` rather than 2526."""
    section = re.split(r"\n##+ ", DOCS.read_text().split("\n### Postfix in front\n", 1)[1])[0]
    files = {}
    for block in re.findall(r"^```text\n(.*?)^```", section, flags=re.M | re.S):
        first, _, text = block.partition("\n")
        files[first.removeprefix("# ")] = text
    assert sorted(files) == ["/etc/postfix/main.cf", "/etc/postfix/transport"], files
    main_cf, transport = files["/etc/postfix/main.cf"], files["/etc/postfix/transport"]
    assert "hash:/etc/postfix/transport" in main_cf and "lmtp:inet:127.0.0.1:2526" in transport
    main_cf = main_cf.replace("/etc/postfix/", f"{config_directory}/")
    return main_cf, {"transport": transport.replace("127.0.0.1:2526", f"127.0.0.1:{port}")}


@contextlib.contextmanager
def running_inbound(settings, port):
    """``queue_inbound --listen 127.0.0.1:<port>`` (LMTP); SIGTERM at the end."""
    process = start_command(settings, "queue_inbound", "--listen", f"127.0.0.1:{port}")
    lines, reader = read_all(process)
    try:
        assert wait_until(lambda: any("listening on" in line for line in lines), 60), "".join(lines)
        yield lines
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, "".join(lines)
        reader.join(5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        reader.join(5)
        process.stdout.close()


def send(queue):
    """Queue ``MESSAGES``; return each recipient's (address, item id)."""
    sent = set()
    for subject, recipients in MESSAGES.items():
        message = f"From: {SENDER}\r\nTo: {', '.join(recipients)}\r\nSubject: {subject}\r\n\r\nHello.\r\n".encode()
        item = queue.enqueue(message, sender=SENDER, recipients=recipients)
        sent |= {(address, item.id) for address in recipients}
    return sent


def logged(status):
    """The delivery log's entries of ``status``, as (recipient, item id, enhanced status)."""
    entries = DeliveryLog.objects.filter(status=status)
    return {(e.recipient, str(e.item_id), e.reply_status) for e in entries}


def dsns_handed_over(log, port):
    """The return paths Postfix handed a DSN to, as ``queue_inbound`` accepted it."""
    sent = rf"postfix/lmtp\[\d+\]: \w+: to=<([^>]+)>, relay=127\.0\.0\.1\[127\.0\.0\.1\]:{port},.* status=sent \(250 2\.0\.0 Processed\)"
    return re.findall(sent, log)


def test_postfixs_own_dsns_come_back_through_queue_inbound_and_suppress_each_unknown_user(store_settings):
    inbound_port = unused_port()
    everyone = [KNOWN, *UNKNOWN]
    with postfix_server(DOMAIN, ["known"]) as postfix:
        main_cf, tables = postfix_in_front(postfix.config_directory, inbound_port)
        postfix.start(main_cf=main_cf, tables=tables)
        settings = {
            "HOSTNAME": "mta.example.com",
            "ROUTE": {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": postfix.port, "TLS": "none"},
            "RETURN_PATH": TEMPLATE,
            "POLL_SECONDS": 0.2,
            **store_settings,
        }
        with override_settings(BUMAIL_QUEUE=settings):
            queue = QueueService()
            sent = send(queue)
            bounces = {address: item_id for address, item_id in sent if address in UNKNOWN}

            # The worker: Postfix takes every recipient in the session.
            with running_worker(settings) as (_, lines):
                assert wait_until(lambda: len(logged("delivered")) == len(sent), DEADLINE), "".join(lines)
            assert {(r, i) for r, i, _ in logged("delivered")} == sent
            assert queue.count() == 0

            # Postfix bounced each unknown user, and keeps its DSN: nobody listens yet.
            def bounced_and_held():
                log = postfix.log()
                refused = f"connect to 127.0.0.1[127.0.0.1]:{inbound_port}: Connection refused"
                held = set(re.findall(r"postfix/\w+\[\d+\]: \w+: to=<(bounces\+[^>]+)>.*status=deferred", log))
                return (
                    all(f"to=<{a}>, relay=virtual," in log for a in UNKNOWN)
                    and len(held) == len(UNKNOWN)
                    and refused in log
                )

            assert wait_until(bounced_and_held, DEADLINE), postfix.log()
            assert queue.suppressed(everyone) == {}

            # queue_inbound starts, and Postfix's next queue run hands every DSN over.
            with running_inbound(settings, inbound_port) as printed:
                done = wait_until(lambda: set(queue.suppressed(everyone)) == set(UNKNOWN) and len(logged("bounced")) == len(UNKNOWN), DEADLINE)  # fmt: skip
                assert done, f"{postfix.log()}\n{''.join(printed)}"
                assert wait_until(lambda: len(dsns_handed_over(postfix.log(), inbound_port)) == len(UNKNOWN), DEADLINE)

            log = postfix.log()
            for address in UNKNOWN:
                assert re.search(rf"to=<{address}>, relay=virtual,.* dsn=5\.1\.1, status=bounced \(unknown user", log)
            assert re.search(rf"to=<{KNOWN}>, relay=virtual,.* dsn=2\.0\.0, status=sent \(delivered to maildir\)", log)

            # Each DSN came back to the return path of its own recipient and item.
            named = {}
            for return_path in dsns_handed_over(log, inbound_port):
                returned = read_return_path(TEMPLATE, return_path)
                assert returned is not None, return_path
                [recipient] = [address for address in everyone if returned.names(address)]
                named[recipient] = returned.item_id
            assert named == bounces

            # Suppressed: exactly the unknown users, bounced with Postfix's 5.1.1.
            found = queue.suppressed(everyone)
            assert {(a, e.reason, e.reply.status) for a, e in found.items()} == {
                (address, SuppressionReason.BOUNCED, "5.1.1") for address in UNKNOWN
            }
            assert logged("bounced") == {(address, item_id, "5.1.1") for address, item_id in bounces.items()}

            # The known user has both its messages, and stays off the list.
            subjects = sorted(
                re.search(rb"^Subject: (.*?)\r?$", m, flags=re.M)[1].decode() for m in postfix.mailbox("known")
            )
            assert subjects == ["Team news", "Welcome"]
