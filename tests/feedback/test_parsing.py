"""Returned messages read by ``feedback.parse_report``: the queue's own DSNs, a Postfix
DSN, an RFC 5965 complaint, bounces in older MTAs' own words, and junk."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bumail_queue.delivery.dsn import ReportedRecipient as Reported
from bumail_queue.delivery.dsn import build_dsn
from bumail_queue.feedback import ReportKind, Source, parse_report
from bumail_queue.items import QueueItem, Recipient, Reply

NOW = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
ORIGINAL = (
    b"From: app@example.com\r\nTo: bob@example.org\r\nSubject: hi\r\nMessage-ID: <m1@example.com>\r\n\r\nbody\r\n"
)


def crlf(text: str) -> bytes:
    return text.strip("\n").replace("\n", "\r\n").encode() + b"\r\n"


def queue_dsn(kind, *recipients):
    item = QueueItem(
        id="item-1",
        sender="app@example.com",
        recipients=[Recipient(address=r.address) for r in recipients],
        size=1,
        created_at=NOW,
        next_attempt_at=NOW,
    )
    return build_dsn(
        kind=kind,
        reporting_mta="mta.example.com",
        original=item,
        original_message=ORIGINAL,
        recipients=list(recipients),
        now=NOW,
        will_retry_until=NOW if kind == "delayed" else None,
    )


def reported(address, action, code, status, text):
    return Reported(
        address=address,
        action=action,
        reply=Reply(code=code, status=status, text=text),
        remote_mta="mx.example.org",
        last_attempt_at=NOW,
    )


def test_the_queues_own_failure_report_is_a_hard_bounce_of_each_failed_recipient():
    raw = queue_dsn(
        "failed",
        reported("Bob@Example.org", "failed", 550, "5.1.1", "User unknown"),
        reported("full@example.org", "failed", 452, "4.2.2", "Mailbox full"),
    )
    report = parse_report(raw)
    assert (report.kind, report.source) == (ReportKind.BOUNCE, Source.DSN)
    assert (report.reporting_mta, report.original_message_id) == ("mta.example.com", "<m1@example.com>")
    bob, full = report.recipients
    assert (bob.address, bob.action, bob.status, bob.is_hard) == (
        "Bob@example.org",
        "failed",
        "5.1.1",
        True,
    )  # the domain in its normal form
    assert bob.diagnostic == "550 User unknown"
    assert (full.is_hard, full.is_soft) == (False, True)  # failed, but with a 4.x.x status
    assert report.hard_bounces == (bob,)


def test_a_delay_report_bounces_nobody():
    report = parse_report(queue_dsn("delayed", reported("slow@example.org", "delayed", 451, "4.3.0", "Later")))
    assert report.kind == ReportKind.DELAY
    assert report.hard_bounces == ()
    assert [r.address for r in report.soft_bounces] == ["slow@example.org"]


POSTFIX_DSN = """
From: MAILER-DAEMON@mail.example.net (Mail Delivery System)
To: bounces@example.com
Subject: Undelivered Mail Returned to Sender
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status;
 boundary="6C1A2A04F3.1772355600/mail.example.net"

This is a MIME-encapsulated message.

--6C1A2A04F3.1772355600/mail.example.net
Content-Description: Notification
Content-Type: text/plain; charset=us-ascii

I'm sorry to have to inform you that your message could not
be delivered to one or more recipients.

<nobody@example.net>: host mx.example.net[192.0.2.25] said: 550 5.1.1
    <nobody@example.net>: Recipient address rejected: User unknown in local
    recipient table (in reply to RCPT TO command)

--6C1A2A04F3.1772355600/mail.example.net
Content-Description: Delivery report
Content-Type: message/delivery-status

Reporting-MTA: dns; mail.example.net
X-Postfix-Queue-ID: 6C1A2A04F3
X-Postfix-Sender: rfc822; bounces@example.com
Arrival-Date: Sun,  1 Mar 2026 09:00:00 +0000 (UTC)

Final-Recipient: rfc822; nobody@example.net
Original-Recipient: rfc822;nobody@example.net
Action: failed
Status: 5.1.1
Remote-MTA: dns; mx.example.net
Diagnostic-Code: smtp; 550 5.1.1 <nobody@example.net>: Recipient address
    rejected: User unknown in local recipient table

--6C1A2A04F3.1772355600/mail.example.net
Content-Description: Undelivered Message Headers
Content-Type: text/rfc822-headers

From: app@example.com
To: nobody@example.net
Subject: hi
Message-ID: <m2@example.com>

--6C1A2A04F3.1772355600/mail.example.net--
"""


def test_a_postfix_bounce_names_its_recipient_status_and_the_servers_words():
    report = parse_report(crlf(POSTFIX_DSN))
    assert (report.kind, report.source, report.reporting_mta) == (ReportKind.BOUNCE, Source.DSN, "mail.example.net")
    (nobody,) = report.recipients
    assert (nobody.address, nobody.status, nobody.is_hard) == ("nobody@example.net", "5.1.1", True)
    assert nobody.diagnostic == (
        "550 5.1.1 <nobody@example.net>: Recipient address rejected: User unknown in local recipient table"
    )
    assert report.original_message_id == "<m2@example.com>"


def test_a_success_report_asks_nothing():
    raw = crlf(POSTFIX_DSN.replace("Action: failed", "Action: delivered").replace("Status: 5.1.1", "Status: 2.0.0"))
    report = parse_report(raw)
    assert (report.kind, report.hard_bounces, report.soft_bounces) == (ReportKind.DELIVERED, (), ())


ARF = """
From: <abuse@fbl.example.net>
Date: Sun, 1 Mar 2026 10:00:00 +0000
Subject: FW: hi
To: <fbl@example.com>
MIME-Version: 1.0
Content-Type: multipart/report; report-type=feedback-report;
     boundary="part1_13d.2e68ed54_boundary"

--part1_13d.2e68ed54_boundary
Content-Type: text/plain; charset="US-ASCII"
Content-Transfer-Encoding: 7bit

This is an email abuse report for an email message received from IP
192.0.2.1 on Sun, 1 Mar 2026 09:00:00 +0000.

--part1_13d.2e68ed54_boundary
Content-Type: message/feedback-report

Feedback-Type: abuse
User-Agent: SomeGenerator/1.0
Version: 1
Original-Mail-From: <bounces@example.com>
Arrival-Date: Sun, 1 Mar 2026 09:00:00 +0000
Reporting-MTA: dns; mail.fbl.example.net
Source-IP: 192.0.2.1

--part1_13d.2e68ed54_boundary
Content-Type: message/rfc822
Content-Disposition: inline

From: <app@example.com>
To: Carol <Carol@Example.net>
Subject: hi
Message-ID: <m3@example.com>

body
--part1_13d.2e68ed54_boundary--
"""


def test_a_feedback_report_is_a_complaint_of_the_returned_messages_recipient():
    report = parse_report(crlf(ARF))
    assert (report.kind, report.source, report.feedback_type) == (ReportKind.COMPLAINT, Source.ARF, "abuse")
    assert [(r.address, r.action) for r in report.recipients] == [("Carol@example.net", "complained")]
    assert (report.original_message_id, report.reporting_mta) == ("<m3@example.com>", "mail.fbl.example.net")
    assert report.hard_bounces == ()  # a complaint is no bounce; what it calls for is the caller's


def test_a_feedback_reports_original_rcpt_to_wins_over_the_returned_to():
    raw = crlf(ARF.replace("Source-IP: 192.0.2.1", "Source-IP: 192.0.2.1\nOriginal-Rcpt-To: dave@example.net"))
    assert [r.address for r in parse_report(raw).recipients] == ["dave@example.net"]


QMAIL = """
From: MAILER-DAEMON@mail.example.net
To: bounces@example.com
Subject: failure notice

Hi. This is the qmail-send program at mail.example.net.
I'm afraid I wasn't able to deliver your message to the following addresses.
This is a permanent error; I've given up. Sorry it didn't work out.

<nobody@example.net>:
Sorry, no mailbox here by that name. (#5.1.1)

--- Below this line is a copy of the message.

Subject: hi
"""

EXIM = """
From: Mail Delivery System <Mailer-Daemon@mx.example.net>
To: bounces@example.com
Subject: Mail delivery failed: returning message to sender

This message was created automatically by mail delivery software.

A message that you sent could not be delivered to one or more of its
recipients. This is a permanent error. The following address(es) failed:

  gone@example.net
    SMTP error from remote mail server after RCPT TO:<gone@example.net>:
    550 5.1.1 User unknown

------ This is a copy of the message, including all the headers. ------

Subject: hi
"""


@pytest.mark.parametrize(("text", "address"), [(QMAIL, "nobody@example.net"), (EXIM, "gone@example.net")])
def test_older_mtas_bounces_are_read_by_flufl_bounce(text, address):
    report = parse_report(crlf(text))
    assert (report.kind, report.source) == (ReportKind.BOUNCE, Source.HEURISTIC)
    assert [(r.address, r.is_hard) for r in report.recipients] == [(address, True)]


@pytest.mark.parametrize(
    "raw",
    [
        b"Subject: hello\r\n\r\nJust some text\r\n",  # no From: one of flufl.bounce's detectors raises on it
        b"From: someone@example.org\r\nSubject: Out of office\r\n\r\nI am away until Monday.\r\n",
        crlf(
            POSTFIX_DSN.replace("Final-Recipient: rfc822; nobody@example.net\n", "").replace(
                "Original-Recipient: rfc822;nobody@example.net\n", ""
            )
        ),  # a report whose block names no recipient
        b"\xff\xfe garbage \x00\r\n",
    ],
)
def test_anything_else_is_unrecognised_never_an_error(raw):
    assert parse_report(raw).kind == ReportKind.UNRECOGNISED
