"""Finding a recipient domain's MTA-STS policy: the TXT record, the policies kept
(this process's copy, then the store's), the fetch, and the failures remembered."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver
from dns.rdtypes.ANY.TXT import TXT
from dns.rdtypes.IN.A import A
from dns.rdtypes.IN.AAAA import AAAA

from bumail_queue.addresses import a_labels
from bumail_queue.delivery.dns import IPNetwork, destination_refusal, make_resolver
from bumail_queue.sts import STSFailure, STSPolicy

from .https import fetch_text
from .policy import AppliedPolicy, PolicyError, _fetch_error, parse_policy, parse_txt

# The package's logger: the name the log lines have always had.
logger = logging.getLogger(__package__)

#: How long a whole fetch may take: the address lookups, TLS, the request and the body.
#: RFC 8461 §3.3 asks for a timeout; a minute is the most it suggests.
FETCH_SECONDS = 20.0
#: How long the TXT lookup may take.
TXT_LOOKUP_SECONDS = 10.0
#: A fetch that failed is not tried again for the same id this long (RFC 8461 §3.3
#: lets senders limit how often they fetch).
FAILED_FETCH_MEMORY_SECONDS = 300.0
#: How long a domain without a policy announced or kept is not asked of the store
#: again: most domains have none, and a delivery should not pay a store read for it.
NO_POLICY_MEMORY_SECONDS = 60.0
#: How many addresses of a policy host are tried.
POLICY_HOST_ADDRESSES = 2
#: How many domains' policies, and failed fetches, a process keeps in memory at most.
_MEMORY_LIMIT = 10_000


class PolicyCache(Protocol):
    """Where policies, and the fetches that failed, are kept for every worker
    (``QueueStore`` has these methods)."""

    def get_sts_policy(self, domain: str) -> STSPolicy | None: ...

    def put_sts_policy(self, policy: STSPolicy) -> None: ...

    def get_sts_failure(self, domain: str, policy_id: str, *, now: datetime) -> STSFailure | None: ...

    def put_sts_failure(self, failure: STSFailure) -> None: ...

    def purge_sts(self, *, now: datetime) -> int: ...


class STSPolicies:
    """Finds the MTA-STS policy of recipient domains; see the module's doc.

    ``cache`` keeps policies for every worker (the store); ``nameservers`` are those
    of ``DNS_NAMESERVERS`` (``None``: the system's); ``https_port`` is
    ``MTA_STS_HTTPS_PORT``; ``ssl_context`` verifies policy hosts (made from
    ``ca_file``, ``TLS_CA_FILE``, when not given); ``allowed_networks`` are
    ``ALLOWED_PRIVATE_NETWORKS``; ``clock`` gives the time policies are fetched and
    expire at; ``monotonic`` bounds the fetches and the memory of failed ones.

    One instance serves many threads.
    """

    def __init__(
        self,
        *,
        cache: PolicyCache,
        nameservers: Sequence[tuple[str, int]] | None,
        https_port: int = 443,
        ca_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        allowed_networks: Sequence[IPNetwork] = (),
        clock: Callable[[], datetime],
        monotonic: Callable[[], float] = time.monotonic,
        fetch_seconds: float = FETCH_SECONDS,
    ) -> None:
        self._cache = cache
        self._resolver = make_resolver(nameservers)
        self._port = https_port
        self._ca_file = ca_file
        self._ssl_context = ssl_context
        self._allowed = tuple(allowed_networks)
        self._clock = clock
        self._monotonic = monotonic
        self._fetch_seconds = fetch_seconds
        self._lock = threading.Lock()
        self._known: dict[str, STSPolicy] = {}
        self._failed: dict[tuple[str, str], tuple[float, PolicyError]] = {}
        self._absent: dict[str, float] = {}  # domain -> until when the store is not asked for it
        self._fetching: dict[str, threading.Event] = {}

    def policy_for(self, domain: str) -> AppliedPolicy:
        """Return the policy that applies to mail for ``domain`` (A-labels, lowercase) now.

        Never raises for what DNS, the policy host or the store do: a failure leaves
        the domain without a policy, or with the one kept.
        """
        if domain.startswith("[") or not domain:
            return AppliedPolicy(domain=domain)  # an address literal has no policy
        policy_id = self._announced_id(domain)
        now = self._clock()
        kept = self._kept(domain, policy_id, now)
        if policy_id is None or (kept is not None and kept.id == policy_id):
            return AppliedPolicy(domain=domain, policy=kept)
        try:
            return AppliedPolicy(domain=domain, policy=self._fetched(domain, policy_id))
        except PolicyError as error:
            logger.warning("MTA-STS policy of %s (id %s) not fetched: %s", domain, policy_id, error.text)
            if kept is not None:  # RFC 8461 §5.1: a policy kept goes on applying until it expires
                return AppliedPolicy(domain=domain, policy=kept)
            return AppliedPolicy(domain=domain, txt_id=policy_id, failure=error.result, reason=error.text)

    # -- the TXT record -------------------------------------------------------------------

    def _announced_id(self, domain: str) -> str | None:
        """Return the id ``_mta-sts.<domain>``'s TXT record announces; ``None`` for no
        valid record, and for a lookup that failed (a kept policy then applies)."""
        try:
            name = dns.name.from_text(f"_mta-sts.{a_labels(domain)}")
            answer = self._resolver.resolve(name, dns.rdatatype.TXT, lifetime=TXT_LOOKUP_SECONDS, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return None
        except (dns.exception.DNSException, UnicodeError, ValueError) as error:
            logger.info("MTA-STS TXT lookup of %s failed: %s", domain, type(error).__name__)
            return None
        texts = [b"".join(record.strings).decode("ascii", "replace") for record in answer if isinstance(record, TXT)]
        return parse_txt(texts)

    # -- kept policies ------------------------------------------------------------------

    def _kept(self, domain: str, policy_id: str | None, now: datetime) -> STSPolicy | None:
        """Return the policy kept for ``domain`` that has not expired: this process's
        copy when it has ``policy_id`` (or no id is announced), else the store's."""
        with self._lock:
            known = self._known.get(domain)
        if known is not None and known.is_fresh_at(now) and (policy_id is None or known.id == policy_id):
            return known
        if policy_id is None and known is None and self._absent.get(domain, 0.0) > self._monotonic():
            return None
        try:
            stored = self._cache.get_sts_policy(domain)
        except Exception as error:  # the store is down: as if nothing were kept
            logger.warning("MTA-STS policy of %s not read from the store: %s", domain, error)
            stored = None
        if stored is not None and stored.is_fresh_at(now):
            self._remember(stored)
            return stored
        if known is None and stored is None and policy_id is None:
            with self._lock:
                if len(self._absent) >= _MEMORY_LIMIT:
                    self._absent.pop(next(iter(self._absent)))
                self._absent[domain] = self._monotonic() + NO_POLICY_MEMORY_SECONDS
        return known if known is not None and known.is_fresh_at(now) else None

    def _remember(self, policy: STSPolicy) -> None:
        with self._lock:
            if len(self._known) >= _MEMORY_LIMIT and policy.domain not in self._known:
                self._known.pop(next(iter(self._known)))
            self._known[policy.domain] = policy
            self._absent.pop(policy.domain, None)

    # -- fetching -----------------------------------------------------------------------

    def _fetched(self, domain: str, policy_id: str) -> STSPolicy:
        """Return ``domain``'s policy for ``policy_id``: fetched by this thread, or by the
        thread already fetching it, waited for no longer than a fetch of its own could
        take; raise ``PolicyError``."""
        give_up_at = self._monotonic() + self._fetch_seconds
        while True:
            with self._lock:
                failed = self._failed.get((domain, policy_id))
                if failed is not None and failed[0] > self._monotonic():
                    raise failed[1]
                known = self._known.get(domain)
                if known is not None and known.id == policy_id and known.is_fresh_at(self._clock()):
                    return known
                underway = self._fetching.get(domain)
                if underway is None:
                    self._fetching[domain] = done = threading.Event()
                    break
            if not underway.wait(max(0.0, give_up_at - self._monotonic())) and self._monotonic() >= give_up_at:
                raise _fetch_error(
                    f"The fetch of the policy of {domain} under way took longer than {self._fetch_seconds:g} seconds"
                )
        try:
            policy = self._fetch_unless_failed(domain, policy_id)
        except PolicyError as error:
            with self._lock:
                if len(self._failed) >= _MEMORY_LIMIT:
                    self._failed.pop(next(iter(self._failed)))
                self._failed[(domain, policy_id)] = (self._monotonic() + FAILED_FETCH_MEMORY_SECONDS, error)
            raise
        finally:
            with self._lock:
                del self._fetching[domain]
            done.set()
        self._remember(policy)
        try:
            self._cache.put_sts_policy(policy)
            # A fetch is rare (once per policy per max_age): the time to drop what expired.
            self._cache.purge_sts(now=self._clock())
        except Exception as error:  # still applied here; another worker fetches its own
            logger.warning("MTA-STS policy of %s not kept in the store: %s", domain, error)
        return policy

    def _fetch_unless_failed(self, domain: str, policy_id: str) -> STSPolicy:
        """Fetch the policy, unless a fetch of it by any worker failed within the last
        ``FAILED_FETCH_MEMORY_SECONDS``: the store keeps failures for every worker and
        every pass (``queue.deliver_due()`` makes a worker of its own each time)."""
        try:
            failed = self._cache.get_sts_failure(domain, policy_id, now=self._clock())
        except Exception as error:  # the store is down: fetch, as if nothing had failed
            logger.warning("MTA-STS fetch failures of %s not read from the store: %s", domain, error)
            failed = None
        if failed is not None:
            raise PolicyError(failed.result, failed.reason)
        try:
            return self._fetch(domain, policy_id)
        except PolicyError as error:
            failure = STSFailure(
                domain=domain,
                policy_id=policy_id,
                result=error.result,
                reason=error.text,
                until=self._clock() + timedelta(seconds=FAILED_FETCH_MEMORY_SECONDS),
            )
            try:
                self._cache.put_sts_failure(failure)
            except Exception as stored:  # this worker still remembers it
                logger.warning("MTA-STS fetch failure of %s not kept in the store: %s", domain, stored)
            raise

    def _fetch(self, domain: str, policy_id: str) -> STSPolicy:
        deadline = self._monotonic() + self._fetch_seconds
        host_name = f"mta-sts.{a_labels(domain)}"
        addresses = self._addresses(host_name, deadline)
        text = fetch_text(
            host_name,
            addresses,
            port=self._port,
            context=self._context(),
            deadline=deadline,
            seconds=self._fetch_seconds,
            monotonic=self._monotonic,
        )
        policy = parse_policy(text, domain=domain, policy_id=policy_id, fetched_at=self._clock())
        logger.info(
            "MTA-STS policy of %s fetched: id %s, mode %s, mx %s, max_age %s",
            domain, policy.id, policy.mode.value, " ".join(policy.mx) or "-", policy.max_age,
        )  # fmt: skip
        return policy

    def _addresses(self, host_name: str, deadline: float) -> list[str]:
        """Return the policy host's addresses the worker may connect to, A before AAAA."""
        found: list[str] = []
        refused: list[str] = []
        for rdtype, kind in ((dns.rdatatype.A, A), (dns.rdatatype.AAAA, AAAA)):
            left = deadline - self._monotonic()
            if left <= 0 or len(found) >= POLICY_HOST_ADDRESSES:
                break
            try:
                answer = self._resolver.resolve(host_name, rdtype, lifetime=left, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.exception.DNSException as error:
                raise _fetch_error(
                    f"The address of {host_name} could not be looked up ({type(error).__name__})"
                ) from None
            for record in answer:
                if isinstance(record, kind):
                    address = str(record.address)
                    why = destination_refusal(address, self._allowed)
                    (found if why is None else refused).append(address if why is None else f"{address} ({why})")
        if found:
            return found[:POLICY_HOST_ADDRESSES]
        if refused:
            raise _fetch_error(
                f"Every address of {host_name} is refused as not globally routable: {', '.join(refused)}; "
                "see BUMAIL_QUEUE['ALLOWED_PRIVATE_NETWORKS']"
            )
        raise _fetch_error(f"{host_name} has no address (A or AAAA)")

    def _context(self) -> ssl.SSLContext:
        with self._lock:
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context(cafile=self._ca_file)
            return self._ssl_context
