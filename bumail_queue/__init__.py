"""bumail_queue: a durable outgoing mail queue for Django that delivers over SMTP itself."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .service import QueueService

try:
    __version__ = version("bumail-queue")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = ["__version__", "queue"]


def __getattr__(name: str) -> Any:
    # Lazy, so importing bumail_queue (settings, INSTALLED_APPS) loads no models.
    if name == "queue":
        from .service import queue

        return queue
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


queue: QueueService
