"""Priorities and channels, from ``send_mail()`` to a real SMTP server on loopback,
through the worker, on every store; the backend's options; ``enqueue_many``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.core.mail import EmailMessage, send_mail, send_mass_mail
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.errors import ErrorCode, QueueConfigurationError, QueueError
from bumail_queue.models import Item, Message
from bumail_queue.stores import get_store
from tests.helpers import smarthost, use_queue_backend
from tests.test_backend import BACKEND, HAS_MAILERS, make_backend
from tests.test_tasks import DJANGO_TASK, task_rows

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = 50  # CLAIM_BATCH_SIZE's default: what a worker's first claim takes


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    """The ``BUMAIL_QUEUE`` keys of each store."""
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


def note(subject, to="reader@example.org"):
    return EmailMessage(subject, "Hello.", "app@example.com", [to])


def subjects_received(server):
    """The subjects of the messages ``server`` received, in the order their DATA ended."""
    found = []
    for message in server.messages:
        line = next(line for line in message.data.split(b"\r\n") if line.startswith(b"Subject: "))
        found.append(line.removeprefix(b"Subject: ").decode())
    return found


# -- through the worker, to a loopback SMTP server ------------------------------------------


def test_five_urgent_messages_behind_300_others_arrive_in_the_first_claim_batch(smtp_server, store_settings):
    settings = smarthost(smtp_server, **store_settings, CLAIM_BATCH_SIZE=BATCH)
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue_many([note(f"routine {n}", f"r{n}@example.org") for n in range(300)])
        for n in range(5):
            queue.enqueue(note(f"urgent {n}", "oncall@example.org"), priority=10)
        stats = queue.deliver_due()
    assert stats.delivered == 305
    received = subjects_received(smtp_server)
    assert len(received) == 305
    assert {f"urgent {n}" for n in range(5)} <= set(received[:BATCH])


def test_five_messages_of_another_channel_behind_300_of_a_bulk_one_arrive_in_the_first_claim_batch(
    smtp_server, store_settings
):
    settings = smarthost(smtp_server, **store_settings, CLAIM_BATCH_SIZE=BATCH)
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue_many([note(f"newsletter {n}", f"r{n}@example.org") for n in range(300)], channel="bulk")
        for n in range(5):
            queue.enqueue(note(f"password reset {n}", "user@example.org"), channel="account")
        stats = queue.deliver_due()
    assert stats.delivered == 305
    received = subjects_received(smtp_server)
    assert {f"password reset {n}" for n in range(5)} <= set(received[:BATCH])
    assert sorted(received) == sorted(
        [f"newsletter {n}" for n in range(300)] + [f"password reset {n}" for n in range(5)]
    )


def send_urgent(subject, to):
    """send_mail() through a mailer whose options are a priority and a channel, as each
    Django version configures one: a MAILERS alias on 6.1, get_connection() before."""
    options = {"priority": 100, "channel": "alerts"}
    if HAS_MAILERS:
        mailers = {"default": {"BACKEND": BACKEND}, "urgent": {"BACKEND": BACKEND, "OPTIONS": options}}
        with override_settings(MAILERS=mailers):
            send_mail(subject, "Now.", "ops@example.com", [to], using="urgent")
    else:
        send_mail(subject, "Now.", "ops@example.com", [to], connection=mail.get_connection(BACKEND, **options))


def test_send_mail_through_a_mailer_with_a_priority_and_a_channel_goes_first(smtp_server, store_settings):
    settings = smarthost(smtp_server, **store_settings, CLAIM_BATCH_SIZE=BATCH)
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend():
        send_mass_mail([(f"digest {n}", "Hello.", "app@example.com", [f"r{n}@example.org"]) for n in range(120)])
        send_urgent("disk full", "oncall@example.org")
        [item] = [i for i in get_store().list(limit=200) if i.channel == "alerts"]
        assert item.priority == 100
        queue.deliver_due()
    assert "disk full" in subjects_received(smtp_server)[:BATCH]


def test_dsns_take_dsn_priority_in_the_channel_of_the_mail_they_report_on(smtp_servers, store_settings):
    # The report itself is deferred by the sender's server, so it stays to be looked at.
    server = smtp_servers(
        rcpt_replies={"gone@example.org": "550 5.1.1 No such user", "app@example.com": "451 4.3.0 Try later"}
    )
    settings = smarthost(server, **store_settings, DSN_PRIORITY=-20)
    with override_settings(BUMAIL_QUEUE=settings):
        queue.enqueue(note("Invoice", "gone@example.org"), channel="billing", priority=30)
        queue.deliver_due()
        [dsn] = get_store().list()
    assert (dsn.sender, dsn.channel, dsn.priority, dsn.attempts) == ("", "billing", -20, 1)
    assert [r.address for r in dsn.recipients] == ["app@example.com"]


def test_the_report_of_a_suppressed_recipient_takes_dsn_priority_in_the_channel_of_its_mail(
    smtp_servers, store_settings
):
    server = smtp_servers(rcpt_replies={"app@example.com": "451 4.3.0 Try later"})
    settings = smarthost(server, **store_settings, DSN_PRIORITY=-20)
    with override_settings(BUMAIL_QUEUE=settings):
        queue.suppress("gone@example.org", note="bounced last week")
        invoice = queue.enqueue(note("Invoice", "gone@example.org"), channel="billing", priority=30)
        stats = queue.deliver_due()
        [dsn] = get_store().list()
    assert (stats.failed, queue.get(invoice.id)) == (1, None)
    assert not any(m.rcpt_tos == ["gone@example.org"] for m in server.messages)  # failed without a session
    assert (dsn.sender, dsn.channel, dsn.priority, dsn.attempts) == ("", "billing", -20, 1)


def test_with_tasks_a_dsn_is_queued_in_its_lane_with_its_task(smtp_servers):
    server = smtp_servers(
        rcpt_replies={"gone@example.org": "550 5.1.1 No such user", "app@example.com": "451 4.3.0 Try later"}
    )
    with override_settings(BUMAIL_QUEUE=smarthost(server, TASKS="django", DSN_PRIORITY=15)):
        invoice = queue.enqueue(note("Invoice", "gone@example.org"), channel="billing", priority=-30)
        queue.deliver_due(ids=[invoice.id])
        [dsn] = get_store().list()
    assert (dsn.sender, dsn.channel, dsn.priority) == ("", "billing", 15)
    # The invoice's task, then the report's, sent through the queue's own enqueue.
    assert task_rows() == [(DJANGO_TASK, [[invoice.id]], None), (DJANGO_TASK, [[dsn.id]], None)]


# -- the backend's options ------------------------------------------------------------------


def test_the_backend_gives_its_priority_and_channel_to_every_message_it_queues():
    backend = make_backend(priority=-40, channel="newsletter.weekly")
    assert backend.send_messages([note("one"), note("two")]) == 2
    assert sorted((i.priority, i.channel) for i in get_store().list()) == [(-40, "newsletter.weekly")] * 2
    # Without options: the defaults.
    assert make_backend().send_messages([note("three")]) == 1
    assert {(i.priority, i.channel) for i in get_store().list()} == {(-40, "newsletter.weekly"), (0, "default")}


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"priority": 101}, "'priority' must be a whole number from -100 to 100"),
        ({"priority": "high"}, "'priority' must be a whole number from -100 to 100"),
        ({"channel": "two words"}, "'channel' must be a name of 1 to 64 ASCII letters"),
        ({"channel": ""}, "'channel' must be a name of 1 to 64 ASCII letters"),
    ],
)
def test_a_backend_option_out_of_range_is_a_configuration_error(options, text):
    with pytest.raises(QueueConfigurationError) as info:
        make_backend(**options)
    assert info.value.code == ErrorCode.INVALID_OPTION
    assert "QueueEmailBackend's option" in info.value.message
    assert text in info.value.message


# -- enqueue and enqueue_many ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"priority": 101}, "'priority' must be a whole number from -100 to 100"),
        ({"priority": -101}, "'priority' must be a whole number from -100 to 100"),
        ({"priority": 1.5}, "'priority' must be a whole number"),
        ({"priority": True}, "'priority' must be a whole number"),
        ({"channel": "a" * 65}, "'channel' must be a name of 1 to 64"),
        ({"channel": "-leading"}, "starting with a letter or digit"),
        ({"channel": "bülk"}, "ASCII letters"),
        ({"channel": None}, "'channel' must be a name"),
    ],
)
def test_enqueue_refuses_a_priority_or_channel_out_of_range(store_settings, arguments, text):
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store_settings}):
        with pytest.raises(QueueError) as info:
            queue.enqueue(note("Hello"), **arguments)
        assert info.value.code == ErrorCode.INVALID
        assert text in info.value.message
        with pytest.raises(QueueError):
            queue.enqueue_many([note("one"), note("two")], **arguments)
        assert queue.count() == 0


def test_enqueue_many_gives_each_message_the_arguments(store_settings):
    at = timezone.now() + timedelta(hours=1)
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store_settings}):
        items = queue.enqueue_many(
            [note("one"), note("two"), note("three")],
            sender="bounces@example.com",
            recipients=["list@example.org"],
            at=at,
            keys=["k-1", None, "k-3"],
            priority=7,
            channel="lists",
        )
        assert [(i.sender, [r.address for r in i.recipients]) for i in items] == [
            ("bounces@example.com", ["list@example.org"])
        ] * 3
        assert [i.key for i in items] == ["k-1", None, "k-3"]
        assert {(i.priority, i.channel, i.next_attempt_at) for i in items} == {(7, "lists", at)}
        # A key still queued returns its item and adds nothing, in a batch as alone.
        again = queue.enqueue_many([note("four"), note("five")], keys=["k-3", "k-5"])
        assert again[0].id == items[2].id
        assert queue.count() == 4


@pytest.mark.parametrize(
    ("messages", "keys", "text"),
    [
        (lambda: note("one"), None, "'messages' must be a list of messages, not one message"),
        (lambda: [note("one"), note("two")], ["only-one"], "'keys' must be a list with one key (or None) per message"),
        (lambda: [note("one")], "k", "'keys' must be a list"),
    ],
)
def test_enqueue_many_refuses_arguments_of_the_wrong_shape(messages, keys, text):
    with pytest.raises(QueueError) as info:
        queue.enqueue_many(messages(), keys=keys)
    assert info.value.code == ErrorCode.INVALID
    assert text in info.value.message
    assert queue.count() == 0


def test_enqueue_many_with_one_bad_message_queues_none(store_settings):
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store_settings}):
        with pytest.raises(QueueError) as info:
            queue.enqueue_many([note("good"), note("bad", "not-an-address"), note("good too")])
        assert info.value.code == ErrorCode.INVALID
        assert queue.count() == 0


@pytest.mark.postgres
def test_enqueue_many_and_send_mass_mail_are_one_statement_on_postgresql(django_assert_num_queries):
    queue.enqueue(note("warm-up"))  # connects, reads the default isolation level once
    with django_assert_num_queries(1) as captured:
        items = queue.enqueue_many([note(f"n{n}", f"r{n}@example.org") for n in range(200)], channel="bulk")
    assert "unnest" in captured.captured_queries[0]["sql"]
    assert len(items) == 200
    with use_queue_backend(), django_assert_num_queries(1):
        send_mass_mail([(f"m{n}", "Hello.", "app@example.com", [f"m{n}@example.org"]) for n in range(200)])
    with django_assert_num_queries(1):
        queue.enqueue(note("one more"), priority=5)
    assert Item.objects.count() == Message.objects.count() == 402
    assert Item.objects.filter(channel="bulk").count() == 200


@pytest.mark.postgres
def test_enqueue_many_in_a_transaction_that_rolls_back_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        queue.enqueue_many([note(f"n{n}") for n in range(10)], priority=3)
        assert Item.objects.count() == 10  # visible inside the transaction...
        raise RuntimeError
    assert Item.objects.count() == 0  # ...and gone with it
    assert Message.objects.count() == 0
    assert connection.in_atomic_block is False


@pytest.mark.postgres
def test_enqueue_many_with_tasks_is_one_statement_whose_tasks_are_sent_on_commit(smtp_server):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, TASKS="django", CLAIM_BATCH_SIZE=100)):
        queue.enqueue(note("warm-up"))  # connects, reads the connection's facts once
        with transaction.atomic(), CaptureQueriesContext(connection) as captured:
            items = queue.enqueue_many([note(f"n{n}", f"r{n}@example.org") for n in range(150)], channel="bulk")
            assert len(task_rows()) == 1  # the warm-up's: none for the batch before the commit
        writes = [q["sql"] for q in captured.captured_queries if "bumail_queue_items" in q["sql"]]
        assert len(writes) == 1 and "unnest" in writes[0]
        sent = [args[0] for _, args, _ in task_rows()[1:]]
        assert sent == [[i.id for i in items[:100]], [i.id for i in items[100:]]]
        assert {(i.channel, i.priority) for i in queue.list(limit=200) if i.id in {*sent[0], *sent[1]}} == {("bulk", 0)}
