"""The queue stores, behind one base class; ``get_store()`` builds the configured one."""

from __future__ import annotations

import functools

from django.utils.module_loading import import_string

from bumail_queue.conf import BUILTIN_STORES, QueueSettings, get_settings
from bumail_queue.errors import QueueConfigurationError

from .base import QueueStore

__all__ = ["QueueStore", "get_store", "store_from_settings"]


def store_from_settings(settings: QueueSettings) -> QueueStore:
    """Build the store ``settings.store`` names: a built-in alias or a dotted path."""
    path = BUILTIN_STORES.get(settings.store, settings.store)
    try:
        store_class = import_string(path)
    except ImportError as error:
        raise QueueConfigurationError(
            f"BUMAIL_QUEUE['STORE'] is {settings.store!r}, which cannot be imported: {error}."
        ) from error
    if not (isinstance(store_class, type) and issubclass(store_class, QueueStore)):
        raise QueueConfigurationError(
            f"BUMAIL_QUEUE['STORE'] is {settings.store!r}, which is not a QueueStore subclass."
        )
    try:
        return store_class(settings)
    except TypeError as error:  # an abstract method left unimplemented, a wrong signature
        raise QueueConfigurationError(
            f"BUMAIL_QUEUE['STORE'] is {settings.store!r}, which cannot be built: {error}."
        ) from error


@functools.cache
def get_store() -> QueueStore:
    """Return the project's store, built once from ``BUMAIL_QUEUE`` (rebuilt on change)."""
    return store_from_settings(get_settings())
