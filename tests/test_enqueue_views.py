"""``send_mail()`` and friends from a view queue mail, inside the view's transaction."""

from __future__ import annotations

import pytest
from django.db import connection

from bumail_queue.models import Item, Message
from tests.helpers import use_queue_backend

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _queue_backend():
    with use_queue_backend():
        yield


def test_send_mail_from_a_view_queues_the_item_and_its_message(client):
    response = client.get("/send-one/", {"to": "reader@example.org"})
    assert response.status_code == 200
    item = Item.objects.get()
    assert item.sender == "app@example.com"
    assert [r["address"] for r in item.recipients] == ["reader@example.org"]
    assert [r["status"] for r in item.recipients] == ["pending"]
    assert b"Subject: Welcome" in bytes(Message.objects.get(item=item).data)


def test_send_mass_mail_queues_every_message(client):
    client.get("/send-many/", {"n": "5"})
    assert Item.objects.count() == 5
    assert Message.objects.count() == 5


def test_a_view_whose_transaction_rolls_back_queues_nothing(client):
    client.raise_request_exception = False
    response = client.get("/send-then-fail/")
    assert response.status_code == 500
    assert Item.objects.count() == 0
    assert Message.objects.count() == 0


def test_atomic_requests_rolls_the_enqueue_back_with_the_view(client, monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    client.raise_request_exception = False
    response = client.get("/send-one-then-fail/")
    assert response.status_code == 500
    assert Item.objects.count() == 0
    # The same view's mail is queued once the request commits.
    client.get("/send-one/")
    assert Item.objects.count() == 1
