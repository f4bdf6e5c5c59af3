"""django-ses's real backend, its SES client answered by botocore's own Stubber: the
backend's code and botocore's errors for real, and no traffic to AWS.

``ANSWERS`` lists what ``send_raw_email`` answers, one per call: a message id (str),
or an error (``(code, http_status)``).
"""

from __future__ import annotations

from typing import Any

from botocore.stub import Stubber
from django_ses import SESBackend

ANSWERS: list[Any] = []


class StubbedSESBackend(SESBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._throttle = None  # no quota call before each send

    def open(self) -> Any:
        created = super().open()
        stubber = Stubber(self.connection)
        for answer in ANSWERS:
            if isinstance(answer, str):
                stubber.add_response(
                    "send_raw_email", {"MessageId": answer, "ResponseMetadata": {"RequestId": "req-1"}}
                )
            else:
                code, status = answer
                stubber.add_client_error(
                    "send_raw_email",
                    service_error_code=code,
                    service_message=f"{code} said SES",
                    http_status_code=status,
                )
        stubber.activate()
        return created
