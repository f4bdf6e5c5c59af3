"""Delivery through any Django email backend: a ``backend`` route (anymail's ESPs,
django-ses, Django's own SMTP backend, a backend of your own).

``BackendTransport`` hands each envelope to the route's backend as a
``QueuedMessage`` (``message``) and reads back what the backend said of each
recipient; ``errors`` says what a backend's exception means (``docs/routes.md`` has
the table). Importing it imports no ESP library.
"""

from __future__ import annotations

from .errors import BackendConfigurationError, Failure, classify
from .message import QueuedMessage
from .transport import BackendTransport

__all__ = ["BackendConfigurationError", "BackendTransport", "Failure", "QueuedMessage", "classify"]
