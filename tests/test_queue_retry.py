"""``manage.py queue_retry``: deferred mail due now, on every store, and delivered by a worker."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone
from django_redis import get_redis_connection

from bumail_queue import queue
from bumail_queue.items import AttemptResult, Outcome, RecipientStatus, Reply
from bumail_queue.stores import get_store
from tests.conftest import REDIS_ALIAS
from tests.helpers import ROOT, postgres_worker_idle, redis_monitor, running_worker, smarthost, wait_until, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

OK = Reply(code=250, status="2.0.0", text="OK")
LATER = Reply(code=451, status="4.7.1", text="Greylisted, try again later")


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_name(request):
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store}):
        yield request.param


def enqueue(*recipients, at=None):
    raw = b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n"
    return queue.enqueue(raw, sender="app@example.com", recipients=list(recipients), at=at)


def deferred(*recipients, delivered=()):
    """An item tried once just now: ``recipients`` deferred for half an hour, ``delivered`` delivered.

    It claims what is due: make these before the items due now.
    """
    item = enqueue(*recipients, *delivered)
    store, now = get_store(), timezone.now()
    (claimed,) = store.claim(owner="earlier-worker", now=now, lease_until=now + timedelta(minutes=5), limit=10)
    assert claimed.id == item.id
    outcomes = {address: Outcome(status=RecipientStatus.DEFERRED, reply=LATER) for address in recipients}
    outcomes |= {address: Outcome(status=RecipientStatus.DELIVERED, reply=OK) for address in delivered}
    result = AttemptResult(outcomes=outcomes, next_attempt_at=now + timedelta(minutes=30))
    return store.complete(item.id, owner="earlier-worker", result=result)


def being_delivered(*recipients):
    """A deferred item whose next attempt a worker is making now (its lease holds 10 minutes).

    It claims the earliest due at that attempt's time: make it before the other deferred items.
    """
    item = deferred(*recipients)
    at = item.next_attempt_at
    (claimed,) = get_store().claim(owner="worker-on-host-1", now=at, lease_until=at + timedelta(minutes=10), limit=1)
    assert claimed.id == item.id
    return claimed


def retry(*args):
    """Run the command; return the lines it printed on stdout and on stderr."""
    out, err = StringIO(), StringIO()
    call_command("queue_retry", *args, stdout=out, stderr=err)
    return out.getvalue().splitlines(), err.getvalue().splitlines()


def is_due(item):
    return queue.get(item.id).next_attempt_at <= timezone.now()


def test_every_deferred_item_is_made_due_now_and_no_attempt_is_counted(store_name):
    leased = being_delivered("e@slow.example")
    items = [
        deferred("a@slow.example"),
        deferred("b@fast.example"),
        deferred("c@fast.example", delivered=["d@x.example"]),
    ]
    scheduled = enqueue("f@slow.example", at=timezone.now() + timedelta(hours=1))  # not tried: nothing deferred
    before = timezone.now()
    assert retry() == (["3 items due now."], [])
    for item in items:
        assert queue.get(item.id) == dataclasses.replace(item, next_attempt_at=queue.get(item.id).next_attempt_at)
        assert before <= queue.get(item.id).next_attempt_at <= timezone.now()
        assert queue.get(item.id).attempts == 1
    assert queue.get(leased.id) == leased  # left to its worker, as the admin's Retry now leaves it
    assert queue.get(scheduled.id).next_attempt_at == scheduled.next_attempt_at
    assert retry() == (["No deferred item matched."], [])  # due already: nothing is left to retry


def test_nothing_to_retry(store_name):
    assert retry() == (["No deferred item matched."], [])
    enqueue("a@example.org", at=timezone.now() + timedelta(hours=1))
    assert retry() == (["No deferred item matched."], [])


def test_domain_takes_the_items_with_a_deferred_recipient_there(store_name):
    slow = [deferred("a@slow.example"), deferred("Late@SLOW.Example")]
    others = [deferred("b@fast.example", delivered=["c@slow.example"]), deferred("d@mail.slow.example")]
    assert retry("--domain", "Slow.Example.") == (["2 items due now."], [])
    assert all(is_due(item) for item in slow)
    assert not any(is_due(item) for item in others)
    assert retry("--domain", "fast.example") == (["1 item due now."], [])


def test_a_domain_given_in_unicode_matches_it_however_the_addresses_spell_it(store_name):
    idn = [deferred("ann@bücher.example"), deferred("bob@xn--bcher-kva.example")]
    other = deferred("carol@bucher.example")
    assert retry("--domain", "BÜCHER.example") == (["2 items due now."], [])
    assert all(is_due(item) for item in idn)
    assert not is_due(other)


@pytest.mark.parametrize(
    ("domain", "said"),
    [
        ("exa mple.com", "'exa mple.com' is not a domain: the domain label 'exa mple' is not letters"),
        ("", "'' is not a domain: it is empty."),
        ("-bad-.example", "'-bad-.example' is not a domain"),
    ],
)
def test_a_malformed_domain_is_a_command_error(store_name, domain, said):
    item = deferred("a@example.org")
    with pytest.raises(CommandError, match=said.replace(".", r"\.")):
        retry(f"--domain={domain}")
    assert not is_due(item)


def test_ids_make_those_items_due_and_an_unknown_one_fails_the_command(store_name):
    leased = being_delivered("b@example.org")
    item = deferred("a@example.org")
    scheduled = enqueue("c@example.org", at=timezone.now() + timedelta(hours=1))  # the admin retries it too
    untouched = deferred("d@example.org")
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exit:
        call_command("queue_retry", item.id, "abc", leased.id.upper(), scheduled.id, stdout=out, stderr=err)
    assert exit.value.code == 1
    assert out.getvalue().splitlines() == [
        f"Item {leased.id.upper()} is being delivered; left alone.",
        "2 items due now.",
    ]
    assert err.getvalue().splitlines() == ["No item abc."]
    assert is_due(item) and is_due(scheduled)
    assert queue.get(leased.id) == leased
    assert not is_due(untouched)


def test_ids_that_all_exist_exit_0(store_name):
    leased = being_delivered("b@example.org")
    item = deferred("a@example.org")
    assert retry(item.id, item.id) == (["1 item due now."], [])
    assert retry(leased.id) == ([f"Item {leased.id} is being delivered; left alone.", "No item made due."], [])


@pytest.mark.slow
def test_on_the_command_line_an_unknown_id_is_a_line_of_its_own_and_status_1():
    settings = {"HOSTNAME": "mta.example.com"}
    with override_settings(BUMAIL_QUEUE=settings):
        item = deferred("a@example.org")
    done = subprocess.run(
        [sys.executable, "-m", "django", "queue_retry", item.id, "abc"],
        cwd=ROOT, env=worker_env(settings), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (1, "1 item due now.\n", "No item abc.\n")
    assert is_due(item)


def test_domain_and_ids_together_are_refused(store_name):
    item = deferred("a@example.org")
    with pytest.raises(CommandError, match=r"^Give --domain or item ids, not both\.$"):
        retry("--domain", "example.org", item.id)
    assert not is_due(item)


# -- a worker delivers what was retried -------------------------------------------------


@pytest.mark.slow
def test_a_running_worker_delivers_what_queue_retry_made_due(smtp_server):
    settings = smarthost(smtp_server, POLL_SECONDS=0.2)
    with override_settings(BUMAIL_QUEUE=settings):
        item = deferred("a@example.org")
        with running_worker(settings) as (worker, lines):
            assert retry() == (["1 item due now."], [])
            assert wait_until(lambda: queue.get(item.id) is None), f"not delivered:\n{''.join(lines)}"
    assert worker.returncode == 0
    assert [m.rcpt_tos for m in smtp_server.messages] == [["a@example.org"]]


@pytest.mark.slow
@pytest.mark.postgres
def test_queue_retry_wakes_an_idle_worker_by_notify_not_by_its_poll(smtp_server):
    # The poll is a minute away: mail delivered sooner came through LISTEN/NOTIFY.
    settings = smarthost(smtp_server, POLL_SECONDS=60)
    with override_settings(BUMAIL_QUEUE=settings):
        item = deferred("a@example.org")
        with running_worker(settings, "--owner", "idle-worker") as (worker, lines):
            assert wait_until(postgres_worker_idle("idle-worker")), f"the worker did not go idle:\n{''.join(lines)}"
            assert retry(item.id) == (["1 item due now."], [])
            assert wait_until(lambda: len(smtp_server.messages) == 1, seconds=20)
    assert worker.returncode == 0
    assert smtp_server.messages[0].rcpt_tos == ["a@example.org"]


@pytest.mark.slow
@pytest.mark.redis
def test_queue_retry_wakes_an_idle_worker_by_redis_not_by_its_poll(smtp_server, redis_settings):
    settings = smarthost(smtp_server, POLL_SECONDS=60, **redis_settings)
    channel = f"{redis_settings['REDIS_KEY_PREFIX']}wake"
    client = get_redis_connection(REDIS_ALIAS)
    url = django_settings.CACHES[REDIS_ALIAS]["LOCATION"]
    with override_settings(BUMAIL_QUEUE=settings):
        deferred("a@example.org")
        with redis_monitor(url) as commands, running_worker(settings, "--owner", "idle-worker") as (worker, lines):
            assert wait_until(lambda: dict(client.pubsub_numsub(channel)).get(channel.encode()) == 1), (
                f"the worker did not subscribe:\n{''.join(lines)}"
            )
            claimed = f'"{redis_settings["REDIS_KEY_PREFIX"]}" "idle-worker"'
            assert wait_until(lambda: any(claimed in line for line in list(commands))), "the worker did not claim"
            assert retry("--domain", "example.org") == (["1 item due now."], [])
            started = time.monotonic()
            assert wait_until(lambda: len(smtp_server.messages) == 1, seconds=20)
            took = time.monotonic() - started
    assert took < 5
    assert worker.returncode == 0
