"""Django settings for the benchmarks in ``bench/``.

The database comes from ``BENCH_DATABASE_URL`` (any URL dj-database-url reads); without
it, a SQLite file in the system's temporary directory. ``bench/run.py`` sets the
variable for each database it measures. ``BENCH_QUEUE_JSON``, a JSON object, is merged
into ``BUMAIL_QUEUE`` last (``bench/esp_drain.py`` gives its ``ROUTE`` so).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import dj_database_url
import django.core.mail

SECRET_KEY = "bench-only-test-key"
DEBUG = False  # DEBUG would keep every query in memory and slow every call
USE_TZ = True
TIME_ZONE = "UTC"

_DEFAULT_SQLITE = f"sqlite:///{Path(tempfile.gettempdir()) / 'bumail_bench.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(os.environ.get("BENCH_DATABASE_URL", _DEFAULT_SQLITE))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite as Django opens it by default (rollback journal, synchronous=FULL):
    # every commit reaches the disk. Only the wait for the write lock is raised, for
    # the processes that share the file.
    DATABASES["default"]["OPTIONS"] = {"timeout": 30}

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "bumail_queue",
]

# Django 6.1 replaced EMAIL_BACKEND with MAILERS.
if hasattr(django.core.mail, "mailers"):
    MAILERS = {"default": {"BACKEND": "bumail_queue.backends.QueueEmailBackend"}}
else:
    EMAIL_BACKEND = "bumail_queue.backends.QueueEmailBackend"

DEFAULT_FROM_EMAIL = "app@example.com"
# A fixed HOSTNAME, so no measurement waits on socket.getfqdn().
BUMAIL_QUEUE = {"HOSTNAME": "mta.example.com"}
# bench/run.py measures the Redis store with BENCH_REDIS_URL (keys under its own prefix).
if os.environ.get("BENCH_REDIS_URL"):
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "queue": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": os.environ["BENCH_REDIS_URL"]},
    }
    BUMAIL_QUEUE = {**BUMAIL_QUEUE, "STORE": "redis", "REDIS_CONNECTION": "queue", "REDIS_KEY_PREFIX": "bumail:bench:"}
# bench/esp_drain.py runs `python -m django queue_worker` in a process of its own, which
# override_settings cannot reach: the settings it needs (a backend route) come this way.
if os.environ.get("BENCH_QUEUE_JSON"):
    BUMAIL_QUEUE = {**BUMAIL_QUEUE, **json.loads(os.environ["BENCH_QUEUE_JSON"])}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
