"""The store-neutral values of MTA-STS (RFC 8461) and TLS reporting (RFC 8460).

A domain's policy as fetched (``STSPolicy``), kept by the store so that every worker
applies the one policy, a fetch that failed (``STSFailure``), kept so that no worker
tries it again for a while, and the counts of TLS sessions a day's report is made of
(``TLSSessionCount``). The delivery layer fetches, applies and counts; the stores keep
these values and know nothing of HTTPS or SMTP.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import date, datetime, timedelta

#: RFC 8461 §3.2: ``max_age`` is at most 31557600 seconds (about a year).
MAX_AGE_LIMIT = 31_557_600
#: The most ``mx`` patterns a policy may have: past it the policy is refused as not
#: valid. The 64 KiB a policy may be would hold about 2,900, which every worker would
#: keep and read; real policies name a handful.
MAX_MX_PATTERNS = 100


class STSMode(enum.StrEnum):
    """What a policy asks of senders (RFC 8461 §5)."""

    #: Deliver only to MX hosts the policy names, over TLS with a valid certificate.
    ENFORCE = "enforce"
    #: Deliver as without a policy, and report what would have failed.
    TESTING = "testing"
    #: The domain has no policy in force (it is withdrawing one).
    NONE = "none"


class TLSResult(enum.StrEnum):
    """Why a TLS session, or the policy it needed, failed: RFC 8460 §4.3's result types."""

    STARTTLS_NOT_SUPPORTED = "starttls-not-supported"
    CERTIFICATE_HOST_MISMATCH = "certificate-host-mismatch"
    CERTIFICATE_EXPIRED = "certificate-expired"
    CERTIFICATE_NOT_TRUSTED = "certificate-not-trusted"
    VALIDATION_FAILURE = "validation-failure"
    STS_POLICY_FETCH_ERROR = "sts-policy-fetch-error"
    STS_POLICY_INVALID = "sts-policy-invalid"
    STS_WEBPKI_INVALID = "sts-webpki-invalid"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class STSPolicy:
    """A domain's MTA-STS policy (RFC 8461 §3.2), as fetched at ``fetched_at``.

    ``id`` is the ``_mta-sts`` TXT record's id it was fetched for: a record with
    another id announces a new policy. ``mx`` holds the MX patterns, lowercase, each a
    host name or ``*.`` and a domain. The policy is in force until ``expires_at``.
    """

    domain: str
    id: str
    mode: STSMode
    mx: tuple[str, ...]
    max_age: int
    fetched_at: datetime

    @property
    def expires_at(self) -> datetime:
        """Return when the policy stops applying unless fetched again (``max_age`` after the fetch)."""
        return self.fetched_at + timedelta(seconds=self.max_age)

    def is_fresh_at(self, now: datetime) -> bool:
        """Return whether the policy still applies at ``now``."""
        return now < self.expires_at

    def lines(self) -> tuple[str, ...]:
        """Return the policy as its lines, in RFC 8460's ``policy-string`` form."""
        return (
            "version: STSv1",
            f"mode: {self.mode.value}",
            *(f"mx: {pattern}" for pattern in self.mx),
            f"max_age: {self.max_age}",
        )

    def allows(self, mx_host: str) -> bool:
        """Return whether ``mx_host`` matches one of the policy's ``mx`` patterns (RFC 8461 §4.1).

        A pattern ``*.example.com`` stands for one label in its place: it matches
        ``mx.example.com``, not ``example.com`` nor ``a.mx.example.com``.
        """
        host = mx_host.rstrip(".").lower()
        for pattern in self.mx:
            if pattern.startswith("*."):
                label, _, parent = host.partition(".")
                if label and parent == pattern[2:]:
                    return True
            elif host == pattern:
                return True
        return False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TLSSessionCount:
    """How many TLS sessions of a day to a policy domain ended one way (RFC 8460 §4.4).

    A successful session has ``result`` ``None`` and no ``mx_host``, ``address`` or
    ``reason``; a failure has its result type, and the MX host and address where
    there was one (a policy that could not be fetched has none). ``policy_id`` and
    ``policy`` are those of the policy applied: its TXT id and its lines; a domain
    whose policy could not be had has its TXT id (or ``""``) and no lines.
    ``reason`` is the first failure's text of its kind, for the report's
    ``failure-reason-code``.

    Two counts are of one kind when their day, domain, policy id, result, MX host and
    address are the same: a store adds their ``count``.
    """

    day: date
    domain: str
    policy_id: str
    policy: tuple[str, ...]
    result: TLSResult | None
    mx_host: str = ""
    address: str = ""
    reason: str = ""
    count: int = 1

    @property
    def kind(self) -> tuple[date, str, str, str, str, str]:
        """Return what counts of one kind share (see the class's doc)."""
        return (self.day, self.domain, self.policy_id, self.result or "", self.mx_host, self.address)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class STSFailure:
    """A fetch of ``domain``'s policy ``policy_id`` that failed: no worker fetches that
    policy again before ``until`` (RFC 8461 §3.3 lets senders limit how often they
    fetch). ``result`` and ``reason`` are what the TLS report says of it."""

    domain: str
    policy_id: str
    result: TLSResult
    reason: str
    until: datetime
