"""Delivery tasks, in this process: the ``TASKS`` setting and its check, the tasks sent on
commit (to django-tasks-db's table and to Celery's Redis broker, both real), and what a
task run delivers. The task workers themselves run in tests/test_tasks_workers.py."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core import mail
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.checks import check_settings
from bumail_queue.conf import validate
from bumail_queue.errors import QueueError
from bumail_queue.items import AttemptResult, Outcome, RecipientStatus, Reply
from bumail_queue.stores import get_store
from bumail_queue.tasks import run
from tests.helpers import ROOT, smarthost, use_queue_backend

pytestmark = pytest.mark.django_db(transaction=True)

HOST = {"HOSTNAME": "mta.example.com"}
RAW = b"From: app@example.com\r\nSubject: Hi\r\n\r\nHi.\r\n"


def task_rows():
    """The django-tasks-db rows: (task path, args, run_after), oldest first."""
    from django_tasks_db.models import DBTaskResult

    rows = DBTaskResult.objects.order_by("enqueued_at")
    # The table keeps "no run_after" as the year 9999.
    return [
        (row.task_path, row.args_kwargs["args"], None if row.run_after.year == 9999 else row.run_after) for row in rows
    ]


DJANGO_TASK = "bumail_queue.tasks.django.deliver_due"


class RollbackError(Exception):
    """Raised in a view's transaction to roll it back."""


# -- the setting and its check ----------------------------------------------------------


@pytest.mark.parametrize(
    ("tasks", "said"),
    [
        ("rq", "names the framework 'rq'; it must be one of 'django', 'celery'"),
        (42, "must be None, 'django', 'celery' or a dict with 'FRAMEWORK'; got 42"),
        ({"QUEUE": "mail"}, "names the framework None"),
        ({"FRAMEWORK": "celery", "BACKEND": "default"}, "a 'celery' set-up does not take: 'BACKEND'"),
        ({"FRAMEWORK": "django", "QUEUE": ""}, "['QUEUE'] must be a non-empty string; got ''"),
        ({"FRAMEWORK": "django", "CLAIM_SECONDS": 0}, "['CLAIM_SECONDS'] must be a number of seconds above 0"),
        ({"FRAMEWORK": "celery", "CLAIM_SECONDS": True}, "got True"),
        ({"FRAMEWORK": "django", "BACKEND": "mail"}, "['BACKEND'] is 'mail', which is not an alias of the TASKS"),
    ],
)
def test_a_wrong_tasks_setting_is_e025(tasks, said):
    problems = validate({**HOST, "TASKS": tasks})
    assert [(p.id, p.key) for p in problems] == [("bumail_queue.E025", "TASKS")]
    assert said in problems[0].message


@pytest.mark.parametrize(
    "tasks",
    [None, "django", "celery", {"FRAMEWORK": "django", "QUEUE": "default", "BACKEND": "default", "CLAIM_SECONDS": 5}],
)
def test_a_right_tasks_setting_is_valid(tasks):
    assert validate({**HOST, "TASKS": tasks}) == []


@pytest.mark.parametrize(
    ("framework", "missing", "said"),
    [
        ("celery", ["celery"], "pip install 'bumail_queue[celery]'"),
        ("django", ["django.tasks", "django_tasks"], "pip install 'bumail_queue[tasks]', or upgrade Django"),
    ],
)
def test_a_framework_that_is_not_installed_is_e025(monkeypatch, framework, missing, said):
    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)  # what the interpreter does for a module it cannot find
    with override_settings(BUMAIL_QUEUE={**HOST, "TASKS": framework}):
        errors = check_settings(None)
    assert [(e.id, said in e.msg) for e in errors] == [("bumail_queue.E025", True)]


def test_the_check_command_fails_on_a_wrong_tasks_setting():
    with override_settings(BUMAIL_QUEUE={**HOST, "TASKS": "rq"}), pytest.raises(SystemCheckError) as info:
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
    assert "bumail_queue.E025" in str(info.value)


def test_with_tasks_off_no_framework_is_imported():
    # A process of its own: this one has imported every framework already.
    script = """
import sys
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["bumail_queue"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "STORE": "memory"},
    USE_TZ=True,
)
django.setup()
from bumail_queue import queue
queue.enqueue(b"Subject: hi\\r\\n\\r\\nhi\\r\\n", sender="a@example.com", recipients=["b@example.org"])
print(sorted(name for name in sys.modules if name.split(".")[0] in {"celery", "kombu", "django_tasks", "django_tasks_db"} or name.startswith("django.tasks")))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- django.tasks: the task is sent on commit --------------------------------------------


@pytest.fixture
def django_tasks(smtp_server):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, TASKS="django")), use_queue_backend():
        yield smtp_server


def test_a_committed_send_mail_sends_one_task_with_the_item_id_only(django_tasks):
    with transaction.atomic():
        mail.send_mail("Hi", "Hello.", "app@example.com", ["ann@example.org", "bob@example.org"])
        assert task_rows() == []  # not before the commit
    (item,) = queue.list()
    assert task_rows() == [(DJANGO_TASK, [[item.id]], None)]


def test_a_rolled_back_view_sends_no_task(django_tasks):
    with pytest.raises(RollbackError), transaction.atomic():
        mail.send_mail("Hi", "Hello.", "app@example.com", ["ann@example.org"])
        raise RollbackError
    assert (queue.count(), task_rows()) == (0, [])


def test_mail_due_later_gets_its_task_for_then(django_tasks):
    at = timezone.now() + timedelta(hours=2)
    item = queue.enqueue(RAW, sender="app@example.com", recipients=["ann@example.org"], at=at)
    assert task_rows() == [(DJANGO_TASK, [[item.id]], at)]


def test_a_large_enqueue_sends_a_task_per_claim_batch(smtp_server):
    messages = [mail.EmailMessage(f"Hi {n}", "Hello.", "app@example.com", [f"r{n}@example.org"]) for n in range(10)]
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, TASKS="django", CLAIM_BATCH_SIZE=4)):
        items = queue.enqueue_many(messages)
    sent = [args[0] for _, args, _ in task_rows()]
    assert [len(ids) for ids in sent] == [4, 4, 2]
    assert [i for ids in sent for i in ids] == [item.id for item in items]


def test_retry_now_sends_a_task(django_tasks):
    item = queue.enqueue(
        RAW, sender="app@example.com", recipients=["ann@example.org"], at=timezone.now() + timedelta(days=1)
    )
    queue.retry_now(item.id)
    assert [args for _, args, _ in task_rows()] == [[[item.id]], [[item.id]]]
    assert task_rows()[1][2] is None


def test_a_retry_by_domain_sends_a_task_for_a_pass(django_tasks):
    item = queue.enqueue(RAW, sender="app@example.com", recipients=["ann@example.org"])
    store, now = get_store(), timezone.now()
    assert [i.id for i in store.claim(owner="w", now=now, lease_until=now + timedelta(minutes=1), limit=1)] == [item.id]

    later = Outcome(status=RecipientStatus.DEFERRED, reply=Reply(code=451, status="4.3.0", text="later"))
    store.complete(
        item.id,
        owner="w",
        result=AttemptResult(outcomes={"ann@example.org": later}, next_attempt_at=now + timedelta(hours=1)),
    )
    assert queue.retry_deferred(domain="example.org").due == 1
    assert task_rows()[-1] == (DJANGO_TASK, [None], None)


@pytest.mark.redis
def test_on_the_redis_store_the_task_follows_the_add_on_commit(smtp_server, redis_settings):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, TASKS="django", **redis_settings)), use_queue_backend():
        with pytest.raises(RollbackError), transaction.atomic():
            mail.send_mail("Hi", "Hello.", "app@example.com", ["ann@example.org"])
            raise RollbackError
        assert (queue.count(), task_rows()) == (0, [])
        with transaction.atomic():
            mail.send_mail("Hi", "Hello.", "app@example.com", ["ann@example.org"])
            assert (queue.count(), task_rows()) == (0, [])
        (item,) = queue.list()
        assert task_rows() == [(DJANGO_TASK, [[item.id]], None)]


def test_a_backend_that_refuses_the_task_leaves_the_mail_queued_and_says_so(smtp_server, caplog):
    tasks = {"FRAMEWORK": "django", "QUEUE": "mail"}  # django-tasks-db takes only its QUEUES ("default")
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, TASKS=tasks)):
        item = queue.enqueue(RAW, sender="app@example.com", recipients=["ann@example.org"])
    assert queue.get(item.id) is not None
    assert task_rows() == []
    assert "could not send the delivery task of 1 items to django: Queue 'mail' is not valid for backend" in caplog.text


# -- Celery: the task reaches the broker on commit ----------------------------------------


def broker_messages(client, key):
    """The (task name, args) of each message waiting in a Celery queue on Redis."""
    found = []
    for raw in client.lrange(key, 0, -1):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], args))
    return found


@pytest.mark.redis
def test_celery_gets_the_item_ids_on_commit_and_nothing_on_rollback(smtp_server, celery_broker):
    client, key = celery_broker.client, celery_broker.key
    tasks = {"FRAMEWORK": "celery", "QUEUE": celery_broker.queue}
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, TASKS=tasks)):
        celery_sends_on_commit_only(client, key)


def celery_sends_on_commit_only(client, key):
    with pytest.raises(RollbackError), transaction.atomic():
        queue.enqueue(RAW, sender="app@example.com", recipients=["ann@example.org"])
        raise RollbackError
    assert broker_messages(client, key) == []
    with transaction.atomic():
        item = queue.enqueue(RAW, sender="app@example.com", recipients=["ann@example.org"])
        assert broker_messages(client, key) == []
    assert broker_messages(client, key) == [("bumail_queue.deliver_due", [[item.id]])]
    assert b"ann@example.org" not in b"".join(client.lrange(key, 0, -1))


@pytest.mark.redis
def test_celery_leaves_mail_due_later_to_beat(smtp_server, celery_broker):
    client, key = celery_broker.client, celery_broker.key
    with override_settings(
        BUMAIL_QUEUE=smarthost(smtp_server, TASKS={"FRAMEWORK": "celery", "QUEUE": celery_broker.queue})
    ):
        queue.enqueue(
            RAW, sender="app@example.com", recipients=["ann@example.org"], at=timezone.now() + timedelta(hours=1)
        )
    assert broker_messages(client, key) == []


# -- what a task run delivers -------------------------------------------------------------


@pytest.mark.parametrize("store_name", ["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_task_delivers_its_items_only_and_a_duplicate_delivers_nothing_twice(request, smtp_server, store_name):
    store = request.getfixturevalue("redis_settings") if store_name == "redis" else {"STORE": store_name}
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, **store)):
        mine = queue.enqueue(RAW, sender="app@example.com", recipients=["ann@example.org"])
        other = queue.enqueue(RAW, sender="app@example.com", recipients=["bob@example.org"])
        assert run([mine.id])["delivered"] == 1
        assert run([mine.id]) == {"items": 0, "delivered": 0, "deferred": 0, "failed": 0, "store_errors": 0}
        assert [m.rcpt_tos for m in smtp_server.messages] == [["ann@example.org"]]
        assert queue.get(other.id) is not None
        assert run(None)["delivered"] == 1
    assert [m.rcpt_tos for m in smtp_server.messages] == [["ann@example.org"], ["bob@example.org"]]


def test_a_task_leaves_an_item_another_holds_and_one_not_due(smtp_server):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server)):
        held = queue.enqueue(RAW, sender="app@example.com", recipients=["ann@example.org"])
        later = queue.enqueue(
            RAW, sender="app@example.com", recipients=["bob@example.org"], at=timezone.now() + timedelta(hours=1)
        )
        now = timezone.now()
        assert get_store().claim_items([held.id], owner="other-task", now=now, lease_until=now + timedelta(minutes=10))
        assert run([held.id, later.id])["items"] == 0
    assert smtp_server.messages == []


def test_a_task_run_is_bounded_what_it_did_not_start_is_given_back_due(smtp_server):
    # CLAIM_SECONDS 0: one claim, then the run ends once its sessions do.
    tasks = {"FRAMEWORK": "django", "CLAIM_SECONDS": 0.000001}
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, TASKS=tasks, CONCURRENCY=1, CLAIM_BATCH_SIZE=3)):
        items = [queue.enqueue(RAW, sender="app@example.com", recipients=[f"r{n}@example.org"]) for n in range(5)]
        stats = run(None)
        left = queue.list()
    assert stats["delivered"] == 1
    assert len(smtp_server.messages) == 1
    assert len(left) == 4
    now = timezone.now()
    for item in left:
        assert (item.attempts, item.lease_owner) == (0, None)
        assert item.next_attempt_at <= now
    assert {item.id for item in left} < {item.id for item in items}


@pytest.mark.parametrize("ids", ["a-single-id", [1, 2], {"ids": []}])
def test_a_task_given_anything_but_a_list_of_ids_is_refused(ids):
    with pytest.raises(QueueError) as error:
        run(ids)
    assert error.value.code == "INVALID"
    assert "A delivery task takes a list of item ids, or nothing" in error.value.message
