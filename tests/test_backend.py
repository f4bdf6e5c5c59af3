"""``QueueEmailBackend``: Django's email API, turned into enqueues."""

from __future__ import annotations

import email
import email.policy
import warnings
from contextlib import contextmanager

import django
import pytest
from django.core import mail
from django.core.mail import EmailMessage, send_mail, send_mass_mail
from django.test import override_settings

from bumail_queue.backends import QueueEmailBackend
from bumail_queue.errors import ErrorCode, QueueConfigurationError, QueueError
from bumail_queue.models import Item
from bumail_queue.stores import get_store
from tests.factories import EmailMessageFactory

BACKEND = "bumail_queue.backends.QueueEmailBackend"
HAS_MAILERS = hasattr(mail, "mailers")


@contextmanager
def queue_as_default_mailer():
    """Make the queue the project's mailer, the way each Django version configures it."""
    if HAS_MAILERS:
        with override_settings(MAILERS={"default": {"BACKEND": BACKEND}}):
            yield
    else:
        with override_settings(EMAIL_BACKEND=BACKEND):
            yield


def make_backend(**options) -> QueueEmailBackend:
    """Build the backend through Django, as a project's configuration would."""
    if HAS_MAILERS:
        with override_settings(MAILERS={"queue": {"BACKEND": BACKEND, "OPTIONS": options}}):
            backend = mail.mailers["queue"]
    else:
        backend = mail.get_connection(BACKEND, **options)
    assert type(backend) is QueueEmailBackend
    return backend


def queued() -> dict[str, tuple[list[str], bytes]]:
    """Return each queued message by its subject: its envelope recipients and its bytes."""
    store = get_store()
    found = {}
    for item in store.list(limit=1000):
        data = store.read_message(item.id)
        assert data is not None
        subject = str(email.message_from_bytes(data, policy=email.policy.default)["Subject"])
        found[subject] = ([r.address for r in item.recipients], data)
    return found


@pytest.mark.django_db(transaction=True)
def test_send_messages_queues_each_message_and_says_how_many():
    messages = [EmailMessageFactory(subject=f"Invoice {n}", to=[f"customer{n}@example.org"]) for n in range(3)]

    sent = make_backend().send_messages(messages)

    assert sent == 3
    assert get_store().count() == 3
    found = queued()
    assert sorted(found) == ["Invoice 0", "Invoice 1", "Invoice 2"]
    for n in range(3):
        recipients, data = found[f"Invoice {n}"]
        assert recipients == [f"customer{n}@example.org"]
        assert f"Subject: Invoice {n}\r\n".encode() in data


@pytest.mark.django_db(transaction=True)
def test_send_messages_keeps_bcc_out_of_the_bytes():
    message = EmailMessage(
        "Board minutes", "Attached.", "app@example.com", ["board@example.org"], bcc=["auditor@example.net"]
    )

    assert QueueEmailBackend().send_messages([message]) == 1

    recipients, data = queued()["Board minutes"]
    assert recipients == ["board@example.org", "auditor@example.net"]
    assert b"auditor@example.net" not in data


@pytest.mark.django_db(transaction=True)
def test_send_messages_with_one_bad_recipient_queues_none():
    messages = [
        EmailMessageFactory(to=["good1@example.org"]),
        EmailMessageFactory(to=["first..last@example.org"]),
        EmailMessageFactory(to=["good2@example.org"]),
    ]

    with pytest.raises(QueueError) as info:
        make_backend().send_messages(messages)

    assert info.value.code == ErrorCode.INVALID
    assert "'first..last@example.org'" in info.value.message
    assert get_store().count() == 0


@pytest.mark.django_db(transaction=True)
def test_send_messages_beyond_max_items_queues_none():
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "MAX_ITEMS": 2}):
        with pytest.raises(QueueError) as info:
            make_backend().send_messages(EmailMessageFactory.build_batch(3))

        assert info.value.code == ErrorCode.FULL
        assert get_store().count() == 0


@pytest.mark.django_db(transaction=True)
def test_fail_silently_returns_zero_and_queues_nothing():
    messages = [EmailMessageFactory(), EmailMessageFactory(to=["no-at-sign"])]

    backend = make_backend(fail_silently=True)

    assert backend.fail_silently is True
    assert backend.send_messages(messages) == 0
    assert get_store().count() == 0


@pytest.mark.django_db(transaction=True)
def test_fail_silently_still_queues_good_messages():
    assert make_backend(fail_silently=True).send_messages(EmailMessageFactory.build_batch(2)) == 2
    assert get_store().count() == 2


def test_no_messages_queue_nothing():
    # No database is needed to queue nothing.
    assert make_backend().send_messages([]) == 0
    assert QueueEmailBackend().send_messages(iter([])) == 0


@pytest.mark.django_db(transaction=True)
def test_send_messages_takes_any_iterable():
    assert QueueEmailBackend().send_messages(m for m in EmailMessageFactory.build_batch(2)) == 2
    assert get_store().count() == 2


def test_unknown_options_are_refused():
    """Django 6.1 reports them as InvalidMailer; before it, the backend refuses them itself."""
    if django.VERSION >= (6, 1):
        mailers = {"queue": {"BACKEND": BACKEND, "OPTIONS": {"host": "smtp.example.com", "use_tls": True}}}
        with override_settings(MAILERS=mailers), pytest.raises(mail.InvalidMailer) as info:
            mail.mailers["queue"]
        assert "MAILERS['queue']" in str(info.value)
        assert "'host'" in str(info.value)
        assert "'use_tls'" in str(info.value)
        return

    assert not hasattr(mail, "mailers")
    with pytest.raises(QueueConfigurationError) as info:
        mail.get_connection(BACKEND, host="smtp.example.com", use_tls=True)
    assert info.value.code == ErrorCode.INVALID_OPTION
    assert "QueueEmailBackend takes the options 'priority' and 'channel'" in info.value.message
    assert "'host'" in info.value.message
    assert "'use_tls'" in info.value.message
    # send_mail(auth_user=..., auth_password=...) passes these; they are ignored.
    assert type(mail.get_connection(BACKEND, username="u", password="p")) is QueueEmailBackend


@pytest.mark.django_db(transaction=True)
def test_send_mail_queues_through_the_backend():
    with queue_as_default_mailer():
        sent = send_mail("Grüße aus Köln", "Hallo!", "app@example.com", ["Anna <anna@example.org>", "ben@example.org"])

    assert sent == 1
    assert get_store().count() == 1
    recipients, data = queued()["Grüße aus Köln"]
    assert recipients == ["anna@example.org", "ben@example.org"]
    assert b"Hallo!" in data


@pytest.mark.django_db(transaction=True)
def test_send_mail_with_an_ascii_subject_keeps_it_in_the_bytes():
    with queue_as_default_mailer():
        send_mail("Your password was changed", "Hi.", None, ["user@example.org"])

    [item] = get_store().list()
    assert item.sender == "app@example.com"  # DEFAULT_FROM_EMAIL
    assert b"Subject: Your password was changed\r\n" in get_store().read_message(item.id)


@pytest.mark.django_db(transaction=True)
def test_send_mass_mail_queues_each_message():
    datatuple = [
        ("Welcome aboard", "Hello Ann", "app@example.com", ["ann@example.org"]),
        ("Your weekly digest", "Hello Bo", "news@example.com", ["bo@example.org", "bo2@example.org"]),
    ]

    with queue_as_default_mailer():
        sent = send_mass_mail(datatuple)

    assert sent == 2
    found = queued()
    assert sorted(found) == ["Welcome aboard", "Your weekly digest"]
    assert found["Welcome aboard"][0] == ["ann@example.org"]
    assert found["Your weekly digest"][0] == ["bo@example.org", "bo2@example.org"]
    assert b"Subject: Your weekly digest\r\n" in found["Your weekly digest"][1]
    assert {item.sender for item in get_store().list()} == {"app@example.com", "news@example.com"}


@pytest.mark.django_db(transaction=True)
def test_email_message_send_queues_through_the_default_mailer():
    with queue_as_default_mailer():
        sent = EmailMessage("Receipt 42", "Thanks.", "shop@example.com", ["buyer@example.org"]).send()

    assert sent == 1
    assert "Receipt 42" in queued()


@pytest.mark.django_db(transaction=True)
def test_send_mail_with_a_bad_recipient_raises_and_queues_nothing():
    with queue_as_default_mailer(), pytest.raises(QueueError) as info:
        send_mail("Hi", "Hello", "app@example.com", ["ok@example.org", "not an address"])

    assert info.value.code == ErrorCode.INVALID
    assert get_store().count() == 0


@pytest.mark.django_db(transaction=True)
def test_plain_use_raises_no_deprecation_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = make_backend()
        quiet = QueueEmailBackend(fail_silently=True)
        assert backend.fail_silently is False
        assert quiet.fail_silently is True
        assert backend.send_messages([EmailMessageFactory()]) == 1
        assert quiet.send_messages([EmailMessageFactory(to=["bad"])]) == 0
        with queue_as_default_mailer():
            assert send_mail("Plain", "Plain use.", "app@example.com", ["plain@example.org"]) == 1
            assert send_mass_mail([("Mass", "Plain use.", "app@example.com", ["mass@example.org"])]) == 1

    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning | PendingDeprecationWarning)]
    assert [f"{w.category.__name__}: {w.message}" for w in deprecations] == []
    assert get_store().count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_message_without_recipients_is_skipped_like_djangos_smtp_backend():
    backend = QueueEmailBackend()
    sent = backend.send_messages(
        [EmailMessage("a", "b", "app@example.com", []), EmailMessage("c", "d", "app@example.com", ["x@example.org"])]
    )
    assert sent == 1
    assert Item.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_fail_silently_never_hides_a_broken_configuration():
    backend = QueueEmailBackend(fail_silently=True)
    with override_settings(BUMAIL_QUEUE={"CONCURRENCY": 0}), pytest.raises(QueueConfigurationError):
        backend.send_messages([EmailMessage("a", "b", "app@example.com", ["x@example.org"])])
    assert Item.objects.count() == 0
