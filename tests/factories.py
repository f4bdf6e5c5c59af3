"""factory-boy factories for queue data."""

from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.core.mail import EmailMessage
from django.utils import timezone

from bumail_queue.items import NewItem, RecipientStatus
from bumail_queue.models import Item, Message


class NewItemFactory(factory.Factory):
    """What the service hands a store to add; due now unless told otherwise."""

    class Meta:
        model = NewItem

    id = factory.LazyFunction(lambda: str(uuid.uuid4()))
    sender = factory.Sequence(lambda n: f"sender{n}@example.com")
    recipients = factory.Sequence(lambda n: [f"rcpt{n}@example.org"])
    message = factory.LazyAttribute(
        lambda o: (
            f"From: {o.sender}\r\nTo: {', '.join(o.recipients)}\r\nSubject: test\r\n\r\nbody of {o.id}\r\n".encode(
                "utf-8", "replace"
            )
        )
    )
    created_at = factory.LazyFunction(timezone.now)
    next_attempt_at = factory.LazyAttribute(lambda o: o.created_at)
    key = None

    class Params:
        later = factory.Trait(next_attempt_at=factory.LazyAttribute(lambda o: o.created_at + timedelta(hours=1)))


class EmailMessageFactory(factory.Factory):
    class Meta:
        model = EmailMessage

    subject = factory.Sequence(lambda n: f"Subject {n}")
    body = "Hello,\n\nThis is a test.\n"
    from_email = "app@example.com"
    to = factory.Sequence(lambda n: [f"user{n}@example.org"])


class ItemFactory(factory.django.DjangoModelFactory):
    """A row of the ORM store, with its message; traits for the states a test needs."""

    class Meta:
        model = Item
        skip_postgeneration_save = True

    id = factory.LazyFunction(uuid.uuid4)
    sender = factory.Sequence(lambda n: f"sender{n}@example.com")
    recipients = factory.Sequence(lambda n: [{"address": f"rcpt{n}@example.org", "status": "pending", "reply": None}])
    size = 64
    created_at = factory.LazyFunction(timezone.now)
    next_attempt_at = factory.LazyAttribute(lambda o: o.created_at)
    message = factory.RelatedFactory("tests.factories.MessageFactory", factory_related_name="item")

    class Params:
        leased = factory.Trait(
            lease_owner="other-worker",
            lease_expires_at=factory.LazyAttribute(lambda o: o.created_at + timedelta(minutes=10)),
            next_attempt_at=factory.LazyAttribute(lambda o: o.created_at + timedelta(minutes=10)),
        )
        deferred = factory.Trait(
            attempts=1,
            next_attempt_at=factory.LazyAttribute(lambda o: o.created_at + timedelta(minutes=15)),
            recipients=factory.Sequence(
                lambda n: [
                    {
                        "address": f"rcpt{n}@example.org",
                        "status": RecipientStatus.DEFERRED.value,
                        "reply": {"code": 451, "status": "4.3.0", "text": "try later"},
                    }
                ]
            ),
        )


class MessageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Message

    item = factory.SubFactory(ItemFactory, message=None)
    data = factory.LazyAttribute(lambda o: b"Subject: test\r\n\r\nbody\r\n")
