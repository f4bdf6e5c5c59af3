"""bumail_queue: a durable outgoing mail queue for Django that delivers over SMTP itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .service import QueueService

__all__ = ["__version__", "queue"]


def __getattr__(name: str) -> Any:
    # Lazy, so importing bumail_queue (settings, INSTALLED_APPS) loads no models, and
    # a process start pays neither importlib.metadata nor its scan of the installed
    # distributions for a version nobody asked for.
    if name == "queue":
        from .service import queue

        return queue
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("bumail-queue")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


queue: QueueService
__version__: str
