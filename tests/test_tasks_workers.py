"""Delivery tasks run by real task workers: django-tasks-db's ``db_worker`` on this run's
database (SQLite or PostgreSQL), and a ``celery worker`` (and ``celery beat``) on the
test Redis. Mail reaches a loopback SMTP server through the task; a rolled-back view
sends no task; duplicated tasks deliver once. Each process is started by the test and
stopped by its pid."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

import pytest
from django.core import mail
from django.db import transaction
from django.test import override_settings

from bumail_queue import queue
from tests.helpers import ROOT, read_all, smarthost, use_queue_backend, wait_until, worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class RollbackError(Exception):
    """Raised in a view's transaction to roll it back."""


def send_in_a_view(subject, to, *, roll_back=False):
    """``send_mail()`` in a view's transaction, committed or rolled back."""
    with contextlib.suppress(RollbackError), transaction.atomic():
        mail.send_mail(subject, "Hello.", "app@example.com", [to])
        if roll_back:
            raise RollbackError


@contextlib.contextmanager
def running(command, env):
    """A task worker process and the lines it printed; SIGTERM to its pid and a wait at the end."""
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, reader = read_all(process)
    try:
        yield process, lines
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        reader.join(5)


# -- django.tasks: django-tasks-db's db_worker --------------------------------------------


def db_worker(settings, name):
    command = [sys.executable, "-m", "django", "db_worker", "--interval", "0.05", "--no-startup-delay", "--no-reload"]
    return running([*command, "--worker-id", name, "-v", "2"], worker_env(settings))


def finished_tasks():
    from django_tasks_db.models import DBTaskResult

    return list(DBTaskResult.objects.filter(status__in=["SUCCESSFUL", "FAILED"]).order_by("enqueued_at"))


def test_db_worker_delivers_a_committed_mail_and_a_rolled_back_view_sends_no_task(smtp_server):
    settings = smarthost(smtp_server, TASKS="django")
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend(), db_worker(settings, "w1") as (_, lines):
        send_in_a_view("Lost", "lost@example.org", roll_back=True)
        send_in_a_view("Hi", "ann@example.org")
        assert wait_until(lambda: len(finished_tasks()) == 1), f"no task ran:\n{''.join(lines)}"
        assert wait_until(lambda: queue.count() == 0)
    (task,) = finished_tasks()
    assert (task.status, task.return_value["delivered"]) == ("SUCCESSFUL", 1)
    assert [m.rcpt_tos for m in smtp_server.messages] == [["ann@example.org"]]


def test_duplicated_db_tasks_on_two_workers_deliver_once(smtp_server):
    from bumail_queue.tasks.django import deliver_due

    settings = smarthost(smtp_server, TASKS="django")
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend():
        send_in_a_view("Hi", "ann@example.org")
        (item,) = queue.list()
        for _ in range(5):  # as a backend that delivers a task twice, or a retried enqueue, would
            deliver_due.enqueue([item.id])
        with db_worker(settings, "w1") as (_, one), db_worker(settings, "w2") as (_, two):
            assert wait_until(lambda: len(finished_tasks()) == 6), f"{''.join(one)}\n{''.join(two)}"
    tasks = finished_tasks()
    assert {task.status for task in tasks} == {"SUCCESSFUL"}
    assert sum(task.return_value["delivered"] for task in tasks) == 1
    assert [m.rcpt_tos for m in smtp_server.messages] == [["ann@example.org"]]
    assert queue.count() == 0


# -- Celery: a worker (and beat) on Redis ----------------------------------------------------


def celery(settings, broker, *args):
    env = {**worker_env(settings), **broker.env}
    command = [sys.executable, "-m", "celery", "-A", "tests.celery_app", *args]
    return running(command, env)


def celery_worker(settings, broker, name):
    flags = ["--pool", "solo", "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "INFO"]
    return celery(settings, broker, "worker", "-n", f"{name}@bumail-test", *flags)


@pytest.mark.redis
def test_a_celery_worker_delivers_a_committed_mail_and_a_rolled_back_view_sends_no_task(smtp_server, celery_broker):
    settings = smarthost(smtp_server, TASKS={"FRAMEWORK": "celery", "QUEUE": celery_broker.queue})
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend():
        with celery_worker(settings, celery_broker, "w1") as (_, lines):
            send_in_a_view("Lost", "lost@example.org", roll_back=True)
            send_in_a_view("Hi", "ann@example.org")
            assert wait_until(lambda: queue.count() == 0, seconds=40), f"not delivered:\n{''.join(lines)}"
            assert wait_until(lambda: celery_broker.client.llen(celery_broker.key) == 0)
        assert sum("bumail_queue.deliver_due[" in line and "succeeded" in line for line in lines) == 1, "".join(lines)
    assert [m.rcpt_tos for m in smtp_server.messages] == [["ann@example.org"]]


@pytest.mark.redis
def test_duplicated_celery_tasks_on_two_workers_deliver_once(smtp_server, celery_broker):
    from bumail_queue.tasks.celery import deliver_due

    settings = smarthost(smtp_server, TASKS={"FRAMEWORK": "celery", "QUEUE": celery_broker.queue})
    with override_settings(BUMAIL_QUEUE=settings), use_queue_backend():
        send_in_a_view("Hi", "ann@example.org")
        (item,) = queue.list()
        for _ in range(5):
            deliver_due.apply_async(args=[[item.id]], queue=celery_broker.queue)
        with (
            celery_worker(settings, celery_broker, "w1") as (_, one),
            celery_worker(settings, celery_broker, "w2") as (
                _,
                two,
            ),
        ):
            done = lambda: sum("bumail_queue.deliver_due[" in line and "succeeded" in line for line in one + two)  # noqa: E731
            assert wait_until(lambda: done() == 6, seconds=40), f"{''.join(one)}\n{''.join(two)}"
    assert [m.rcpt_tos for m in smtp_server.messages] == [["ann@example.org"]]
    assert queue.count() == 0


@pytest.mark.redis
def test_celery_beat_runs_the_pass_that_delivers_mail_no_task_was_sent_for(smtp_server, celery_broker, tmp_path):
    # Mail queued with TASKS off (or whose task was lost): only the periodic pass sends it.
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server)), use_queue_backend():
        send_in_a_view("Hi", "ann@example.org")
    settings = smarthost(smtp_server, TASKS={"FRAMEWORK": "celery", "QUEUE": celery_broker.queue})
    beat_env = {**worker_env(settings), **celery_broker.env, "BUMAIL_TEST_CELERY_BEAT": "0.5"}
    beat = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "beat", "-s", str(tmp_path / "schedule")]
    with (
        override_settings(BUMAIL_QUEUE=settings),
        celery_worker(settings, celery_broker, "w1") as (_, lines),
        running([*beat, "--max-interval", "1", "-l", "INFO"], beat_env) as (_, beat_lines),
    ):
        assert wait_until(lambda: queue.count() == 0, seconds=40), f"{''.join(beat_lines)}\n{''.join(lines)}"
    assert any("Scheduler: Sending due task bumail-queue-deliver-due" in line for line in beat_lines)
    assert [m.rcpt_tos for m in smtp_server.messages] == [["ann@example.org"]]
