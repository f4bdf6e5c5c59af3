"""Fixtures and the rules about which database a test needs.

The suite runs once per database: on SQLite (the default) and on PostgreSQL
(``DATABASE_URL=postgres://...``). Tests marked ``postgres`` need PostgreSQL, those
marked ``sqlite`` need SQLite. A test whose database is not the configured one is
deselected and reported; under ``CI`` a selected ``postgres`` test whose server
cannot be reached fails the run instead of being skipped.

Tests marked ``redis`` (the Redis store's, in every run) need the Redis at
``REDIS_URL`` (``redis://127.0.0.1:6379/0`` by default), each under a key prefix of
its own. Without it they are deselected and reported; under ``CI`` the run fails.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connections

from bumail_queue.conf import get_settings
from bumail_queue.stores import get_store
from bumail_queue.stores.memory import MemoryStore
from bumail_queue.stores.orm import ORMStore
from bumail_queue.stores.redis import RedisStore
from tests.dkim_keys import TestKeys

# Real servers on loopback that tests configure: a DNS server, SMTP servers, Redis servers,
# HTTPS servers of MTA-STS policies, an IMAP and POP3 server.
pytest_plugins = [
    "tests.servers.dns",
    "tests.servers.smtp",
    "tests.servers.redis",
    "tests.servers.https",
    "tests.servers.esp",
    "tests.servers.dovecot",
]

VENDOR = {"django.db.backends.postgresql": "postgresql", "django.db.backends.sqlite3": "sqlite"}.get(
    settings.DATABASES["default"]["ENGINE"], "other"
)


#: The CACHES alias of the test Redis (settings.REDIS_URL); each test keeps its keys
#: under a prefix of its own (the ``redis_prefix`` fixture).
REDIS_ALIAS = "queue"


def redis_unreachable() -> str | None:
    """Return why the test Redis cannot be used, or ``None`` when it answers."""
    import redis

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=5).ping()
    except redis.RedisError as error:
        return str(error) or type(error).__name__
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _deselect_redis_tests_without_redis(config, items)
    keep, drop = [], []
    for item in items:
        needs = {"postgres": "postgresql", "sqlite": "sqlite"}
        wanted = [vendor for mark, vendor in needs.items() if item.get_closest_marker(mark)]
        (drop if wanted and VENDOR not in wanted else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"bumail_queue: {len(drop)} tests deselected: they need another database than {VENDOR} "
                "(run again with DATABASE_URL set, as tox's -postgres envs do)."
            )


def pytest_sessionstart(session: pytest.Session) -> None:
    if VENDOR == "postgresql" and os.environ.get("CI"):
        # A CI run with PostgreSQL tests must reach the server, not skip them.
        import psycopg

        params = settings.DATABASES["default"]
        try:
            psycopg.connect(
                host=params["HOST"],
                port=params["PORT"] or 5432,
                user=params["USER"],
                dbname=params["NAME"],
                password=params["PASSWORD"] or None,
                connect_timeout=5,
            ).close()
        except psycopg.OperationalError as error:
            pytest.exit(f"PostgreSQL is required under CI and cannot be reached: {error}", returncode=3)


def _deselect_redis_tests_without_redis(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under CI a Redis that cannot be reached fails the run; elsewhere its tests are
    # deselected and reported, as those of a database other than the configured one.
    wanting = [item for item in items if item.get_closest_marker("redis")]
    reason = redis_unreachable() if wanting else None
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.exit(f"Redis is required under CI and cannot be reached at {settings.REDIS_URL}: {reason}", returncode=3)
    config.hook.pytest_deselected(items=wanting)
    items[:] = [item for item in items if not item.get_closest_marker("redis")]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"bumail_queue: {len(wanting)} tests deselected: Redis cannot be reached at {settings.REDIS_URL} "
            f"({reason}); set REDIS_URL, as CI does."
        )


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's test databases, dropped only once no other session uses them.

    A thread that ended without closing its database connection leaves it to the
    garbage collector: Django's connection objects hold reference cycles, so only a
    collection closes them, and PostgreSQL refuses to drop a database while one is
    open (the tests' threads close theirs; this is for the one that slips).
    """
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _fresh_store_cache():
    """Each test starts with stores and settings read anew (a memory store starts empty)."""
    get_settings.cache_clear()
    get_store.cache_clear()
    yield
    get_settings.cache_clear()
    get_store.cache_clear()


@pytest.fixture(params=["memory", "orm", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest):
    """Every store the contract suite holds to its promises."""
    # Tests using it are marked django_db(transaction=True): the ORM store writes
    # outside any test transaction, as a worker does.
    if request.param == "memory":
        return MemoryStore(get_settings())
    if request.param == "redis":
        return request.getfixturevalue("redis_store")
    return ORMStore(get_settings())


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A ``REDIS_KEY_PREFIX`` no other test uses; its keys are deleted after the test."""
    prefix = f"bumail:test:{uuid.uuid4().hex[:16]}:"
    yield prefix
    from django_redis import get_redis_connection

    client = get_redis_connection(REDIS_ALIAS)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def redis_settings(redis_prefix: str) -> dict[str, str]:
    """The ``BUMAIL_QUEUE`` keys of a Redis store under this test's own prefix."""
    return {"STORE": "redis", "REDIS_CONNECTION": REDIS_ALIAS, "REDIS_KEY_PREFIX": redis_prefix}


@pytest.fixture
def redis_store(redis_prefix: str) -> RedisStore:
    """An empty Redis store under this test's own prefix."""
    settings = dataclasses.replace(
        get_settings(), store="redis", redis_connection=REDIS_ALIAS, redis_key_prefix=redis_prefix
    )
    return RedisStore(settings)


@pytest.fixture
def orm_store(transactional_db) -> ORMStore:
    return ORMStore(get_settings())


@pytest.fixture
def db_vendor() -> str:
    return connections["default"].vendor


@pytest.fixture(scope="session")
def dkim_keys() -> TestKeys:
    """DKIM keys made once for the session (RSA of 2,048, 1,024 and 768 bits, Ed25519)."""
    return TestKeys.make()


@dataclasses.dataclass(frozen=True)
class CeleryBroker:
    """A Celery app on the test Redis, under a key prefix and a queue of one test's own."""

    prefix: str
    queue: str
    client: object  # the redis client, to read the queue's messages

    @property
    def key(self) -> str:
        """The Redis list of the queue's waiting messages."""
        return f"{self.prefix}{self.queue}"

    @property
    def env(self) -> dict[str, str]:
        """What a ``celery -A tests.celery_app`` process needs to use the same broker."""
        return {"BUMAIL_TEST_CELERY_PREFIX": self.prefix, "BUMAIL_TEST_CELERY_QUEUE": self.queue}


@pytest.fixture
def celery_broker() -> Iterator[CeleryBroker]:
    """This process's default Celery app for the test (tests/celery_app.py); its keys are
    deleted after the test."""
    from django_redis import get_redis_connection

    from tests.celery_app import make_app

    broker = CeleryBroker(
        prefix=f"bumail:test:{uuid.uuid4().hex[:12]}:celery:",
        queue=f"bumail-{uuid.uuid4().hex[:8]}",
        client=get_redis_connection(REDIS_ALIAS),
    )
    app = make_app(prefix=broker.prefix, queue=broker.queue)
    app.set_current()
    app.set_default()
    try:
        yield broker
    finally:
        app.close()
        keys = list(broker.client.scan_iter(match=f"{broker.prefix}*"))
        if keys:
            broker.client.delete(*keys)
