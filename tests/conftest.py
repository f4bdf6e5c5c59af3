"""Fixtures and the rules about which database a test needs.

The suite runs once per database: on SQLite (the default) and on PostgreSQL
(``DATABASE_URL=postgres://...``). Tests marked ``postgres`` need PostgreSQL, those
marked ``sqlite`` need SQLite. A test whose database is not the configured one is
deselected and reported; under ``CI`` a selected ``postgres`` test whose server
cannot be reached fails the run instead of being skipped.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from django.db import connections

from bumail_queue.conf import get_settings
from bumail_queue.stores import get_store
from bumail_queue.stores.memory import MemoryStore
from bumail_queue.stores.orm import ORMStore

# Real servers on loopback that tests configure: a DNS server, SMTP servers.
pytest_plugins = ["tests.servers.dns", "tests.servers.smtp"]

VENDOR = {"django.db.backends.postgresql": "postgresql", "django.db.backends.sqlite3": "sqlite"}.get(
    settings.DATABASES["default"]["ENGINE"], "other"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
                host=params["HOST"], port=params["PORT"] or 5432, user=params["USER"], dbname=params["NAME"],
                password=params["PASSWORD"] or None, connect_timeout=5,
            ).close()
        except psycopg.OperationalError as error:
            pytest.exit(f"PostgreSQL is required under CI and cannot be reached: {error}", returncode=3)


@pytest.fixture(autouse=True)
def _fresh_store_cache():
    """Each test starts with stores and settings read anew (a memory store starts empty)."""
    get_settings.cache_clear()
    get_store.cache_clear()
    yield
    get_settings.cache_clear()
    get_store.cache_clear()


@pytest.fixture(params=["memory", "orm"])
def store(request: pytest.FixtureRequest):
    """Every store the contract suite holds to its promises."""
    # Tests using it are marked django_db(transaction=True): the ORM store writes
    # outside any test transaction, as a worker does.
    if request.param == "memory":
        return MemoryStore(get_settings())
    return ORMStore(get_settings())


@pytest.fixture
def orm_store(transactional_db) -> ORMStore:
    return ORMStore(get_settings())


@pytest.fixture
def db_vendor() -> str:
    return connections["default"].vendor
