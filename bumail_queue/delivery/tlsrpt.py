"""SMTP TLS reporting (RFC 8460): what a TLS failure is called, the counts, the report.

A worker adds up the TLS sessions it opened under MTA-STS policies, by kind, in
memory (``TLSReportCounter``), and hands them to the store every few seconds and when
it stops: one write now and then, rather than one per session. ``reports()`` turns a
day's counts into one RFC 8460 report per policy domain (``manage.py queue_tlsrpt``).
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import date
from typing import Any, Protocol

from bumail_queue.errors import QueueError
from bumail_queue.sts import TLSResult, TLSSessionCount

__all__ = ["FLUSH_SECONDS", "TLSReportCounter", "TLSReportStore", "certificate_failure", "reports"]

logger = logging.getLogger(__name__)

#: How often a worker writes the TLS sessions it counted, at most.
FLUSH_SECONDS = 10.0

# OpenSSL's verification codes (x509_vfy.h) and the RFC 8460 §4.3.1 result type of each.
_CERTIFICATE_RESULTS = {
    10: TLSResult.CERTIFICATE_EXPIRED,  # X509_V_ERR_CERT_HAS_EXPIRED
    62: TLSResult.CERTIFICATE_HOST_MISMATCH,  # X509_V_ERR_HOSTNAME_MISMATCH
    64: TLSResult.CERTIFICATE_HOST_MISMATCH,  # X509_V_ERR_IP_ADDRESS_MISMATCH
    2: TLSResult.CERTIFICATE_NOT_TRUSTED,  # X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT
    18: TLSResult.CERTIFICATE_NOT_TRUSTED,  # X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
    19: TLSResult.CERTIFICATE_NOT_TRUSTED,  # X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN
    20: TLSResult.CERTIFICATE_NOT_TRUSTED,  # X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY
    21: TLSResult.CERTIFICATE_NOT_TRUSTED,  # X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE
    27: TLSResult.CERTIFICATE_NOT_TRUSTED,  # X509_V_ERR_CERT_UNTRUSTED
}


def certificate_failure(error: BaseException) -> tuple[TLSResult, str] | None:
    """Return the result type of a certificate that failed verification, and what was
    wrong in a few words; ``None`` when ``error`` is no certificate's failure."""
    cause = next(
        (e for e in (error, error.__cause__, error.__context__) if isinstance(e, ssl.SSLCertVerificationError)), None
    )
    if cause is None:
        return None
    result = _CERTIFICATE_RESULTS.get(cause.verify_code, TLSResult.VALIDATION_FAILURE)
    return result, str(cause.verify_message or cause.reason or cause).rstrip(".")


class TLSReportStore(Protocol):
    """Where TLS session counts are added up (``QueueStore.count_tls_sessions``)."""

    def count_tls_sessions(self, counts: Sequence[TLSSessionCount]) -> None: ...


class TLSReportCounter:
    """Adds up TLS session counts by kind, and writes them to ``store`` at most every
    ``flush_seconds`` (and at ``flush()``). Thread-safe.

    A write that fails keeps its counts for the next one; counts not written when the
    process dies are lost, which a report can bear.
    """

    def __init__(
        self,
        store: TLSReportStore,
        *,
        flush_seconds: float = FLUSH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._flush_seconds = flush_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[Any, ...], TLSSessionCount] = {}
        self._flushed_at = clock()

    def add(self, counts: Iterable[TLSSessionCount]) -> None:
        """Add ``counts`` to those not written yet."""
        with self._lock:
            self._merge(counts)

    def pending(self) -> list[TLSSessionCount]:
        """Return the counts not written yet."""
        with self._lock:
            return list(self._counts.values())

    def flush_if_due(self) -> None:
        """Write the counts when ``flush_seconds`` have passed since the last write."""
        if self._clock() - self._flushed_at >= self._flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Write every count not written yet, in one call of the store."""
        with self._lock:
            counts, self._counts = list(self._counts.values()), {}
            self._flushed_at = self._clock()
        if not counts:
            return
        try:
            self._store.count_tls_sessions(counts)
        except Exception as error:  # a report never stops delivery
            text = error.message if isinstance(error, QueueError) else f"{type(error).__name__}: {error}"
            logger.warning("TLS report counts not written, kept for the next try: %s", text)
            with self._lock:
                self._merge(counts)

    def _merge(self, counts: Iterable[TLSSessionCount]) -> None:
        for count in counts:
            known = self._counts.get(count.kind)
            if known is None:
                self._counts[count.kind] = count
            else:
                self._counts[count.kind] = dataclasses.replace(known, count=known.count + count.count)


def reports(
    counts: Iterable[TLSSessionCount], *, day: date, organization: str, contact: str, sender: str
) -> list[dict[str, Any]]:
    """Return the RFC 8460 report (§4.4) of each policy domain of ``day``'s counts, by domain.

    ``organization`` and ``contact`` are the reporter's ``organization-name`` and
    ``contact-info``; ``sender`` (the MTA's host name) makes each ``report-id`` unique.
    """
    by_domain: dict[str, dict[tuple[str, tuple[str, ...]], list[TLSSessionCount]]] = {}
    for count in counts:
        if count.day == day:
            by_domain.setdefault(count.domain, {}).setdefault((count.policy_id, count.policy), []).append(count)
    return [
        {
            "organization-name": organization,
            "date-range": {
                "start-datetime": f"{day.isoformat()}T00:00:00Z",
                "end-datetime": f"{day.isoformat()}T23:59:59Z",
            },
            "contact-info": contact,
            "report-id": f"{day.isoformat()}T00:00:00Z_{domain}_{sender}",
            "policies": [_policy_entry(domain, lines, kinds) for (_, lines), kinds in sorted(policies.items())],
        }
        for domain, policies in sorted(by_domain.items())
    ]


def _policy_entry(domain: str, lines: tuple[str, ...], counts: list[TLSSessionCount]) -> dict[str, Any]:
    policy: dict[str, Any] = {"policy-type": "sts" if lines else "no-policy-found", "policy-domain": domain}
    if lines:
        policy["policy-string"] = list(lines)
        policy["mx-host"] = [line.split(":", 1)[1].strip() for line in lines if line.startswith("mx:")]
    failures = sorted((c for c in counts if c.result is not None), key=lambda c: (c.result or "", c.mx_host, c.address))
    return {
        "policy": policy,
        "summary": {
            "total-successful-session-count": sum(c.count for c in counts if c.result is None),
            "total-failure-session-count": sum(c.count for c in failures),
        },
        "failure-details": [_failure_detail(count) for count in failures],
    }


def _failure_detail(count: TLSSessionCount) -> dict[str, Any]:
    detail: dict[str, Any] = {"result-type": str(count.result)}
    if count.mx_host:
        detail["receiving-mx-hostname"] = count.mx_host
    if count.address:
        detail["receiving-ip"] = count.address
    detail["failed-session-count"] = count.count
    if count.reason:
        detail["failure-reason-code"] = count.reason
    return detail
