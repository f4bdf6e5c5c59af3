"""Settings of the bumail_queue example project.

A local demo, not a deployment: DEBUG is on and the secret key has a demo default.
The environment can change a few things:

- ``DATABASE_URL``: the database (any URL dj-database-url reads); SQLite otherwise,
  in ``DEMO_DB_PATH`` or ``demo.sqlite3`` beside ``manage.py``;
- ``REDIS_URL``: a django-redis cache as ``CACHES["default"]`` (needs django-redis);
- ``DEMO_SMTP_PORT``: the port of the SMTP server on 127.0.0.1 that the queue
  delivers to (``demo.py`` starts a sink there), 1025 by default;
- ``DJANGO_SECRET_KEY``: the secret key.
"""

from __future__ import annotations

import os
from pathlib import Path

import django.core.mail

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-insecure-key-never-use-it-outside-this-example")
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "bumail_queue",
    "mailing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

# -- database -------------------------------------------------------------------------

if os.environ.get("DATABASE_URL"):
    import dj_database_url

    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=60, conn_health_checks=True)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("DEMO_DB_PATH") or str(BASE_DIR / "demo.sqlite3"),
            # The web server and a worker share the file: wait for a lock, don't fail.
            "OPTIONS": {"timeout": 20},
        }
    }
# Each request runs in one transaction: mail sent by a view that then fails is never queued.
DATABASES["default"]["ATOMIC_REQUESTS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- cache ------------------------------------------------------------------------------

if os.environ.get("REDIS_URL"):
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ["REDIS_URL"],
        }
    }

# -- mail -------------------------------------------------------------------------------

# Django 6.1 replaced EMAIL_BACKEND with MAILERS; each version gets its own form.
if hasattr(django.core.mail, "mailers"):
    MAILERS = {"default": {"BACKEND": "bumail_queue.backends.QueueEmailBackend"}}
else:
    EMAIL_BACKEND = "bumail_queue.backends.QueueEmailBackend"

DEFAULT_FROM_EMAIL = "Demo <demo@example.com>"
SERVER_EMAIL = "demo@example.com"

DEMO_SMTP_PORT = int(os.environ.get("DEMO_SMTP_PORT", "1025"))

BUMAIL_QUEUE = {
    "HOSTNAME": "localhost",
    # Every recipient goes to the local SMTP sink, whatever its domain: nothing leaves
    # this machine.
    "ROUTE": {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": DEMO_SMTP_PORT, "TLS": "none"},
}

# -- the rest ---------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
