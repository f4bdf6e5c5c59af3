"""One person's data: ``queue_export`` and ``queue_forget`` on every store.

Mail to and from the address is queued and delivered through an SMTP server on
loopback, the address is suppressed in two scopes, and the archive, returned mail and
the bulk actions' audit name it; after ``queue_forget``, no table of the database and
no key of the Redis store holds it, yet mail to it is still suppressed.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.crypto import salted_hmac

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import Reply
from bumail_queue.models import ArchivedMessage, BulkAction, DeliveryLog, Item, ReturnedMail
from bumail_queue.service import QueueService
from bumail_queue.stores import get_store
from bumail_queue.suppression import (
    FORGOTTEN_LABEL,
    Suppression,
    SuppressionChange,
    SuppressionReason,
    channel_scope,
    forgotten_key,
)

pytestmark = pytest.mark.django_db(transaction=True)

# The commands run on the global service, whose clock is the real one: the test's starts
# at the real time, so that what it suppresses is still in force when they run.
T0 = datetime.now(UTC).replace(microsecond=0)
ANN = "ann@mail.example"
BOB = "bob@mail.example"
CARL = "carl@other.example"
SENDER = "app@sender.test"
NEWS = channel_scope("news")


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


@pytest.fixture
def server(smtp_servers):
    return smtp_servers()


@pytest.fixture
def queue(server, store_settings):
    route = {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": server.port, "TLS": "none"}
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "ROUTE": route, **store_settings}):
        yield QueueService(clock=Clock())


def message(sender: str, *recipients: str, subject: str = "Hello") -> bytes:
    return f"From: {sender}\r\nTo: {', '.join(recipients)}\r\nSubject: {subject}\r\n\r\nHi.\r\n".encode()


def send(queue: QueueService, sender: str, *recipients: str, subject: str = "Hello", **options: Any):
    return queue.enqueue(message(sender, *recipients, subject=subject), sender=sender, recipients=recipients, **options)


def rcpts(server) -> list[str]:
    return [c.arg.partition(":")[2].strip().split()[0].strip("<>") for c in server.commands if c.verb == "RCPT"]


def populate(queue: QueueService, server) -> dict[str, Any]:
    """Everything the address is in, and mail of others that must stay."""
    delivered = send(queue, SENDER, ANN, BOB, subject="Delivered")
    queue.deliver_due(now=T0)
    assert rcpts(server) == [ANN, BOB]
    later = T0 + timedelta(days=1)
    queued = [
        send(queue, SENDER, ANN, at=later),
        send(queue, SENDER, ANN, CARL, subject="Both", at=later),
        send(queue, ANN, CARL, subject="From Ann", at=later),
        send(queue, SENDER, "ann@MAIL.Example", subject="Domain in capitals", at=later),
        # A DSN names the failed recipient in its body alone.
        queue.enqueue(
            b"From: MAILER-DAEMON@mta.example.com\r\nTo: app@sender.test\r\nSubject: Undelivered\r\n\r\n"
            b"Final-Recipient: rfc822; ann@mail.example\r\nAction: failed\r\n",
            sender="",
            recipients=[SENDER],
            at=later,
        ),
    ]
    kept = send(queue, SENDER, CARL, subject="Not Ann's", at=later)
    queue.suppress(ANN, note=f"{ANN} asked us to stop", scope="")
    queue.suppress(ANN, scope=NEWS)
    # An entry past its time, never looked up again, but holding the address until a purge.
    old = Suppression(
        address=ANN,
        reason=SuppressionReason.FAILED,
        reply=Reply(code=550, status="5.1.1", text=f"<{ANN}> unknown"),
        created_at=T0 - timedelta(days=60),
        expires_at=T0 - timedelta(days=1),
        scope=channel_scope("old"),
    )
    queue.store.update_suppressions(SuppressionChange(add=(old,)), now=T0 - timedelta(days=60))
    database = queue.settings.database
    ArchivedMessage.objects.using(database).create(
        item_id=delivered.id,
        archived_at=T0,
        channel="default",
        sender=SENDER,
        recipients=f"{BOB}\nann@MAIL.example",
        subject="Delivered",
        message_id="<1@sender.test>",
        headers=message(SENDER, ANN, BOB).split(b"\r\n\r\n")[0],
        data=message(SENDER, ANN, BOB),
        body_until=T0 + timedelta(days=30),
        keep_until=T0 + timedelta(days=90),
    )
    ArchivedMessage.objects.using(database).create(
        item_id="00000000-0000-4000-8000-000000000001",
        archived_at=T0,
        channel="default",
        sender=SENDER,
        recipients=CARL,
        subject="Carl's",
        message_id="<2@sender.test>",
        headers=message(SENDER, CARL).split(b"\r\n\r\n")[0],
        data=None,
        body_until=T0,
        keep_until=T0 + timedelta(days=90),
    )
    ReturnedMail.objects.using(database).create(
        received_at=T0,
        recipients="bounces@sender.test",
        sender="MAILER-DAEMON@mail.example",
        subject="Undeliverable",
        message=b"From: MAILER-DAEMON@mail.example\r\n\r\nYour mail to <Ann@Mail.Example> could not be delivered.\r\n",
    )
    ReturnedMail.objects.using(database).create(
        received_at=T0, recipients="bounces@sender.test", sender="x@y.example", subject="Other", message=b"Nothing."
    )
    BulkAction.objects.create(acted_at=T0, by="ops", action="hold", filter={"recipient": ANN, "state": "queued"})
    BulkAction.objects.create(acted_at=T0, by="ops", action="hold", filter={"domain": "other.example"})
    DeliveryLog.objects.using(database).create(
        logged_at=T0,
        item_id=kept.id,
        recipient=CARL,
        domain="other.example",
        sender=SENDER,
        status="deferred",
        reply_code=451,
        reply_text=f"try later; also seen: {ANN.upper()}",
    )
    return {"delivered": delivered, "queued": queued, "kept": kept}


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out, stderr=StringIO())
    return out.getvalue()


# -- where the address could be left ------------------------------------------------------


def as_text(value: Any) -> str:
    if isinstance(value, memoryview | bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def database_traces(needle: str) -> list[str]:
    """Every column of every row of every table that holds ``needle``, case aside."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            columns = [column[0] for column in cursor.description]
            for row in cursor.fetchall():
                for column, value in zip(columns, row, strict=True):
                    if value is not None and needle in as_text(value).lower():
                        found.append(f"{table}.{column}")
    return found


def redis_traces(prefix: str, needle: str) -> list[str]:
    """Every key under ``prefix`` whose name or value (of any type) holds ``needle``."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    found = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        kind = client.type(key).decode()
        if kind == "string":
            values = [client.get(key)]
        elif kind == "hash":
            values = [part for pair in client.hgetall(key).items() for part in pair]
        elif kind == "set":
            values = list(client.smembers(key))
        elif kind == "zset":
            values = [member for member, _ in client.zscan_iter(key)]
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        else:
            values = [kind.encode()]  # a type this test does not read: say so
        if needle in key.decode("utf-8", "replace").lower() or any(
            needle in as_text(value).lower() for value in values if value is not None
        ):
            found.append(f"{key.decode()} ({kind})")
    return found


def store_traces(queue: QueueService, needle: str) -> list[str]:
    """The items (and messages) the store holds that name ``needle``, whatever the store."""
    found = []
    for item in queue.store.list(limit=10_000):
        texts = [item.sender, *(r.address for r in item.recipients), as_text(queue.read_message(item.id) or b"")]
        if any(needle in text.lower() for text in texts):
            found.append(item.id)
    for entry in queue.store.search_suppressions(now=T0 - timedelta(days=90), limit=10_000):
        if needle in entry.address.lower() or needle in entry.reply.text.lower():
            found.append(f"suppression {entry.address} {entry.scope}")
    return found


def traces(queue: QueueService, store_settings: dict[str, str]) -> list[str]:
    found = database_traces(ANN) + store_traces(queue, ANN)
    if store_settings.get("STORE") == "redis":
        found += redis_traces(store_settings["REDIS_KEY_PREFIX"], ANN)
    return found


# -- the tests ----------------------------------------------------------------------------


def test_export_holds_every_record_of_the_address(queue, server):
    made = populate(queue, server)

    data = json.loads(run("queue_export", ANN))

    assert data["format"] == 1 and data["address"] == ANN
    assert datetime.fromisoformat(data["exported_at"]) >= T0
    assert {item["id"] for item in data["items"]} == {item.id for item in made["queued"]}
    both = next(item for item in data["items"] if item["subject"] == "Both")
    assert [(r["address"], r["status"]) for r in both["recipients"]] == [(ANN, "pending"), (CARL, "pending")]
    assert both["state"] == "queued" and both["sender"] == SENDER
    assert "Subject: Both" in both["message_headers"] and "Hi." not in both["message_headers"]
    assert datetime.fromisoformat(both["created_at"]) == T0
    assert {(e["recipient"], e["status"]) for e in data["delivery_log"]} == {(ANN, "delivered")}
    assert [e["item_id"] for e in data["archive"]] == [made["delivered"].id]
    assert data["archive"][0]["recipients"] == [BOB, "ann@MAIL.example"]
    assert [(e["scope"], e["reason"]) for e in data["suppressions"]] == [("", "manual"), (NEWS, "manual")]
    assert [e["subject"] for e in data["returned_mail"]] == ["Undeliverable"]
    assert [e["filter"] for e in data["bulk_actions"]] == [{"recipient": ANN, "state": "queued"}]


def test_export_to_a_file(queue, server, tmp_path):
    populate(queue, server)
    path = tmp_path / "ann.json"

    assert run("queue_export", ANN, "--output", str(path)).strip() == f"Wrote {path}."

    assert json.loads(path.read_text(encoding="utf-8"))["address"] == ANN


def test_a_dry_run_says_what_would_go_and_changes_nothing(queue, server, store_settings):
    made = populate(queue, server)
    before = sorted(traces(queue, store_settings))

    out = run("queue_forget", ANN, "--dry-run")

    assert out.splitlines()[0] == (
        "Would erase: 5 items, 1 delivery log entries (1 more redacted), 1 archived messages, 1 returned mail, "
        "1 bulk actions redacted, 2 suppression entries hashed."
    )
    assert all(f"item {item.id}" in out for item in made["queued"])
    assert sorted(traces(queue, store_settings)) == before
    assert [entry.address for entry in queue.suppressions_for(ANN)] == [ANN, ANN]


def test_forget_leaves_no_trace_and_the_address_stays_suppressed(queue, server, store_settings, caplog):
    made = populate(queue, server)
    # The search finds what there is to find: the tables, the store's items, Redis's keys.
    assert {"bumail_queue_delivery_log.recipient", "bumail_queue_archive.recipients"} <= set(database_traces(ANN))
    assert len(store_traces(queue, ANN)) == 5 + 3  # the items, the entries (one expired)
    if store_settings.get("STORE") == "redis":
        assert redis_traces(store_settings["REDIS_KEY_PREFIX"], ANN)

    caplog.clear()  # what the erasure logs, not what the delivery above did
    with caplog.at_level(logging.INFO, logger="bumail_queue"):
        out = run("queue_forget", ANN)

    assert out.strip() == (
        "Erased: 5 items, 1 delivery log entries (1 more redacted), 1 archived messages, 1 returned mail, "
        "1 bulk actions redacted, 2 suppression entries hashed."
    )
    assert traces(queue, store_settings) == []
    audit = [r for r in caplog.records if r.getMessage().startswith("forgot an address:")]
    assert len(audit) == 1 and audit[0].levelno == logging.INFO
    assert not any(ANN in r.getMessage().lower() for r in caplog.records)

    # What was not Ann's stays: Carl's item, Bob's log entry, Carl's archive, the other rows.
    assert queue.get(made["kept"].id) is not None
    assert DeliveryLog.objects.filter(recipient=BOB).count() == 1
    carl = DeliveryLog.objects.get(recipient=CARL)
    assert carl.reply_text == f"try later; also seen: {FORGOTTEN_LABEL}"
    assert ArchivedMessage.objects.filter(recipients=CARL).count() == 1
    assert ReturnedMail.objects.filter(subject="Other").count() == 1
    assert BulkAction.objects.get(filter__recipient=FORGOTTEN_LABEL).filter["state"] == "queued"
    assert BulkAction.objects.count() == 2

    # Still suppressed in both scopes, under a key that does not say the address.
    key = forgotten_key(ANN)
    entries = queue.suppressions_for(ANN)
    assert [(e.address, e.scope, e.reason, e.reply.text) for e in entries] == [
        (key, "", SuppressionReason.MANUAL, ""),
        (key, NEWS, SuppressionReason.MANUAL, ""),
    ]
    assert entries[0].expires_at == T0 + queue.settings.suppression_duration
    assert queue.suppressed([ANN])[ANN].address == key
    assert queue.suppressed(["ann@MAIL.EXAMPLE"], channel="news")["ann@MAIL.EXAMPLE"].scope == ""

    # A later message to the address fails at once, with no RCPT to the server.
    asked = len(rcpts(server))
    again = send(queue, SENDER, ANN, BOB, subject="Again")
    queue.deliver_due(now=T0)
    assert rcpts(server)[asked:] == [BOB, SENDER]  # Bob's copy, then the DSN of Ann's failure
    assert queue.get(again.id) is None
    failed = DeliveryLog.objects.get(item_id=again.id, status="failed")
    assert (failed.reply_status, failed.reply_code) == ("5.7.1", None)
    assert "added by an operator" in failed.reply_text and "asked us" not in failed.reply_text


def test_the_suppression_command_shows_and_removes_a_forgotten_entry_by_its_address(queue, server):
    queue.suppress(ANN, scope="")
    queue.suppress(ANN, scope=NEWS)
    run("queue_forget", ANN)
    key = forgotten_key(ANN)

    lines = run("queue_suppression", "list").splitlines()
    assert lines[0].startswith(f"{FORGOTTEN_LABEL} {key}  channel:news  manual")
    assert lines[1].startswith(f"{FORGOTTEN_LABEL} {key}  manual")
    listed = json.loads(run("queue_suppression", "list", "--json"))["entries"]
    assert [(e["address"], e["forgotten"]) for e in listed] == [(key, True), (key, True)]
    exported = run("queue_suppression", "export").splitlines()
    assert [line.split(",")[0] for line in exported[1:]] == [key, key]

    assert run("queue_suppression", "remove", ANN).strip() == "Removed 1 address from the suppression list."
    assert [e.scope for e in queue.suppressions_for(ANN)] == [NEWS]
    assert run("queue_suppression", "forget", ANN).strip() == "Forgot ann@mail.example: 1 entry (channel:news)."
    assert queue.suppressions_for(ANN) == []


def test_an_export_of_forgotten_entries_imports_again(queue, server, tmp_path):
    queue.suppress(ANN, scope=NEWS)
    run("queue_forget", ANN)
    path = tmp_path / "list.csv"
    path.write_text(run("queue_suppression", "export"), encoding="utf-8")
    run("queue_suppression", "forget", ANN)

    assert run("queue_suppression", "import", str(path)).strip() == "Imported 1 entry."

    assert [(e.address, e.scope) for e in queue.suppressions_for(ANN)] == [(forgotten_key(ANN), NEWS)]


def test_an_address_forgotten_twice_keeps_one_entry_per_scope(queue, server):
    queue.suppress(ANN, scope="")
    run("queue_forget", ANN)
    queue.suppress(ANN, scope="", note="again")

    assert run("queue_forget", ANN).strip().endswith("1 suppression entries hashed.")

    assert [(e.address, e.scope) for e in queue.suppressions_for(ANN)] == [(forgotten_key(ANN), "")]
    assert get_store().count_suppressions(now=T0) == 1  # the first hashed entry was replaced


@pytest.mark.parametrize("given", ["not an address", "ann@", "", "a@b@"])
def test_what_is_no_address_is_refused_in_one_line(queue, given):
    for command in ("queue_forget", "queue_export"):
        with pytest.raises(CommandError) as raised:
            run(command, given)
        assert "is not an address" in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(QueueError) as error:
        queue.forget_address(given)
    assert error.value.code == ErrorCode.INVALID


def test_the_service_counts_by_place(queue, server):
    populate(queue, server)

    result = queue.forget_address(ANN.upper().replace("ANN", "ann"))

    assert (len(result.items), result.delivery_log, result.archive, result.returned_mail) == (5, 1, 1, 1)
    assert (result.bulk_actions, result.suppressions, result.dry_run) == (1, 2, False)
    assert Item.objects.count() == (1 if queue.settings.store == "orm" else 0)


def test_the_admin_lists_a_forgotten_entry_as_such_and_removes_it(queue, server, admin_client):
    queue.suppress(ANN, note=f"{ANN} asked", scope=NEWS)
    run("queue_forget", ANN)
    key = forgotten_key(ANN)
    changelist = reverse("admin:bumail_queue_suppression_changelist")

    page = admin_client.get(changelist).content.decode()

    assert FORGOTTEN_LABEL in page and key in page and ANN not in page
    assert reverse("admin:bumail_queue_item_address", args=[key]) not in page  # no page of a hash
    admin_client.post(changelist, {"action": "remove", "_selected_action": [f"{NEWS}|{key}"]})
    assert queue.suppressions_for(ANN) == []


def test_the_forgotten_key_is_djangos_salted_hmac_of_the_normal_address():
    expected = salted_hmac("bumail_queue.suppression.forgotten_key", "Ann@xn--bcher-kva.example", algorithm="sha256")

    assert forgotten_key("Ann@BÜCHER.example.") == f"hmac-sha256:{expected.hexdigest()}"
    assert forgotten_key(forgotten_key(ANN)) == forgotten_key(ANN)
    with override_settings(SECRET_KEY="another-test-secret"):
        other = forgotten_key(ANN)
    assert other != forgotten_key(ANN)


def test_a_claims_lookup_asks_for_the_addresses_and_their_hashes_in_one_statement(orm_store):
    hashed = Suppression(
        address=forgotten_key(ANN),
        reason=SuppressionReason.MANUAL,
        reply=Reply(code=None, status="", text=""),
        created_at=T0,
        expires_at=T0 + timedelta(days=1),
    )
    orm_store.update_suppressions(SuppressionChange(add=(hashed,)), now=T0)
    asked = [f"r{n}@example.net" for n in range(99)] + [ANN]

    with CaptureQueriesContext(connection) as queries:
        found = orm_store.suppressions_of(asked, now=T0, scopes=("", NEWS))

    assert found == {ANN: hashed}
    assert len(queries.captured_queries) == 1


def test_an_address_is_matched_however_its_domain_is_written(queue):
    written = send(queue, SENDER, "ann@Bücher.example", BOB, at=T0 + timedelta(days=1))
    other = send(queue, SENDER, "Ann@bücher.example", at=T0 + timedelta(days=1))  # another mailbox (RFC 5321)
    queue.suppress("ann@BÜCHER.example")

    exported = queue.export_address("ann@xn--bcher-kva.example")
    result = queue.forget_address("ann@xn--bcher-kva.example")

    assert [item["id"] for item in exported["items"]] == [written.id]
    assert exported["address"] == "ann@xn--bcher-kva.example"
    assert (result.items, result.suppressions) == ((written.id,), 1)
    assert queue.get(written.id) is None and queue.get(other.id) is not None
    assert queue.suppressed(["ann@bücher.example"])["ann@bücher.example"].forgotten
