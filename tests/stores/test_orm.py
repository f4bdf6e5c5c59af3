"""The ORM store beyond the contract: other processes, transactions, isolation levels."""

from __future__ import annotations

import importlib
import multiprocessing
from collections import Counter
from datetime import timedelta

import pytest
from django.core.mail import EmailMessage
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import RecipientStatus
from bumail_queue.models import Item, Message
from bumail_queue.service import QueueService
from bumail_queue.shaping import Limits, PermitRequest, parse_rate
from tests import processes
from tests.factories import ItemFactory, NewItemFactory
from tests.servers.smtp import closed_port

pytestmark = pytest.mark.django_db(transaction=True)


# How a PostgreSQL connection can be told to default to a level stricter than
# READ COMMITTED; the store's writes must work under each.
ISOLATION_OPTIONS = {
    "server default": {},
    "session default serializable": {"options": "-c default_transaction_isolation=serializable"},
    "django isolation_level serializable": {"isolation_level": 3},  # psycopg.IsolationLevel.SERIALIZABLE
}


def database_for_children(options=None):
    """The test database's connection settings, for processes started by a test."""
    settings = {"NAME": connection.settings_dict["NAME"], "TEST": {"NAME": connection.settings_dict["NAME"]}}
    if options:
        settings["OPTIONS"] = {**connection.settings_dict.get("OPTIONS", {}), **options}
    return settings


def run_in_processes(function, argument_lists):
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(len(argument_lists))
        with context.Pool(len(argument_lists)) as pool:
            return pool.starmap(function, [(*args, barrier) for args in argument_lists], chunksize=1)


def assert_each_claimed_once(orm_store, results, total):
    claimed = [item_id for got in results for item_id in got]
    repeats = {item_id: n for item_id, n in Counter(claimed).items() if n > 1}
    assert repeats == {}, f"items claimed more than once: {list(repeats.items())[:5]}"
    assert len(claimed) == total
    assert {i.id for i in orm_store.list(limit=total)} == set(claimed)
    # Every process got a share: they really ran side by side.
    assert all(results), [len(r) for r in results]


def add_due_items(orm_store, count):
    now = timezone.now()
    orm_store.add_many([NewItemFactory(created_at=now - timedelta(seconds=1)) for _ in range(count)])


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("isolation", ISOLATION_OPTIONS)
@pytest.mark.parametrize("limit", [1, 20])
def test_four_processes_claim_every_item_exactly_once_on_postgresql(orm_store, isolation, limit):
    add_due_items(orm_store, 2000)
    # A connection that defaults to SERIALIZABLE still claims: writes run at READ COMMITTED.
    database = database_for_children(ISOLATION_OPTIONS[isolation])
    results = run_in_processes(processes.claim_until_empty, [(database, f"w{n}", limit) for n in range(4)])
    assert_each_claimed_once(orm_store, results, 2000)


@pytest.mark.sqlite
@pytest.mark.slow
def test_two_processes_on_one_sqlite_file_never_take_the_same_item(orm_store):
    add_due_items(orm_store, 2000)
    results = run_in_processes(
        processes.claim_until_empty_delivering, [(database_for_children(), f"w{n}", 1) for n in range(2)]
    )
    assert_each_claimed_once(orm_store, results, 2000)


def _max_items_under_four_enqueuers(orm_store, options):
    results = run_in_processes(
        processes.enqueue_many_times, [(database_for_children(options), 60, 100) for _ in range(4)]
    )
    assert sum(queued for queued, _ in results) == 100
    assert sum(refused for _, refused in results) == 140
    assert orm_store.count() == 100
    assert Message.objects.count() == 100


@pytest.mark.sqlite
@pytest.mark.slow
def test_max_items_never_overshoots_under_four_concurrent_enqueuers_on_sqlite(orm_store):
    _max_items_under_four_enqueuers(orm_store, None)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("isolation", ISOLATION_OPTIONS)
def test_max_items_never_overshoots_under_four_concurrent_enqueuers_on_postgresql(orm_store, isolation):
    _max_items_under_four_enqueuers(orm_store, ISOLATION_OPTIONS[isolation])


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing():
    service = QueueService()
    with pytest.raises(RuntimeError), transaction.atomic():
        service.enqueue(EmailMessage("s", "b", "app@example.com", ["a@example.org"]))
        assert Item.objects.count() == 1  # visible inside the transaction...
        raise RuntimeError
    assert Item.objects.count() == 0  # ...and gone with it
    assert Message.objects.count() == 0


def test_a_refused_enqueue_leaves_the_callers_transaction_usable(settings):
    settings.BUMAIL_QUEUE = {"MAX_ITEMS": 1, "HOSTNAME": "mta.example.com"}
    service = QueueService()
    with transaction.atomic():
        service.enqueue(EmailMessage("s", "b", "app@example.com", ["a@example.org"]))
        with pytest.raises(Exception) as error:
            service.enqueue_many([EmailMessage("s", "b", "app@example.com", [f"{n}@example.org"]) for n in range(2)])
        assert error.value.code == "FULL"
        assert Item.objects.count() == 1  # the savepoint took back only the refused add
    assert Item.objects.count() == 1


def test_claim_is_two_statements_on_postgresql_and_one_write_locked_transaction_on_sqlite(
    orm_store, django_assert_num_queries
):
    add_due_items(orm_store, 6)
    now = timezone.now()
    # Connects, reads the connection's facts once.
    assert len(orm_store.claim(owner="w1", now=now, lease_until=now + timedelta(minutes=1), limit=1)) == 1
    # PostgreSQL: the lanes' due counts, then their shares locked and leased. SQLite, in
    # the process: BEGIN IMMEDIATE, the lanes, a probe and a count of each (one lane
    # here), its share, the lease, COMMIT.
    with django_assert_num_queries(2 if connection.vendor == "postgresql" else 7) as queries:
        assert len(orm_store.claim(owner="w1", now=now, lease_until=now + timedelta(minutes=1), limit=10)) == 5
    if connection.vendor == "sqlite":
        assert queries.captured_queries[0]["sql"] == "BEGIN IMMEDIATE"


@pytest.mark.postgres
def test_a_claim_of_an_idle_queue_is_one_statement_on_postgresql(orm_store, django_assert_num_queries):
    now = timezone.now()
    orm_store.add(NewItemFactory(created_at=now + timedelta(hours=1)))  # not due
    orm_store.claim(owner="w1", now=now, lease_until=now, limit=1)  # connects
    with django_assert_num_queries(1):
        assert orm_store.claim(owner="w1", now=now, lease_until=now + timedelta(minutes=1), limit=10) == []


@pytest.mark.postgres
def test_enqueue_outside_a_transaction_is_one_statement_on_postgresql(orm_store, django_assert_num_queries):
    orm_store.add(NewItemFactory())  # connects, reads the default isolation level once
    with django_assert_num_queries(1):
        orm_store.add(NewItemFactory())


@pytest.mark.postgres
def test_an_enqueue_on_postgresql_is_one_call_of_the_migrations_function(orm_store):
    orm_store.add(NewItemFactory())  # connects, reads the connection's facts once
    first = NewItemFactory(key="order-7")
    with CaptureQueriesContext(connection) as captured:
        added = orm_store.add(first)
        again = orm_store.add(NewItemFactory(key="order-7"))
    assert [q["sql"].split("(")[0] for q in captured.captured_queries][:2] == ["SELECT bumail_queue_add"] * 2
    assert again.id == added.id == first.id
    assert orm_store.read_message(added.id) == first.message
    assert Message.objects.count() == 2
    # What the function was given reads back as the item the add returned.
    several = orm_store.add(NewItemFactory(recipients=["a@one.example", "b@two.example"], priority=-4, channel="bulk"))
    assert orm_store.get(several.id) == several
    assert [(r.address, r.status) for r in several.recipients] == [
        ("a@one.example", RecipientStatus.PENDING),
        ("b@two.example", RecipientStatus.PENDING),
    ]


@pytest.mark.postgres
@pytest.mark.parametrize("how_many", [1, 3])
def test_an_enqueue_while_postgresql_refuses_connections_is_store_unavailable(orm_store, how_many):
    connection.close()
    port = connection.settings_dict["PORT"]
    connection.settings_dict["PORT"] = closed_port()
    try:
        with pytest.raises(QueueError) as refused:
            orm_store.add_many(NewItemFactory.build_batch(how_many))
    finally:
        connection.settings_dict["PORT"] = port
        connection.close()
    assert refused.value.code == ErrorCode.STORE_UNAVAILABLE
    assert "could not be used" in refused.value.message
    assert orm_store.count() == 0


@pytest.mark.postgres
def test_without_the_function_an_enqueue_is_one_statement_of_its_own(orm_store):
    # As in a test database made without migrations: the store finds no function.
    migration = importlib.import_module("bumail_queue.migrations.0008_priority_channel")
    with connection.schema_editor() as editor:
        migration.drop_add_function(None, editor)
    connection.close()  # a new connection asks its facts anew
    try:
        orm_store.add(NewItemFactory())
        with CaptureQueriesContext(connection) as captured:
            added = orm_store.add(NewItemFactory(priority=3, channel="bulk"))
        assert [q["sql"][:20] for q in captured.captured_queries] == ["WITH new_item AS (IN"]
        assert (orm_store.get(added.id).priority, orm_store.get(added.id).channel) == (3, "bulk")
    finally:
        with connection.schema_editor() as editor:
            migration.create_add_function(None, editor)
        connection.close()


def test_rows_written_by_the_orm_read_back_as_queue_items(orm_store):
    row = ItemFactory(deferred=True)
    item = orm_store.get(str(row.id))
    assert item.recipients[0].status == "deferred"
    assert item.recipients[0].reply.code == 451
    assert item.attempts == 1
    assert orm_store.read_message(str(row.id)) == b"Subject: test\r\n\r\nbody\r\n"


def test_a_row_another_worker_leases_is_skipped_until_its_lease_expires(orm_store):
    leased = ItemFactory(leased=True, created_at=timezone.now() - timedelta(minutes=1))
    free = ItemFactory(created_at=timezone.now() - timedelta(minutes=1))
    now = timezone.now()
    assert [i.id for i in orm_store.claim(owner="w1", now=now, lease_until=now + timedelta(minutes=1), limit=10)] == [
        str(free.id)
    ]
    after_expiry = leased.lease_expires_at + timedelta(seconds=1)
    again = orm_store.claim(owner="w1", now=after_expiry, lease_until=after_expiry + timedelta(minutes=1), limit=10)
    assert str(leased.id) in [i.id for i in again]


def test_retry_deferred_is_one_update_and_at_a_domain_one_select_more(orm_store, django_assert_num_queries):
    now = timezone.now()
    orm_store.retry_deferred(now=now)  # connects, reads the default isolation level once
    for _ in range(3):
        ItemFactory(deferred=True, created_at=now)
    with django_assert_num_queries(1):
        assert orm_store.retry_deferred(now=now) == 3
    ItemFactory(deferred=True, created_at=now)
    # The SELECT is of the items at non-ASCII domains the UPDATE could not compare.
    with django_assert_num_queries(2):
        assert orm_store.retry_deferred(now=now, domain="example.org") == 1


def test_retry_items_is_one_update_and_a_select_when_some_are_left(orm_store, django_assert_num_queries):
    now = timezone.now()
    free = [str(ItemFactory(deferred=True, created_at=now).id) for _ in range(3)]
    leased = str(ItemFactory(leased=True, created_at=now).id)
    orm_store.retry_items(free[:1], now=now)  # connects, reads the default isolation level once
    with django_assert_num_queries(1):
        assert orm_store.retry_items(free, now=now).due == 3
    with django_assert_num_queries(2):
        done = orm_store.retry_items([*free, leased, "00000000-0000-4000-8000-000000000000"], now=now)
    assert (done.due, done.leased, done.missing) == (3, (leased,), ("00000000-0000-4000-8000-000000000000",))


# -- shaping buckets ---------------------------------------------------------------------------


def test_a_first_request_is_answered_when_another_worker_forgets_idle_buckets_meanwhile(orm_store):
    """A destination's first request makes its bucket, then asks again; another worker's
    ``forget_idle_destinations`` can run in between, and must not take the new bucket
    for one idle for an hour."""
    now = timezone.now()
    forgot = []

    def forget_after_the_bucket_is_made(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "ON CONFLICT (key) DO NOTHING" in sql and not forgot:
            forgot.append(orm_store.forget_idle_destinations(before=now - timedelta(hours=1), now=now))
        return result

    request = PermitRequest(key="new.example", limits=Limits(rate=parse_rate("10/s")), now=now)
    with connection.execute_wrapper(forget_after_the_bucket_is_made):
        permit = orm_store.take_permit(request)
    assert forgot == [0]
    assert permit.granted
    (state,) = orm_store.destination_states(now=now)
    assert state.key == "new.example"
