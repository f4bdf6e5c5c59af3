"""``manage.py queue_inbound --imap URL`` / ``--pop3 URL`` against a real Dovecot on
loopback: DSNs of several MTAs, a complaint and junk, each processed once and the
mailbox left as the docs say; a process killed between fetching and removing (or while
processing) processes nothing twice and deletes nothing unprocessed. On the ORM store and
Redis."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from bumail_queue.conf import validate
from bumail_queue.models import DeliveryLog, MailboxMessage, ReturnedMail
from bumail_queue.service import QueueService
from bumail_queue.suppression import SuppressionReason
from bumail_queue.verp import return_path
from tests.feedback.mailbox_crash import CRASHED
from tests.feedback.test_parsing import ARF, EXIM, POSTFIX_DSN, QMAIL, crlf, queue_dsn, reported
from tests.helpers import ROOT, printed, read_all, signals_told, start_command, wait_until, worker_env
from tests.servers.dovecot import PASSWORD

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TEMPLATE = "bounces+{token}@example.com"
JUNK = b"From: someone@example.org\r\nSubject: Out of office\r\n\r\nI am away until Monday.\r\n"


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": "orm"}


def queue_settings(server, url, store_settings, **entry):
    return {
        "HOSTNAME": "mta.example.com",
        "RETURN_PATH": TEMPLATE,
        "INBOUND_MAILBOXES": {url: {"PASSWORD": PASSWORD, "CA_FILE": server.ca_file, **entry}},
        **store_settings,
    }


def delivered(to, raw):
    """``raw`` as the mailbox holds it: the delivering server adds ``Delivered-To``."""
    return f"Delivered-To: {to}\r\n".encode() + raw


def postfix_dsn(recipient, status="5.1.1"):
    return crlf(POSTFIX_DSN.replace("nobody@example.net", recipient).replace("Status: 5.1.1", f"Status: {status}"))


def fetch(option, url, settings):
    """One pass of the command in this process; return what it printed."""
    out = io.StringIO()
    with override_settings(BUMAIL_QUEUE=settings):
        call_command("queue_inbound", option, url, stdout=out)
    return out.getvalue().strip()


def crashing(where, option, url, settings):
    """The command in a process of its own that dies at ``where``; return its exit status."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.feedback.mailbox_crash", where, option, url],
        cwd=ROOT, env=worker_env(settings), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == CRASHED, done.stdout + done.stderr
    return done.returncode


def suppressed(settings, *addresses):
    with override_settings(BUMAIL_QUEUE=settings):
        return {a: e.reason for a, e in QueueService().suppressed(list(addresses)).items()}


def bounced_entries():
    return list(DeliveryLog.objects.filter(status=DeliveryLog.Status.BOUNCED).values_list("recipient", flat=True))


def mailbox_of_several_mtas():
    """The returned mail of several MTAs, a complaint and junk; and the VERP item of Postfix's."""
    item_id = str(uuid.uuid4())
    own = queue_dsn("failed", reported("own@example.net", "failed", 550, "5.1.1", "User unknown"))
    return item_id, [
        delivered(return_path(TEMPLATE, item_id, "nobody@example.net"), postfix_dsn("nobody@example.net")),
        delivered("bounces@example.com", own),
        delivered("bounces@example.com", crlf(QMAIL.replace("nobody@", "left@"))),
        delivered("bounces@example.com", crlf(EXIM)),
        delivered("fbl@example.com", crlf(ARF)),
        delivered("bounces@example.com", JUNK),
        delivered("bounces@example.com", postfix_dsn("full@example.net", status="4.4.7")),
    ]


def test_an_imap_pass_acts_on_each_report_once_keeps_junk_and_empties_the_mailbox(dovecot_server, store_settings):
    url = dovecot_server.url("imaps", "INBOX")
    settings = queue_settings(dovecot_server, url, store_settings)
    item_id, messages = mailbox_of_several_mtas()
    dovecot_server.append(*messages)

    with signals_told("bounced", "complained") as told:
        printed = fetch("--imap", url, settings)
    assert printed == f"{url}: 6 processed, 1 kept, 0 skipped, 0 interrupted, 0 left"
    addresses = ("nobody@example.net", "own@example.net", "left@example.net", "gone@example.net")
    assert suppressed(settings, *addresses, "Carol@example.net", "full@example.net") == {
        "nobody@example.net": SuppressionReason.BOUNCED,  # Postfix, attributed by its VERP address
        "own@example.net": SuppressionReason.BOUNCED,  # this queue's own DSN
        "left@example.net": SuppressionReason.BOUNCED,  # qmail's words, through flufl.bounce
        "gone@example.net": SuppressionReason.BOUNCED,  # Exim's
        "Carol@example.net": SuppressionReason.COMPLAINED,  # the feedback loop's report
    }  # a first soft bounce (full@) is only noted
    assert sorted((name, kwargs["recipient"]) for name, kwargs in told) == sorted(
        [*(("bounced", a) for a in addresses), ("complained", "Carol@example.net")]
    )
    assert [k["item_id"] for _, k in told if k["recipient"] == "nobody@example.net"] == [item_id]
    assert bounced_entries() == ["nobody@example.net"]  # the one item the mailbox named
    kept = ReturnedMail.objects.get()
    assert (kept.subject, kept.recipients, bytes(kept.message)) == ("Out of office", "bounces@example.com", messages[5])
    assert kept.note == f"Fetched from {url}."
    assert dovecot_server.messages() == []
    assert not MailboxMessage.objects.exists()  # nothing is in flight any more

    dovecot_server.append(delivered("bounces@example.com", postfix_dsn("full@example.net", status="4.4.7")))
    assert fetch("--imap", url, settings) == f"{url}: 1 processed, 0 kept, 0 skipped, 0 interrupted, 0 left"
    assert suppressed(settings, "full@example.net") == {"full@example.net": SuppressionReason.EXPIRED}
    assert fetch("--imap", url, settings) == f"{url}: 0 processed, 0 kept, 0 skipped, 0 interrupted, 0 left"


def test_with_after_move_every_message_goes_to_the_folder_over_starttls(dovecot_server, store_settings):
    url = dovecot_server.url("imap")  # IMAP with STARTTLS; no folder: INBOX
    settings = queue_settings(dovecot_server, url, store_settings, AFTER="move", MOVE_TO="Processed")
    messages = [delivered("bounces@example.com", postfix_dsn("gone@example.net")), JUNK]
    dovecot_server.append(*messages)
    assert fetch("--imap", url, settings) == f"{url}: 1 processed, 1 kept, 0 skipped, 0 interrupted, 0 left"
    assert dovecot_server.messages() == []
    assert dovecot_server.messages("Processed") == messages
    assert suppressed(settings, "gone@example.net") == {"gone@example.net": SuppressionReason.BOUNCED}


def test_a_crash_between_processing_and_removal_processes_nothing_twice(dovecot_server, store_settings):
    url = dovecot_server.url("imaps", "INBOX")
    settings = queue_settings(dovecot_server, url, store_settings)
    soft = delivered("bounces@example.com", postfix_dsn("full@example.net", status="4.4.7"))
    hard = delivered("bounces@example.com", postfix_dsn("gone@example.net"))
    dovecot_server.append(soft, hard)

    crashing("before-remove", "--imap", url, settings)  # the soft bounce is processed; then the process dies
    assert dovecot_server.messages() == [soft, hard]  # nothing removed
    assert suppressed(settings, "full@example.net", "gone@example.net") == {}

    assert fetch("--imap", url, settings) == f"{url}: 1 processed, 0 kept, 1 skipped, 0 interrupted, 0 left"
    # A soft bounce counted twice would have suppressed full@ (two within the window).
    assert suppressed(settings, "full@example.net", "gone@example.net") == {
        "gone@example.net": SuppressionReason.BOUNCED
    }
    assert dovecot_server.messages() == []
    assert not MailboxMessage.objects.exists()


def test_a_crash_while_processing_keeps_the_message_for_a_person_and_acts_on_it_once(dovecot_server, store_settings):
    url = dovecot_server.url("imaps", "INBOX")
    settings = queue_settings(dovecot_server, url, store_settings)
    to = return_path(TEMPLATE, str(uuid.uuid4()), "gone@example.net")
    hard = delivered(to, postfix_dsn("gone@example.net"))
    dovecot_server.append(hard)

    crashing("while-processing", "--imap", url, settings)  # suppressed and logged; then the process dies
    assert dovecot_server.messages() == [hard]
    assert bounced_entries() == ["gone@example.net"]

    with signals_told("bounced") as told:
        printed = fetch("--imap", url, settings)
    assert printed == f"{url}: 0 processed, 0 kept, 0 skipped, 1 interrupted, 0 left"
    assert (told, bounced_entries()) == ([], ["gone@example.net"])  # not told, nor logged, twice
    assert suppressed(settings, "gone@example.net") == {"gone@example.net": SuppressionReason.BOUNCED}
    kept = ReturnedMail.objects.get()
    assert bytes(kept.message) == hard and kept.recipients == to
    assert "ended while processing this message" in kept.note and url in kept.note
    assert dovecot_server.messages() == []


@pytest.mark.parametrize("scheme", ["pop3s", "pop3"])
def test_a_pop3_pass_acts_once_and_deletes_at_quit_even_across_a_crash(dovecot_server, store_settings, scheme):
    url = dovecot_server.url(scheme)
    settings = queue_settings(dovecot_server, url, store_settings)
    soft = delivered("bounces@example.com", postfix_dsn("full@example.net", status="4.4.7"))
    complaint = delivered("fbl@example.com", crlf(ARF))
    dovecot_server.append(soft, complaint, JUNK)

    crashing("before-quit", "--pop3", url, settings)  # all processed and DELEted; no QUIT
    assert dovecot_server.messages() == [soft, complaint, JUNK]  # POP3 deletes only at QUIT
    assert MailboxMessage.objects.filter(state="done").count() == 3

    with signals_told("complained") as told:
        printed = fetch("--pop3", url, settings)
    assert printed == f"{url}: 0 processed, 0 kept, 3 skipped, 0 interrupted, 0 left"
    assert told == []
    assert suppressed(settings, "full@example.net", "Carol@example.net") == {
        "Carol@example.net": SuppressionReason.COMPLAINED
    }
    assert ReturnedMail.objects.count() == 1  # the junk, kept once
    assert dovecot_server.messages() == []
    assert not MailboxMessage.objects.exists()

    dovecot_server.append(soft.replace(b"Delivered-To", b"X-Original-To"), JUNK)  # another copy of each, later
    assert fetch("--pop3", url, settings) == f"{url}: 1 processed, 1 kept, 0 skipped, 0 interrupted, 0 left"
    assert suppressed(settings, "full@example.net") == {"full@example.net": SuppressionReason.EXPIRED}


def test_with_every_a_pass_is_made_again_until_sigterm(dovecot_server):
    url = dovecot_server.url("imaps", "INBOX")
    settings = queue_settings(dovecot_server, url, {"STORE": "orm"})
    process = start_command(settings, "queue_inbound", "--imap", url, "--every", "1")
    lines, reader = read_all(process)
    try:
        assert wait_until(printed(lines, f"{url}: 0 processed"), 60), "".join(lines)
        dovecot_server.append(delivered("bounces@example.com", postfix_dsn("gone@example.net")))
        assert wait_until(printed(lines, f"{url}: 1 processed"), 60), "".join(lines)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(5)
    assert dovecot_server.messages() == []
    assert suppressed(settings, "gone@example.net") == {"gone@example.net": SuppressionReason.BOUNCED}


# -- failures: clear, and never with the password ---------------------------------------------


def failure(option, url, settings):
    with pytest.raises(CommandError) as raised:
        fetch(option, url, settings)
    assert PASSWORD not in str(raised.value)
    return str(raised.value)


def test_a_wrong_password_a_certificate_not_trusted_or_a_server_down_is_a_clear_error(dovecot_server):
    url = dovecot_server.url("imaps", "INBOX")
    wrong = {"INBOUND_MAILBOXES": {url: {"PASSWORD": "not-" + PASSWORD, "CA_FILE": dovecot_server.ca_file}}}
    assert "the server refused: [AUTHENTICATIONFAILED]" in failure("--imap", url, wrong)
    untrusted = {"INBOUND_MAILBOXES": {url: {"PASSWORD": PASSWORD}}}  # the system's CAs know not the test's
    assert "TLS failed: its certificate was not verified" in failure("--imap", url, untrusted)
    pop3 = dovecot_server.url("pop3s")
    assert "TLS failed" in failure("--pop3", pop3, {"INBOUND_MAILBOXES": {pop3: {"PASSWORD": PASSWORD}}})
    dovecot_server.stop()
    good = {"INBOUND_MAILBOXES": {url: {"PASSWORD": PASSWORD, "CA_FILE": dovecot_server.ca_file}}}
    assert f"{url}: 127.0.0.1 port {dovecot_server.imaps_port} could not be reached" in failure("--imap", url, good)


def test_the_command_refuses_a_url_with_a_password_or_one_not_in_the_settings():
    settings = {"INBOUND_MAILBOXES": {"imaps://bounces@mail.example.com/INBOX": {"PASSWORD": PASSWORD}}}
    message = failure("--imap", f"imaps://bounces:{PASSWORD}@mail.example.com/INBOX", settings)
    assert "holds a password" in message
    assert "is not a key of BUMAIL_QUEUE['INBOUND_MAILBOXES']" in failure(
        "--imap", "imaps://other@mail.example.com/INBOX", settings
    )
    assert "--pop3 takes a URL starting pop3s:// or pop3://" in failure(
        "--pop3", "imaps://bounces@mail.example.com/INBOX", settings
    )
    with pytest.raises(CommandError, match="--every goes with --imap or --pop3"):
        call_command("queue_inbound", "--listen", "127.0.0.1:0", "--every", "5")


@pytest.mark.parametrize(
    ("mailboxes", "says"),
    [
        ({f"imaps://bounces:{PASSWORD}@mail.example.com/INBOX": {"PASSWORD": "x"}}, "holds a password"),
        ({"imap://mail.example.com/INBOX": {"PASSWORD": "x"}}, "must name a user and a host"),
        ({"http://bounces@mail.example.com": {"PASSWORD": "x"}}, "its scheme must be one of"),
        ({"pop3s://bounces@mail.example.com/INBOX": {"PASSWORD": "x"}}, "a POP3 URL names no folder"),
        ({"imaps://bounces@mail.example.com": {}}, "['PASSWORD'] must be a non-empty string"),
        ({"imaps://bounces@mail.example.com": {"PASSWORD": "x", "AFTER": "keep"}}, "must be 'delete' or 'move'"),
        ({"imaps://bounces@mail.example.com": {"PASSWORD": "x", "AFTER": "move"}}, "['MOVE_TO'] must name"),
        ({"pop3s://bounces@mail.example.com": {"PASSWORD": "x", "AFTER": "move"}}, "POP3 has no folders"),
        ({"imaps://bounces@mail.example.com": {"PASSWORD": "x", "CERT": "y"}}, "unknown keys 'CERT'"),
        (["imaps://bounces@mail.example.com"], "must be a dict of mailbox URL"),
    ],
)
def test_inbound_mailboxes_are_checked_and_no_message_repeats_a_password(mailboxes, says):
    [problem] = validate({"INBOUND_MAILBOXES": mailboxes})
    assert problem.id == "bumail_queue.E033" and says in problem.message
    assert PASSWORD not in problem.message
