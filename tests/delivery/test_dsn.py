"""Delivery status notifications (RFC 3464), read back the way a mail program reads them."""

from __future__ import annotations

import email
import email.message
import email.policy
import email.utils
from datetime import UTC, datetime, timedelta

import pytest

from bumail_queue.delivery.dsn import DSNKind, ReportedRecipient, build_dsn, header_block
from bumail_queue.items import QueueItem, Recipient, Reply

MTA = "mta.example.net"
CREATED = datetime(2024, 3, 5, 6, 7, 8, tzinfo=UTC)
ATTEMPT = CREATED + timedelta(hours=2)
NOW = CREATED + timedelta(hours=2, minutes=1)
UNTIL = CREATED + timedelta(days=5)
ORIGINAL = (
    b"From: Alice <alice@example.com>\r\n"
    b"To: bob@example.org, carol@nowhere.example\r\n"
    b"Subject: Quarterly numbers\r\n"
    b"Message-ID: <q1@example.com>\r\n"
    b"\r\n"
    b"The secret body, never returned.\r\n"
)


def make_item(*, sender: str = "alice@example.com", addresses: tuple[str, ...] = ("bob@example.org",)) -> QueueItem:
    return QueueItem(
        id="item-0001",
        sender=sender,
        recipients=[Recipient(address=a) for a in addresses],
        size=len(ORIGINAL),
        created_at=CREATED,
        next_attempt_at=CREATED,
    )


def rejected(
    address: str = "bob@example.org", *, text: str = "User unknown", action: DSNKind = "failed"
) -> ReportedRecipient:
    code, status = (550, "5.1.1") if action == "failed" else (451, "4.3.0")
    return ReportedRecipient(
        address=address,
        action=action,
        # As the SMTP client keeps a reply: the text as sent, its enhanced status code first.
        reply=Reply(code=code, status=status, text=f"{status} {text}"),
        remote_mta="mx1.example.org",
        last_attempt_at=ATTEMPT,
    )


def unresolved(address: str = "carol@nowhere.example") -> ReportedRecipient:
    return ReportedRecipient(
        address=address,
        action="failed",
        reply=Reply(code=None, status="5.1.2", text="Host not found: nowhere.example has no MX or address record"),
        remote_mta=None,
        last_attempt_at=ATTEMPT,
    )


def build(
    recipients: list[ReportedRecipient],
    *,
    kind: DSNKind = "failed",
    item: QueueItem | None = None,
    message: bytes | None = ORIGINAL,
    will_retry_until: datetime | None = None,
) -> bytes:
    return build_dsn(
        kind=kind,
        reporting_mta=MTA,
        original=item or make_item(),
        original_message=message,
        recipients=recipients,
        now=NOW,
        will_retry_until=will_retry_until,
    )


def parse(data: bytes) -> email.message.EmailMessage:
    report = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(report, email.message.EmailMessage)
    return report


def parts(report: email.message.EmailMessage) -> list[email.message.EmailMessage]:
    return [part for part in report.iter_parts() if isinstance(part, email.message.EmailMessage)]


def status_blocks(report: email.message.EmailMessage) -> list[dict[str, str]]:
    """Return the delivery-status part's blocks: the per-message one, then one per recipient."""
    part = parts(report)[1]
    assert part.get_content_type() == "message/delivery-status"
    return [{name: str(value) for name, value in block.items()} for block in part.get_payload()]


def text_of(report: email.message.EmailMessage) -> str:
    part = parts(report)[0]
    assert part.get_content_type() == "text/plain"
    return part.get_content()


def lines_of(data: bytes) -> list[bytes]:
    assert data.endswith(b"\r\n")
    return data[:-2].split(b"\r\n")


class TestFailed:
    def test_headers_of_the_report(self):
        report = parse(
            build([rejected(), unresolved()], item=make_item(addresses=("bob@example.org", "carol@nowhere.example")))
        )

        assert report["From"].addresses[0].addr_spec == f"MAILER-DAEMON@{MTA}"
        assert report["From"].addresses[0].display_name == "Mail Delivery System"
        assert str(report["To"]) == "alice@example.com"
        assert str(report["Subject"]) == "Undelivered Mail Returned to Sender"
        assert report["Date"].datetime == NOW
        assert str(report["Message-ID"]).endswith(f"@{MTA}>")
        assert str(report["Auto-Submitted"]) == "auto-replied"
        assert str(report["MIME-Version"]) == "1.0"
        assert report.get_content_type() == "multipart/report"
        assert report.get_param("report-type") == "delivery-status"
        assert [p.get_content_type() for p in parts(report)] == [
            "text/plain",
            "message/delivery-status",
            "text/rfc822-headers",
        ]

    def test_delivery_status_fields(self):
        report = parse(build([rejected(), unresolved()]))
        per_message, bob, carol = status_blocks(report)

        assert per_message["Reporting-MTA"] == f"dns; {MTA}"
        assert per_message["X-Queue-ID"] == "item-0001"
        assert email.utils.parsedate_to_datetime(per_message["Arrival-Date"]) == CREATED

        assert bob == {
            "Final-Recipient": "rfc822; bob@example.org",
            "Action": "failed",
            "Status": "5.1.1",
            "Remote-MTA": "dns; mx1.example.org",
            "Diagnostic-Code": "smtp; 550 5.1.1 User unknown",
            "Last-Attempt-Date": email.utils.format_datetime(ATTEMPT),
        }
        assert email.utils.parsedate_to_datetime(bob["Last-Attempt-Date"]) == ATTEMPT

        # No server answered: no Remote-MTA and no Diagnostic-Code, the status says why.
        assert carol == {
            "Final-Recipient": "rfc822; carol@nowhere.example",
            "Action": "failed",
            "Status": "5.1.2",
            "Last-Attempt-Date": email.utils.format_datetime(ATTEMPT),
        }

    def test_no_will_retry_until_when_failed(self):
        data = build([rejected()], will_retry_until=UNTIL)
        assert b"Will-Retry-Until" not in data

    def test_text_for_a_person(self):
        text = text_of(parse(build([rejected(), unresolved()])))

        assert f"mail system at {MTA}" in text
        assert "could not be delivered" in text
        assert "<bob@example.org>: failed" in text
        assert "mx1.example.org replied: 550 5.1.1 User unknown" in text
        assert "<carol@nowhere.example>: failed" in text
        assert "No server answered (status 5.1.2): Host not found" in text
        assert "header of your message" in text

    def test_a_reply_without_an_enhanced_code_is_written_as_the_server_sent_it(self):
        # RFC 3464 §2.3.6: the status made up for it (5.0.0) goes in Status alone.
        plain = ReportedRecipient(
            address="bob@example.org",
            action="failed",
            reply=Reply(code=550, status="5.0.0", text="<bob@example.org>: Recipient address rejected"),
            remote_mta="mx1.example.org",
            last_attempt_at=ATTEMPT,
        )
        report = parse(build([plain]))
        bob = status_blocks(report)[1]
        assert bob["Status"] == "5.0.0"
        assert bob["Diagnostic-Code"] == "smtp; 550 <bob@example.org>: Recipient address rejected"
        assert "replied: 550 <bob@example.org>: Recipient address rejected" in " ".join(text_of(report).split())

    def test_a_status_of_ours_goes_in_status_and_the_reply_stays_the_servers(self):
        expired = ReportedRecipient(
            address="bob@example.org",
            action="failed",
            reply=Reply(code=451, status="4.3.0", text="4.3.0 Mailbox busy"),
            remote_mta="mx1.example.org",
            last_attempt_at=ATTEMPT,
            status="4.4.7",
            reason="Delivery time expired after 5 days",
        )
        report = parse(build([expired]))
        bob = status_blocks(report)[1]
        assert (bob["Action"], bob["Status"]) == ("failed", "4.4.7")
        assert bob["Diagnostic-Code"] == "smtp; 451 4.3.0 Mailbox busy"
        assert (
            "Delivery time expired after 5 days. The server mx1.example.org replied: 451 4.3.0 Mailbox busy"
            in " ".join(text_of(report).split())
        )

    def test_a_recipient_given_up_without_an_attempt_is_said_not_sent(self):
        # A suppressed address: no server was asked, so no Remote-MTA, Diagnostic-Code or
        # Last-Attempt-Date; the status is ours and the text says why.
        suppressed = ReportedRecipient(
            address="bob@example.org",
            action="failed",
            reply=Reply(
                code=None,
                status="5.7.1",
                text="Recipient address suppressed until 2024-04-04 06:07 UTC: an earlier delivery failed "
                "with 550 5.1.1 User unknown",
            ),
            remote_mta=None,
            last_attempt_at=ATTEMPT,
            attempted=False,
        )
        report = parse(build([suppressed]))
        bob = status_blocks(report)[1]
        assert bob == {"Final-Recipient": "rfc822; bob@example.org", "Action": "failed", "Status": "5.7.1"}
        text = " ".join(text_of(report).split())
        assert (
            "<bob@example.org>: failed Not sent (status 5.7.1): Recipient address suppressed until "
            "2024-04-04 06:07 UTC: an earlier delivery failed with 550 5.1.1 User unknown" in text
        )
        assert "Last attempt" not in text


class TestDelayed:
    def test_delayed_report(self):
        report = parse(
            build([rejected(action="delayed", text="Greylisted, try later")], kind="delayed", will_retry_until=UNTIL)
        )

        assert str(report["Subject"]) == "Delayed Mail (still being retried)"
        assert str(report["Auto-Submitted"]) == "auto-replied"
        _, bob = status_blocks(report)
        assert bob["Action"] == "delayed"
        assert bob["Status"] == "4.3.0"
        assert bob["Diagnostic-Code"] == "smtp; 451 4.3.0 Greylisted, try later"
        assert email.utils.parsedate_to_datetime(bob["Will-Retry-Until"]) == UNTIL

        text = " ".join(text_of(report).split())
        assert "has not been delivered to the recipients below yet" in text
        assert f"keep trying until {email.utils.format_datetime(UNTIL)}" in text
        assert "<bob@example.org>: delayed" in text


class TestAddresses:
    def test_utf8_recipient_is_written_as_rfc6533_utf8_type(self):
        address = "jörg+tag=x\\y@bücher.example"
        data = build([rejected(address), rejected("😀@example.org")])
        report = parse(data)
        _, jorg, smiley = status_blocks(report)

        assert jorg["Final-Recipient"] == "utf-8; j\\x{F6}rg\\x{2B}tag\\x{3D}x\\x{5C}y@b\\x{FC}cher.example"
        assert smiley["Final-Recipient"] == "utf-8; \\x{1F600}@example.org"
        # The machine-read part stays ASCII, the person reads the address as it is.
        assert parts(report)[1].as_bytes().isascii()
        assert f"<{address}>: failed" in text_of(report)

    def test_ascii_recipient_keeps_rfc822_type_unescaped(self):
        _, bob = status_blocks(parse(build([rejected("bob+news=1@example.org")])))
        assert bob["Final-Recipient"] == "rfc822; bob+news=1@example.org"

    def test_utf8_sender_gets_the_report(self):
        data = build([rejected()], item=make_item(sender="jörg@bücher.example"))
        assert b"\r\nTo: j\xc3\xb6rg@b\xc3\xbccher.example\r\n" in data
        assert str(parse(data)["To"]) == "jörg@bücher.example"

    @pytest.mark.parametrize("sender", ["", "<>"])
    def test_null_sender_is_refused(self, sender: str):
        with pytest.raises(ValueError, match="null sender"):
            build([rejected()], item=make_item(sender=sender))

    def test_no_recipient_is_refused(self):
        with pytest.raises(ValueError, match="at least one recipient"):
            build([])


class TestOriginal:
    def test_header_block_is_returned_without_the_body(self):
        data = build([rejected()])
        headers = parts(parse(data))[2]

        assert headers.get_content_type() == "text/rfc822-headers"
        returned = headers.get_content()
        assert returned.splitlines() == [
            "From: Alice <alice@example.com>",
            "To: bob@example.org, carol@nowhere.example",
            "Subject: Quarterly numbers",
            "Message-ID: <q1@example.com>",
        ]
        assert b"secret body" not in data

    def test_header_block_of_a_message_with_lf_line_ends(self):
        data = build([rejected()], message=ORIGINAL.replace(b"\r\n", b"\n"))
        assert parts(parse(data))[2].get_content().splitlines()[-1] == "Message-ID: <q1@example.com>"
        assert b"secret body" not in data

    def test_utf8_header_fields_are_returned_quoted_printable(self):
        message = "From: jörg@bücher.example\r\nSubject: Grüße\r\n\r\nbody\r\n".encode()
        data = build([rejected()], message=message)
        headers = parts(parse(data))[2]

        assert headers["Content-Transfer-Encoding"] == "quoted-printable"
        assert headers.get_content().splitlines() == ["From: jörg@bücher.example", "Subject: Grüße"]
        assert data.isascii()

    def test_lost_message_has_two_parts_and_says_so(self):
        report = parse(build([unresolved()], message=None))

        assert [p.get_content_type() for p in parts(report)] == ["text/plain", "message/delivery-status"]
        text = " ".join(text_of(report).split())
        assert "could not read your message" in text
        assert "not attached" in text
        assert "header of your message" not in text
        assert len(status_blocks(report)) == 2

    def test_a_long_header_block_is_cut_after_its_last_whole_field(self):
        fields = [f"X-Trace-{n}: {'t' * 60}\r\n {'u' * 60}".encode() for n in range(1000)]
        message = b"Subject: Hi\r\n" + b"\r\n".join(fields) + b"\r\n\r\nbody\r\n"
        kept = header_block(message, limit=1000)

        assert len(kept) <= 1000
        assert kept.startswith(b"Subject: Hi\r\nX-Trace-0: ")
        assert kept.endswith(b"u" * 60)  # a whole field, its folded line included
        returned = parts(parse(build([rejected()], message=message)))[2].get_content()
        assert 40_000 < len(returned) <= 50_000
        assert email.message_from_string(returned + "\n")["Subject"] == "Hi"

    @pytest.mark.parametrize("message", [b"", b"\r\nonly a body\r\n"])
    def test_a_message_without_header_fields_has_no_third_part(self, message: bytes):
        data = build([rejected()], message=message)
        report = parse(data)

        assert [p.get_content_type() for p in parts(report)] == ["text/plain", "message/delivery-status"]
        assert "header of your message" not in text_of(report)
        assert "could not read" not in text_of(report)
        assert b"only a body" not in data


class TestFolding:
    def test_long_reply_is_folded_and_lines_stay_short(self):
        reply = "Message rejected: " + " ".join(f"reason{i}" for i in range(400))
        data = build([rejected(text=reply)])
        _, bob = status_blocks(parse(data))

        assert bob["Diagnostic-Code"] == f"smtp; 550 5.1.1 {reply}"
        field = data[data.index(b"Diagnostic-Code:") :].split(b"\r\nLast-Attempt-Date:")[0]
        folded = field.split(b"\r\n")
        assert len(folded) > 30
        assert all(len(line) <= 78 for line in folded)
        assert all(line.startswith(b" ") for line in folded[1:])

    def test_every_line_fits_and_ends_in_crlf(self):
        huge_word = "x" * 3000  # no whitespace to fold at
        data = build([rejected(text=f"see {huge_word} and " + "more " * 500), rejected("😀" * 60 + "@example.org")])

        assert b"\n" not in data.replace(b"\r\n", b"")
        assert b"\r" not in data.replace(b"\r\n", b"")
        assert all(len(line) <= 998 for line in lines_of(data))
        _, bob, _ = status_blocks(parse(data))
        # The word is cut into pieces only because it is longer than a line may be.
        assert bob["Diagnostic-Code"].replace(" ", "").startswith("smtp;5505.1.1see" + huge_word + "and")

    def test_a_word_longer_than_78_but_under_998_stays_whole(self):
        url = "https://help.example.org/" + "a" * 120
        data = build([rejected(text=f"Blocked, see {url}")])
        _, bob = status_blocks(parse(data))
        assert bob["Diagnostic-Code"] == f"smtp; 550 5.1.1 Blocked, see {url}"
        assert f"\r\n {url}\r\n".encode() in data

    def test_cr_and_lf_in_a_reply_do_not_make_fields(self):
        data = build([rejected(text="User unknown\r\nX-Injected: yes\nAction: delivered\r\n\r\nmore")])
        _, bob = status_blocks(parse(data))

        assert "X-Injected" not in bob
        assert bob["Action"] == "failed"
        assert bob["Diagnostic-Code"] == "smtp; 550 5.1.1 User unknown X-Injected: yes Action: delivered more"

    def test_non_ascii_reply_is_escaped_in_the_field_and_kept_in_the_text(self):
        report = parse(build([rejected(text="Benutzer unbekannt: Größe")]))
        _, bob = status_blocks(report)

        assert bob["Diagnostic-Code"] == "smtp; 550 5.1.1 Benutzer unbekannt: Gr\\x{F6}\\x{DF}e"
        assert "Benutzer unbekannt: Größe" in text_of(report)
