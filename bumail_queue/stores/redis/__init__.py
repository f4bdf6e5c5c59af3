"""The Redis store (``BUMAIL_QUEUE = {"STORE": "redis"}``); needs django-redis."""

from __future__ import annotations

from importlib.util import find_spec

if find_spec("django_redis") is None:
    raise ImportError("The Redis store needs django-redis: pip install 'bumail-queue[redis]'.")

from .layout import RedisKeys
from .store import RedisStore

__all__ = ["RedisKeys", "RedisStore"]
