"""The commands against a store they cannot use: one line on stderr, a non-zero exit.

Each command runs as its own process (``python -m django``), as cron or an operator
runs it, with the store broken in the ways a new deployment meets: a database that
does not exist or does not answer, tables not migrated, a Redis that is down or may
evict the queue's keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.servers.smtp import closed_port

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

WORKER = ("queue_worker", "--burst")
STATUS = ("queue_status",)
STATUS_JSON = ("queue_status", "--json")
PURGE = ("queue_purge", "--older-than", "30d")
RETRY = ("queue_retry",)
RETRY_DOMAIN = ("queue_retry", "--domain", "example.org")
RETRY_CHANNEL = ("queue_retry", "--channel", "news")
HOLD = ("queue_hold", "--all")
RELEASE = ("queue_release", "--domain", "example.org")
CANCEL = ("queue_cancel", "--recipient", "*@example.org")
BULK = (RETRY_CHANNEL, HOLD, RELEASE, CANCEL)
TLSRPT = ("queue_tlsrpt", "--date", "2026-01-01")
SUPPRESSED = ("queue_suppression", "list")
UNSUPPRESS = ("queue_suppression", "remove", "--domain", "example.org")


def run(args, *, database_url, queue=None, redis_url=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUMAIL_", "DJANGO_"))}
    env.update(PYTHONPATH=str(ROOT), DATABASE_URL=database_url)
    env["BUMAIL_TEST_QUEUE"] = json.dumps({"HOSTNAME": "mta.example.com", **(queue or {})})
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return subprocess.run(
        [sys.executable, "-m", "django", *args, "--settings=tests.settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def assert_one_line_error(done, *words):
    """The process failed, said why on its last line, and printed no traceback."""
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("CommandError: ")]
    assert errors == [done.stderr.strip().splitlines()[-1]], done.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def unmigrated_sqlite(tmp_path):
    return f"sqlite:///{tmp_path / 'never-migrated.sqlite3'}"


@pytest.mark.parametrize(
    "args",
    [WORKER, STATUS, STATUS_JSON, PURGE, RETRY, RETRY_DOMAIN, *BULK, TLSRPT, SUPPRESSED, UNSUPPRESS],
    ids=" ".join,
)
def test_an_unmigrated_database_is_one_line_and_a_failure(tmp_path, args):
    done = run(args, database_url=unmigrated_sqlite(tmp_path))
    assert_one_line_error(done, "has manage.py migrate run?", "no such table")


@pytest.mark.parametrize("args", [WORKER, STATUS, PURGE, RETRY, HOLD, SUPPRESSED], ids=" ".join)
def test_a_postgresql_nobody_listens_for_is_one_line_and_a_failure(args):
    done = run(args, database_url=f"postgres://postgres@127.0.0.1:{closed_port()}/postgres")
    assert_one_line_error(done, "could not be used", "Connection refused")


@pytest.mark.postgres
@pytest.mark.parametrize("args", [WORKER, STATUS, PURGE], ids=" ".join)
def test_a_postgresql_database_that_does_not_exist_is_one_line_and_a_failure(args):
    params = settings.DATABASES["default"]
    url = f"postgres://{params['USER']}@{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}/bumail_queue_no_such_database"
    done = run(args, database_url=url)
    assert_one_line_error(done, "bumail_queue_no_such_database", "does not exist")


@pytest.mark.parametrize(
    "args", [WORKER, STATUS, STATUS_JSON, RETRY, RETRY_DOMAIN, *BULK, TLSRPT, SUPPRESSED, UNSUPPRESS], ids=" ".join
)
def test_a_redis_that_is_down_is_one_line_and_a_failure(tmp_path, args):
    queue = {"STORE": "redis", "REDIS_CONNECTION": "queue"}
    done = run(
        args,
        database_url=unmigrated_sqlite(tmp_path),
        queue=queue,
        redis_url=f"redis://127.0.0.1:{closed_port()}/0",
    )
    assert_one_line_error(done, "Redis could not be reached through CACHES['queue']")
    # manage.py's checks could not read the eviction policy, and said so as a warning.
    assert "bumail_queue.W003" in done.stderr


@pytest.mark.redis
def test_the_worker_will_not_start_on_a_redis_that_may_evict(tmp_path, redis_servers):
    server = redis_servers("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    queue = {"STORE": "redis", "REDIS_CONNECTION": "queue"}
    database = unmigrated_sqlite(tmp_path)
    # Not even a lasting worker (no --burst): it exits instead of running on.
    done = run(
        ("queue_worker", "--skip-checks"),
        database_url=database,
        queue=queue,
        redis_url=server.url,
    )
    assert_one_line_error(done, "maxmemory-policy 'allkeys-lru'", "noeviction")
    assert "starting" not in done.stdout
    # With its checks, the worker stops at the check that reads the same policy.
    done = run(
        ("queue_worker", "--burst"),
        database_url=database,
        queue=queue,
        redis_url=server.url,
    )
    assert done.returncode != 0
    assert "(bumail_queue.E022)" in done.stderr and "Traceback" not in done.stderr
    client = server.client()
    assert client.dbsize() == 0
    client.close()


@pytest.mark.redis
def test_a_burst_whose_claims_the_store_refuses_fails(tmp_path, redis_servers):
    # The store answers the start-up read (ZCARD) but refuses the claim script's reads:
    # the run cannot tell whether anything was due, so it must not exit 0.
    server = redis_servers()
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "default", "-zrangebyscore")
    admin.close()
    queue = {"STORE": "redis", "REDIS_CONNECTION": "queue", "POLL_SECONDS": 0.1}
    done = run(
        (*WORKER, "--skip-checks"),
        database_url=unmigrated_sqlite(tmp_path),
        queue=queue,
        redis_url=server.url,
    )
    assert_one_line_error(done, "failed 1 time during this run", "due mail may be left")
    assert "STORE_UNAVAILABLE: Could not claim items" in done.stdout  # the log says which call failed


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("queue_purge", "--older-than", "999999d"), "argument --older-than: '999999d' is longer than 36500 days"),
        (("queue_purge", "--batch-size", "100000000000000000000"), "argument --batch-size: '100000000000000000000' is more than 10000"),
        (("queue_status", "--top", "0"), "argument --top: '0' must be 1 or more"),
        (("queue_worker", "--concurrency", "-1"), "argument --concurrency: '-1' must be 1 or more"),
        (("queue_tlsrpt", "--date", "2026-1-1"), "argument --date: '2026-1-1' is not a day written YYYY-MM-DD"),
        (("queue_tlsrpt", "--date", "2026-02-30"), "argument --date: '2026-02-30' is not a day written YYYY-MM-DD"),
    ],
    ids=["older-than", "batch-size", "top", "concurrency", "date", "no-such-day"],
)  # fmt: skip
def test_an_argument_out_of_range_is_one_line_and_a_failure(tmp_path, args, said):
    done = run(args, database_url=unmigrated_sqlite(tmp_path))
    assert done.returncode == 2  # argparse's usage error
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(said), done.stderr
