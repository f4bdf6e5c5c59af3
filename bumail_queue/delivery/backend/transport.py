"""The backend transport: an envelope handed to a Django email backend's ``send_messages()``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import django
from django.utils.module_loading import import_string

from bumail_queue.addresses import normal_address
from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import Delivery, Envelope
from bumail_queue.items import Outcome, RecipientStatus, Reply

from .errors import classify
from .message import QueuedMessage

logger = logging.getLogger(__package__)

# anymail's per-recipient statuses (AnymailRecipientStatus.status): what each decides.
_ACCEPTED = frozenset({"sent", "queued", "scheduled", "unknown"})
_REFUSED = {"invalid": "5.1.1", "rejected": "5.7.1"}


class BackendTransport:
    """Hands envelopes to the Django email backends of ``backend`` routes.

    Each delivery thread keeps one open connection per route (``open()`` once, then
    ``send_messages()`` for each message), so a backend that holds a session or an
    HTTP connection pool reuses it; ``close_idle()`` and ``close()`` close them.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[Any] = []

    def deliver(self, envelope: Envelope, *, route: Route, reuse: bool = True) -> Delivery:
        """Send ``envelope`` through ``route``'s backend; return an outcome for each recipient.

        Raises ``BackendConfigurationError`` when the route cannot work as set up (the
        backend cannot be imported, or refuses its options): the worker stops.
        """
        assert route.backend is not None and route.name is not None
        recipients = list(dict.fromkeys(envelope.recipients))
        message = QueuedMessage(envelope.message, sender=envelope.sender, recipients=recipients)
        connection = None
        try:
            connection = self._connection(route)
            sent = connection.send_messages([message])
        except Exception as error:
            if connection is not None:
                self._drop(route, connection)  # a connection that failed is not kept
            if _refused_each(error, message):
                # anymail says of each recipient why, before it raises: that decides them.
                outcomes, message_ids = _outcomes(message, recipients, 0, route)
                return Delivery(outcomes=outcomes, remote_host=route.name, message_ids=message_ids)
            failure = classify(error, recipients, route_name=route.name, secrets=_secrets(route.options))
            logger.info("%s: the backend %s raised %s", envelope.item_id, route.name, type(error).__name__)
            return Delivery(
                outcomes=failure.outcomes,
                remote_host=route.name,
                retry_after=failure.retry_after,
                unreached=failure.unreached,
            )
        if not reuse:
            self._drop(route, connection)
        outcomes, message_ids = _outcomes(message, recipients, sent, route)
        return Delivery(outcomes=outcomes, remote_host=route.name, message_ids=message_ids)

    def close_idle(self) -> None:
        """Nothing to do: a backend's connection costs nothing while it waits."""

    def close(self) -> None:
        """Close every connection this transport opened, in whatever thread."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            _close(connection)
        self._local = threading.local()

    def _connection(self, route: Route) -> Any:
        kept: dict[str | None, Any] = self._local.__dict__.setdefault("connections", {})
        connection = kept.get(route.name)
        if connection is not None:
            return connection
        # Made as Django makes a mailer: on 6.1 and later with an alias (the route's
        # name), which makes Django's own backends take their options from OPTIONS
        # alone and refuse one they do not know; before, as get_connection() did.
        assert route.backend is not None  # a backend route's, checked with the settings
        backend_class = import_string(route.backend)
        alias = {"alias": route.name} if django.VERSION >= (6, 1) else {}
        connection = backend_class(**alias, **route.options)
        connection.open()
        kept[route.name] = connection
        with self._lock:
            self._connections.append(connection)
        return connection

    def _drop(self, route: Route, connection: Any) -> None:
        self._local.__dict__.get("connections", {}).pop(route.name, None)
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)
        _close(connection)


def _outcomes(
    message: QueuedMessage, recipients: Sequence[str], sent: int | None, route: Route
) -> tuple[dict[str, Outcome], dict[str, str]]:
    """What the backend said of each recipient: anymail's ``anymail_status`` where the
    backend sets it, else one outcome for all from what ``send_messages()`` returned."""
    status = getattr(message, "anymail_status", None)
    by_address = {normal_address(a): s for a, s in (getattr(status, "recipients", None) or {}).items()}
    outcomes: dict[str, Outcome] = {}
    message_ids: dict[str, str] = {}
    name = str(route.name)
    reason = ""
    if any(str(getattr(s, "status", "")) not in _ACCEPTED for s in by_address.values()):
        reason = _esp_reason(message, _secrets(route.options))
    # django-ses says the SES message id in the message's extra headers.
    ses_id = message.extra_headers.get("message_id") if sent else None
    for recipient in recipients:
        said = by_address.get(normal_address(recipient))
        if said is None:
            outcomes[recipient] = _unnamed(sent, name)
            if ses_id:
                message_ids[recipient] = str(ses_id)
            continue
        message_id = getattr(said, "message_id", None)
        if message_id is not None and str(message_id):  # the test backend's first is 0
            message_ids[recipient] = str(message_id)
        outcomes[recipient] = _said(str(getattr(said, "status", "unknown")), message_id, name, reason)
    return outcomes, message_ids


def _refused_each(error: BaseException, message: QueuedMessage) -> bool:
    """Whether ``error`` is anymail's "every recipient refused", with each one's status set."""
    names = {cls.__name__ for cls in type(error).__mro__}
    status = getattr(message, "anymail_status", None)
    return "AnymailRecipientsRefused" in names and bool(getattr(status, "recipients", None))


def _esp_reason(message: QueuedMessage, secrets: Sequence[str]) -> str:
    """What the ESP's answer said, where it says it in a JSON field of the usual names,
    the route's secrets cut out."""
    response = getattr(getattr(message, "anymail_status", None), "esp_response", None)
    try:
        data = response.json() if response is not None else None
    except Exception:  # not JSON: nothing more to say
        return ""
    if isinstance(data, dict):
        for key in ("Message", "message", "error", "detail"):
            if isinstance(data.get(key), str):
                text = data[key]
                for secret in secrets:
                    text = text.replace(secret, "[redacted]")
                return " ".join(text.split())[:300]
    return ""


def _said(status: str, message_id: object, name: str, reason: str = "") -> Outcome:
    about = f" (message id {message_id})" if message_id is not None and str(message_id) else ""
    if reason:
        about += f": {reason}"
    if status in _ACCEPTED:
        return Outcome(
            status=RecipientStatus.DELIVERED,
            reply=Reply(code=None, status="2.0.0", text=f"Accepted by {name}: {status}{about}"),
        )
    if status in _REFUSED:
        return Outcome(
            status=RecipientStatus.FAILED,
            reply=Reply(code=None, status=_REFUSED[status], text=f"Refused by {name}: {status}{about}"),
        )
    return Outcome(
        status=RecipientStatus.DEFERRED,
        reply=Reply(code=None, status="4.0.0", text=f"Not sent by {name}: {status}{about}"),
        names_recipient=False,
    )


def _unnamed(sent: int | None, name: str) -> Outcome:
    """The outcome of a recipient the backend said nothing of in particular."""
    if sent:
        return Outcome(status=RecipientStatus.DELIVERED, reply=Reply(code=None, status="2.0.0", text=f"Sent by {name}"))
    return Outcome(
        status=RecipientStatus.DEFERRED,
        reply=Reply(code=None, status="4.0.0", text=f"{name} sent nothing and raised nothing"),
        names_recipient=False,
    )


def _secrets(options: Mapping[str, Any]) -> list[str]:
    """The option values that could be secrets, to cut from any text kept."""
    return [str(value) for value in options.values() if isinstance(value, str | bytes) and len(value) >= 4]


def _close(connection: Any) -> None:
    try:
        connection.close()
    except Exception as error:  # closing is a courtesy
        logger.debug("closing a backend's connection failed: %s", type(error).__name__)
