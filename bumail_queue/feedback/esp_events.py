"""ESP events: anymail's ``tracking`` signal fed to the same suppression list.

A site that sends through an ESP (a backend route) includes anymail's webhook URLs;
anymail turns each ESP's webhook into an ``AnymailTrackingEvent`` and sends its
``tracking`` signal. Connected when ``"anymail"`` is in ``INSTALLED_APPS``, this
receiver acts on the events that say a recipient must not be mailed again, as
anymail normalises them:

- ``bounced``, and ``rejected`` for an invalid or bounced address: a hard bounce
  (suppressed ``bounced``, the ``bounced`` signal, a ``bounced`` log entry);
- ``complained``: suppressed ``complained``, the ``complained`` signal;
- ``unsubscribed``: suppressed ``unsubscribed``, the ``unsubscribed`` signal.

The event's ``message_id`` is the one the queue recorded in the delivery log when the
route sent the message (``provider_message_id``): that finds the item. An error here
(the store down) reaches anymail's view, which answers the ESP with an error, and the
ESP sends the event again later.
"""

from __future__ import annotations

from typing import Any

from bumail_queue.addresses import normal_address
from bumail_queue.conf import get_settings
from bumail_queue.items import Reply
from bumail_queue.models import DeliveryLog

from .processing import Event, record


def connect() -> None:
    from anymail.signals import tracking

    tracking.connect(_on_tracking, dispatch_uid="bumail_queue.feedback.esp_events")


def _on_tracking(sender: Any, event: Any, esp_name: str, **kwargs: Any) -> None:
    kind = _kind_of(str(event.event_type or ""), str(event.reject_reason or ""))
    if kind is None or not event.recipient:
        return
    recipient = normal_address(str(event.recipient))
    said = " ".join(str(part) for part in (event.mta_response or event.description or "",) if part)
    reply = Reply(
        code=None,
        status="5.0.0" if kind == "hard" else "",
        text=f"{esp_name} {event.event_type}{': ' + said if said else ''}"[:512],
    )
    item_id = _item_of(event.message_id, recipient)
    record([Event(kind=kind, recipient=recipient, item_id=item_id, reply=reply)], source=f"anymail:{esp_name.lower()}")


def _kind_of(event_type: str, reject_reason: str) -> str | None:
    if event_type == "bounced" or (event_type == "rejected" and reject_reason in ("invalid", "bounced")):
        return "hard"
    return {"complained": "complaint", "unsubscribed": "unsubscribe"}.get(event_type)


def _item_of(message_id: object, recipient: str) -> str | None:
    """The item the ESP's message id was recorded for, to this recipient."""
    settings = get_settings()
    if not message_id or not settings.delivery_log:
        return None
    entries = DeliveryLog.objects.using(settings.database).filter(provider_message_id=str(message_id))
    found = entries.filter(recipient=recipient).values_list("item_id", flat=True).first()
    if found is None:
        found = entries.values_list("item_id", flat=True).first()
    return None if found is None else str(found)
