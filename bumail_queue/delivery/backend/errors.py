"""What an email backend's exception means for the recipients it was sending to.

Read by the exception's class name and attributes, never by importing the library
that raised it: the queue depends on neither anymail nor django-ses nor botocore, and
a backend of your own raises what it likes.

| raised | meaning | outcome |
| --- | --- | --- |
| anymail's ``AnymailRecipientsRefused`` | the ESP refused every recipient | failed, per recipient where ``anymail_status`` says |
| anymail's ``AnymailUnsupportedFeature``, ``AnymailInvalidAddress``, ``AnymailSerializationError`` | the message asks what the ESP cannot do | failed |
| anymail's ``AnymailAPIError`` with an HTTP status 429 or 5xx | the ESP is busy or down | deferred, ``Retry-After`` honoured as a floor |
| anymail's ``AnymailAPIError`` with another 4xx | the ESP refused the message | failed |
| anymail's ``AnymailAPIError`` without a status (timeout, connection) | the ESP was not reached | deferred |
| botocore's ``ClientError`` (django-ses) with a throttling or service code | SES is busy or down | deferred |
| botocore's ``ClientError`` with ``MessageRejected`` and the like | SES refused the message | failed |
| botocore's connection and timeout errors | SES was not reached | deferred |
| ``smtplib.SMTPRecipientsRefused`` (Django's SMTP backend) | each recipient's reply | per recipient |
| ``smtplib.SMTPResponseException`` | the server's reply | as its code says |
| ``OSError`` (a timeout, a refused connection) | nothing was reached | deferred |
| ``ImproperlyConfigured``, ``ImportError`` | the route is set up wrongly | the worker stops (``BackendConfigurationError``) |
| anything else | not known | deferred, naming the exception's class |
"""

from __future__ import annotations

import dataclasses
import smtplib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from bumail_queue.delivery.smtp.replies import reply_from
from bumail_queue.errors import QueueConfigurationError
from bumail_queue.items import Outcome, RecipientStatus, Reply

#: SES error codes that say "not now", not "not this message".
_SES_TEMPORARY = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "LimitExceededException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalFailure",
        "InternalServerError",
        "RequestTimeout",
    }
)
#: Exceptions (of requests, urllib3, botocore, the standard library) raised before a
#: request could reach the other side.
_NOT_CONNECTED = frozenset(
    {
        "ConnectTimeout",
        "ConnectTimeoutError",
        "NewConnectionError",
        "NameResolutionError",
        "EndpointConnectionError",
        "ConnectionRefusedError",
        "gaierror",
    }
)
#: The most of an exception's text kept in a reply.
_TEXT_LIMIT = 300


class BackendConfigurationError(QueueConfigurationError):
    """A backend route cannot be used as set up: the worker stops, saying why in one line."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    """What a backend's exception decided: each recipient's outcome, and how long to
    wait at least before the next attempt (the ESP's ``Retry-After``)."""

    outcomes: Mapping[str, Outcome]
    retry_after: timedelta | None = None
    #: Nothing reached what could have accepted the message: a FALLBACK may take it.
    unreached: bool = False


def classify(
    error: BaseException, recipients: Sequence[str], *, route_name: str, secrets: Sequence[str] = ()
) -> Failure:
    """Return what ``error``, raised while sending to ``recipients``, means for them.

    ``secrets`` (the route's option values) are cut from any text kept. Raises
    ``BackendConfigurationError`` for a route that cannot work as set up.
    """
    if isinstance(error, ImproperlyConfigured | ImportError):
        raise BackendConfigurationError(
            f"The backend route {route_name!r} cannot be used: {type(error).__name__}: {_text(error, secrets)}"
        ) from None
    names = {cls.__name__ for cls in type(error).__mro__}
    if "AnymailRecipientsRefused" in names:
        return Failure(
            outcomes=dict.fromkeys(
                recipients, _own(5, "5.1.1", f"The ESP refused every recipient: {_text(error, secrets)}")
            )
        )
    if names & {"AnymailUnsupportedFeature", "AnymailInvalidAddress", "AnymailSerializationError"}:
        # This message asks what the ESP cannot do: it never will.
        return Failure(
            outcomes=dict.fromkeys(
                recipients, _own(5, "5.6.0", f"The ESP cannot send this message: {_text(error, secrets)}")
            )
        )
    if "AnymailAPIError" in names:
        return _http_failure(error, recipients, secrets)
    if "ClientError" in names and hasattr(error, "response"):
        return _ses_failure(error, recipients, secrets)
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        return Failure(outcomes={r: _smtp_outcome(*error.recipients.get(r, (451, b"refused"))) for r in recipients})
    if isinstance(error, smtplib.SMTPResponseException):
        return Failure(outcomes=dict.fromkeys(recipients, _smtp_outcome(error.smtp_code, error.smtp_error)))
    if isinstance(error, OSError) or names & {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError"}:
        text = f"The backend was not reached: {type(error).__name__}: {_text(error, secrets)}"
        return dataclasses.replace(_temporary(recipients, text), unreached=not _maybe_sent(error))
    return _temporary(recipients, f"The backend raised {type(error).__name__}: {_text(error, secrets)}")


def _http_failure(error: BaseException, recipients: Sequence[str], secrets: Sequence[str]) -> Failure:
    response = getattr(error, "response", None)
    status = getattr(error, "status_code", None) or getattr(response, "status_code", None)
    text = _text(error, secrets)
    if not isinstance(status, int):
        failure = _temporary(recipients, f"The ESP was not reached: {text}")
        return dataclasses.replace(failure, unreached=not _maybe_sent(error))
    if status == 429 or status >= 500:
        return Failure(
            outcomes=dict.fromkeys(
                recipients, _own(4, "4.3.2" if status >= 500 else "4.7.0", f"The ESP answered HTTP {status}: {text}")
            ),
            retry_after=_retry_after(getattr(response, "headers", None)),
            # An API that failed took nothing; one that says "later" asks to be waited for.
            unreached=status >= 500,
        )
    return Failure(
        outcomes=dict.fromkeys(recipients, _own(5, "5.0.0", f"The ESP refused the message, HTTP {status}: {text}"))
    )


def _ses_failure(error: Any, recipients: Sequence[str], secrets: Sequence[str]) -> Failure:
    code = str(error.response.get("Error", {}).get("Code", ""))
    text = _text(error, secrets)
    if code in _SES_TEMPORARY:
        return _temporary(recipients, f"SES answered {code}: {text}")
    return Failure(outcomes=dict.fromkeys(recipients, _own(5, "5.0.0", f"SES refused the message ({code}): {text}")))


def _maybe_sent(error: BaseException) -> bool:
    """Whether the request may have reached the API before ``error``: a read timeout
    (the request went, no answer came) may hide an accepted message; a refused or
    failed connection, or a timeout while connecting, cannot."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    return not names & _NOT_CONNECTED


def _retry_after(headers: Any) -> timedelta | None:
    """The ``Retry-After`` of a response (seconds, or an HTTP date), if it has one."""
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return None
    value = str(value).strip()
    if value.isdigit():
        return timedelta(seconds=min(int(value), 86400))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(timedelta(0), min(when - timezone.now(), timedelta(days=1)))


def _temporary(recipients: Sequence[str], text: str) -> Failure:
    return Failure(outcomes=dict.fromkeys(recipients, _own(4, "4.4.1", text)))


def _own(kind: int, status: str, text: str) -> Outcome:
    state = RecipientStatus.FAILED if kind == 5 else RecipientStatus.DEFERRED
    return Outcome(status=state, reply=Reply(code=None, status=status, text=text[:512]), names_recipient=False)


def _smtp_outcome(code: int, raw: bytes | str) -> Outcome:
    reply = reply_from(code, raw)
    status = (
        RecipientStatus.DELIVERED
        if 200 <= code < 300
        else RecipientStatus.FAILED
        if code >= 500
        else RecipientStatus.DEFERRED
    )
    return Outcome(status=status, reply=reply)


def _text(error: BaseException, secrets: Sequence[str]) -> str:
    """The exception's text on one line, the secrets cut out before it is shortened."""
    text = str(error)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    return " ".join(text.split())[:_TEXT_LIMIT] or type(error).__name__
