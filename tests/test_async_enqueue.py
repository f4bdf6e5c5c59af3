"""The queue from async code: ``await queue.aenqueue()`` and its kin, from an async view
under Django's async test client, and inside a transaction through ``sync_to_async``,
on every store."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.core.mail import EmailMessage
from django.test import AsyncClient, override_settings

from bumail_queue import queue

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    return request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": "orm"}


def get(path, **params):
    return async_to_sync(AsyncClient().get)(path, params)


def test_an_async_view_awaits_the_enqueue_and_the_item_is_queued(store_settings):
    with override_settings(BUMAIL_QUEUE=store_settings):
        response = get("/send-async/", to="ann@example.org")
        assert response.status_code == 200
        item = queue.get(response.content.decode())
        assert [r.address for r in item.recipients] == ["ann@example.org"]
        assert queue.count() == 1


@pytest.mark.parametrize(("fail", "queued"), [("0", 1), ("1", 0)])
def test_an_enqueue_in_a_transaction_from_async_code_goes_or_not_with_it(store_settings, fail, queued):
    # The ORM store writes inside the transaction; Redis on its commit: a rollback
    # leaves nothing queued with either.
    with override_settings(BUMAIL_QUEUE=store_settings):
        response = get("/send-async-in-a-transaction/", fail=fail)
        assert response.status_code == (200 if fail == "0" else 500)
        assert queue.count() == queued


def test_the_services_other_calls_await_as_well(store_settings):
    async def scenario():
        items = await queue.aenqueue_many(
            [EmailMessage(f"Note {n}", "Hi.", "app@example.com", [f"r{n}@example.org"]) for n in range(3)]
        )
        first, second, _ = items
        counted = await queue.acount()
        fetched = await queue.aget(first.id)
        retried = await queue.aretry_now(second.id)
        cancelled = await queue.acancel(first.id)
        return counted, fetched.id, retried, cancelled.id, await queue.acount(), first.id

    with override_settings(BUMAIL_QUEUE=store_settings):
        counted, fetched, retried, cancelled, after, first = async_to_sync(scenario)()
    assert (counted, fetched, retried, cancelled, after) == (3, first, True, first, 2)
