"""Settings for the test suite: SQLite by default, PostgreSQL with DATABASE_URL."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from pathlib import Path

import dj_database_url
import django.core.mail

BASE_DIR = Path(__file__).resolve().parent

if os.environ.get("BUMAIL_TEST_CLOCK_AHEAD"):
    # A worker process a test starts "later": its whole clock moved ahead, so that a
    # quota's day passes without a day's wait. Set before any module takes the clock.
    import datetime

    import django.utils.timezone

    _AHEAD = datetime.timedelta(seconds=float(os.environ["BUMAIL_TEST_CLOCK_AHEAD"]))
    _real_now = django.utils.timezone.now
    django.utils.timezone.now = lambda: _real_now() + _AHEAD

SECRET_KEY = "tests-only-not-a-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

# A file database (not :memory:) so that tests which start worker processes share it.
_SQLITE = f"sqlite:///{Path(tempfile.gettempdir()) / 'bumail-queue-dev.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(os.environ.get("DATABASE_URL") or _SQLITE, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # One file per test run, so that runs side by side never share a database;
    # worker processes started by a test are given this name.
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.get("BUMAIL_TEST_SQLITE")
        or str(Path(tempfile.gettempdir()) / f"bumail-queue-test-{os.getpid()}.sqlite3")
    }
    DATABASES["default"]["OPTIONS"] = {"timeout": 30}
else:
    # Likewise one test database per run on a shared server.
    DATABASES["default"]["TEST"] = {"NAME": f"test_bumail_queue_{os.getpid()}"}

# The Redis store's tests use the "queue" alias (REDIS_CONNECTION), each under a key
# prefix of its own; the default cache stays in memory.
REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "queue": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL},
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "bumail_queue",
    "tests.testapp",
    # The delivery tasks' tests (tests/test_tasks_django.py): the database task backend,
    # on Django 5.2 through the django-tasks backport of Django 6's django.tasks.
    "django_tasks_db",
]
if not importlib.util.find_spec("django.tasks"):
    INSTALLED_APPS.append("django_tasks")
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.testapp.urls"
# anymail's webhook views, served by tests.testapp.urls (tests/feedback/test_esp_events.py).
# Not in INSTALLED_APPS: a worker's start would import it, and the tests of what a
# start imports count it; its tests connect the queue's receiver themselves.
ANYMAIL = {"WEBHOOK_SECRET": "hooks:tests-only-not-a-secret"}
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# Django 6.1 replaced EMAIL_BACKEND with MAILERS; each version gets its own form.
if hasattr(django.core.mail, "mailers"):
    MAILERS = {"default": {"BACKEND": "bumail_queue.backends.QueueEmailBackend"}}
else:
    EMAIL_BACKEND = "bumail_queue.backends.QueueEmailBackend"

DEFAULT_FROM_EMAIL = "app@example.com"
BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com"}
# Worker processes started by a test get their queue settings through the environment.
if os.environ.get("BUMAIL_TEST_QUEUE"):
    BUMAIL_QUEUE = json.loads(os.environ["BUMAIL_TEST_QUEUE"])
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
