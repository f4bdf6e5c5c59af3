"""MTA-STS (RFC 8461): a recipient domain's policy, found, fetched, kept and applied.

``STSPolicies.policy_for(domain)`` says which policy applies to a delivery now:

1. the ``_mta-sts.<domain>`` TXT record is looked up through the configured DNS
   (``DNS_NAMESERVERS``); a valid one (``v=STSv1; id=...``) announces a policy;
2. a policy kept with that id and not expired applies as it is: first this process's
   copy, then the store's (``PolicyCache``: every worker shares it);
3. otherwise it is fetched from ``https://mta-sts.<domain>/.well-known/mta-sts.txt``:
   the host's address found through the same DNS and held to the destination policy
   (``ALLOWED_PRIVATE_NETWORKS``), the connection made to that address with SNI and
   ``Host`` naming ``mta-sts.<domain>``, its certificate verified for that name
   against ``TLS_CA_FILE`` (the system's trust store when ``None``); no redirect is
   followed, the body must be ``text/plain`` and at most 64 KiB, the whole fetch
   takes at most ``FETCH_SECONDS``. The policy parsed is stored with its id and
   ``max_age``;
4. with no valid TXT record, or when the fetch fails, a policy kept and not expired
   still applies (so an ``enforce`` policy survives a DNS that stops answering until
   its ``max_age`` runs out); without one, the domain has no policy.

A fetch that failed is not tried again for the same id for
``FAILED_FETCH_MEMORY_SECONDS``, by any worker (the store keeps the failure), and threads that need one domain's policy at once
wait for one fetch. ``AppliedPolicy`` then says what the policy does to the route
and its MX hosts (``enforce``: only hosts its ``mx`` patterns match, verified TLS)
and turns the sessions' TLS into the counts of the TLS report (RFC 8460).

The HTTPS client is urllib3: it connects to the address chosen here and verifies
the certificate for the policy host's name (``server_hostname``), follows nothing
unless told, and reads a body in bounded pieces (``docs/mta-sts.md`` says why it
was chosen).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from typing import Any, Protocol

import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver
import urllib3
import urllib3.connection
import urllib3.exceptions
from dns.rdtypes.ANY.TXT import TXT
from dns.rdtypes.IN.A import A
from dns.rdtypes.IN.AAAA import AAAA

from bumail_queue.addresses import a_labels
from bumail_queue.conf import Route
from bumail_queue.items import Outcome, RecipientStatus, Reply
from bumail_queue.sts import MAX_AGE_LIMIT, MAX_MX_PATTERNS, STSFailure, STSMode, STSPolicy, TLSResult, TLSSessionCount

from .dns import IPNetwork, destination_refusal, make_resolver
from .envelope import Host, TLSSession
from .tlsrpt import certificate_failure

__all__ = [
    "FAILED_FETCH_MEMORY_SECONDS",
    "FETCH_SECONDS",
    "MAX_POLICY_SIZE",
    "AppliedPolicy",
    "PolicyCache",
    "PolicyError",
    "STSPolicies",
    "parse_policy",
    "parse_txt",
]

logger = logging.getLogger(__name__)

#: RFC 8461 §3.3: "senders may wish to" refuse a policy larger than 64 KiB.
MAX_POLICY_SIZE = 64 * 1024
#: How long a whole fetch may take: the address lookups, TLS, the request and the body.
#: RFC 8461 §3.3 asks for a timeout; a minute is the most it suggests.
FETCH_SECONDS = 20.0
#: How long each step of a fetch (connecting, each read) may wait at most.
FETCH_STEP_SECONDS = 10.0
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
_POLICY_PATH = "/.well-known/mta-sts.txt"
_READ_SIZE = 8192

# RFC 8461 §3.1: "v=STSv1; id=<1 to 32 letters or digits>;", extensions allowed.
_TXT_ID = re.compile(r"[A-Za-z0-9]{1,32}")
_TXT_FIELD = re.compile(r"([A-Za-z0-9_.-]{1,32})=([\x21-\x3a\x3c\x3e-\x7e]+)")
# RFC 8461 §3.2: a policy field is "name: value", the name letters, digits, "_", "-", ".".
_POLICY_FIELD = re.compile(r"([A-Za-z0-9_.-]{1,32})[ \t]*:[ \t]*(.*?)[ \t]*")
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_MX_PATTERN = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})+")
_MAX_AGE = re.compile(r"[0-9]{1,10}")


class PolicyError(Exception):
    """A policy could not be had: ``result`` is its RFC 8460 result type, the text why."""

    def __init__(self, result: TLSResult, text: str) -> None:
        super().__init__(text)
        self.result = result
        self.text = text


class PolicyCache(Protocol):
    """Where policies, and the fetches that failed, are kept for every worker
    (``QueueStore`` has these methods)."""

    def get_sts_policy(self, domain: str) -> STSPolicy | None: ...

    def put_sts_policy(self, policy: STSPolicy) -> None: ...

    def get_sts_failure(self, domain: str, policy_id: str, *, now: datetime) -> STSFailure | None: ...

    def put_sts_failure(self, failure: STSFailure) -> None: ...

    def purge_sts(self, *, now: datetime) -> int: ...


def parse_txt(texts: Sequence[str]) -> str | None:
    """Return the policy id that ``_mta-sts`` TXT records announce, or ``None`` for none.

    RFC 8461 §3.1: records not starting ``v=STSv1`` are set aside; exactly one must
    remain, and it must be valid, or the domain announces no policy.
    """
    records = [text for text in texts if text.startswith("v=STSv1")]
    if len(records) != 1:
        return None
    fields = [field.strip(" \t") for field in records[0].split(";")]
    if fields and not fields[-1]:
        fields.pop()  # the optional ";" at the end
    if not fields or fields[0] != "v=STSv1":
        return None
    policy_id = None
    for field in fields[1:]:
        match = _TXT_FIELD.fullmatch(field)
        if match is None:
            return None
        if match[1] == "id":
            if policy_id is not None or not _TXT_ID.fullmatch(match[2]):
                return None
            policy_id = match[2]
    return policy_id


def parse_policy(text: str, *, domain: str, policy_id: str, fetched_at: datetime) -> STSPolicy:
    """Return the policy ``text`` states (RFC 8461 §3.2); raise ``PolicyError`` (``sts-policy-invalid``).

    Lines end in LF or CRLF; fields it does not know are ignored (extensions), as
    RFC 8461 asks; ``version``, ``mode`` and ``max_age`` appear once each, and ``mx``
    at least once unless the mode is ``none``.
    """
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _POLICY_FIELD.fullmatch(line)
        if match is None:
            raise _invalid(f"the line {line[:80]!r} is not 'name: value'")
        fields.setdefault(match[1], []).append(match[2])
    version, mode_text, max_age_text = (_single(fields, name) for name in ("version", "mode", "max_age"))
    if version != "STSv1":
        raise _invalid(f"its version is {version!r}, not 'STSv1'")
    if mode_text not in {m.value for m in STSMode}:
        raise _invalid(f"its mode is {mode_text!r}, not 'enforce', 'testing' or 'none'")
    if not _MAX_AGE.fullmatch(max_age_text) or int(max_age_text) > MAX_AGE_LIMIT:
        raise _invalid(f"its max_age is {max_age_text!r}, not a number of seconds up to {MAX_AGE_LIMIT}")
    mode = STSMode(mode_text)
    patterns = tuple(dict.fromkeys(pattern.lower().rstrip(".") for pattern in fields.get("mx", [])))
    for pattern in patterns:
        if not _MX_PATTERN.fullmatch(pattern):
            raise _invalid(f"the mx {pattern!r} is neither a host name nor '*.' and a domain")
    if len(patterns) > MAX_MX_PATTERNS:
        raise _invalid(f"it has {len(patterns)} mx patterns, more than the {MAX_MX_PATTERNS} a policy may have here")
    if not patterns and mode is not STSMode.NONE:
        raise _invalid(f"it names no mx, which the mode {mode.value!r} needs")
    return STSPolicy(
        domain=domain, id=policy_id, mode=mode, mx=patterns, max_age=int(max_age_text), fetched_at=fetched_at
    )


def _single(fields: dict[str, list[str]], name: str) -> str:
    values = fields.get(name, [])
    if len(values) != 1:
        raise _invalid(f"it has {'no' if not values else len(values)} '{name}' field{'s' if values else ''}")
    return values[0]


def _invalid(why: str) -> PolicyError:
    return PolicyError(TLSResult.STS_POLICY_INVALID, f"The MTA-STS policy is not valid: {why}")


def _fetch_error(why: str) -> PolicyError:
    return PolicyError(TLSResult.STS_POLICY_FETCH_ERROR, why)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AppliedPolicy:
    """What MTA-STS says about delivering to ``domain`` now.

    ``policy`` is the policy in force, if any. When the domain announced a policy
    that could not be had (and none kept applies), ``policy`` is ``None`` and
    ``failure`` says why, with the TXT record's ``txt_id``: the mail goes as without
    a policy, and the report counts the failure.
    """

    domain: str
    policy: STSPolicy | None = None
    txt_id: str = ""
    failure: TLSResult | None = None
    reason: str = ""

    @property
    def mode(self) -> STSMode | None:
        """Return ``enforce`` or ``testing`` when the policy asks something of the delivery."""
        if self.policy is None or self.policy.mode is STSMode.NONE:
            return None
        return self.policy.mode

    def route(self, route: Route) -> Route:
        """Return ``route`` carrying the policy's mode to the transport."""
        mode = self.mode
        return route if mode is None else dataclasses.replace(route, mta_sts=mode)

    def hosts(self, hosts: Sequence[Host]) -> tuple[Host, ...]:
        """Return the MX hosts the policy lets the mail go to, in order: under
        ``enforce``, those its ``mx`` patterns match; otherwise all of them."""
        if self.mode is not STSMode.ENFORCE or self.policy is None:
            return tuple(hosts)
        return tuple(host for host in hosts if self.policy.allows(host.name))

    def refusal(self, hosts: Sequence[Host]) -> Outcome:
        """Return the outcome of recipients whose every MX host the policy excludes (``4.7.5``)."""
        assert self.policy is not None
        names = ", ".join(dict.fromkeys(host.name for host in hosts))
        text = (
            f"No MX host of {self.domain} ({names}) matches its MTA-STS policy (mode enforce, "
            f"mx: {', '.join(self.policy.mx)}, policy id {self.policy.id}): not delivered until one does "
            "or the policy changes (RFC 8461 §4.1)."
        )
        return Outcome(status=RecipientStatus.DEFERRED, reply=Reply(code=None, status="4.7.5", text=text))

    def counts(
        self, day: date, sessions: Sequence[TLSSession], *, excluded: Sequence[Host] = ()
    ) -> list[TLSSessionCount]:
        """Return the TLS report's counts for one delivery: each session opened under
        the policy, or the one failure that kept the policy (or every MX host) from use."""
        if self.failure is not None:
            return [
                TLSSessionCount(
                    day=day,
                    domain=self.domain,
                    policy_id=self.txt_id,
                    policy=(),
                    result=self.failure,
                    reason=self.reason,
                )
            ]
        policy = self.policy
        if policy is None or self.mode is None:
            return []
        base = TLSSessionCount(day=day, domain=self.domain, policy_id=policy.id, policy=policy.lines(), result=None)
        counted = []
        if excluded:
            names = ", ".join(dict.fromkeys(host.name for host in excluded))
            reason = f"no MX host matches the policy's mx patterns: {names}"
            counted.append(dataclasses.replace(base, result=TLSResult.VALIDATION_FAILURE, reason=reason))
        for session in sessions:
            result, reason = session.failure, session.reason
            if not policy.allows(session.host):  # testing: the policy would not have let it be used
                result, reason = (
                    TLSResult.VALIDATION_FAILURE,
                    f"{session.host} matches none of the policy's mx patterns",
                )
            if result is None:
                counted.append(base)
            else:
                counted.append(
                    dataclasses.replace(
                        base, result=result, mx_host=session.host, address=session.address or "", reason=reason
                    )
                )
        return counted


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
        text: str | None = None
        with _Watchdog(max(0.0, deadline - self._monotonic())) as watchdog:
            for address in addresses:
                try:
                    text = self._get(host_name, address, deadline, watchdog)
                    break
                except _UnreachableError as error:
                    last: PolicyError = error
                except PolicyError:
                    if watchdog.expired:
                        raise self._too_slow(host_name) from None
                    raise
            # A body cut short at the deadline may end where a line does: never parse it.
            if watchdog.expired:
                raise self._too_slow(host_name)
            if text is None:
                raise last
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

    def _too_slow(self, host_name: str) -> PolicyError:
        return _fetch_error(
            f"https://{host_name}{self._port_text}{_POLICY_PATH} took longer than {self._fetch_seconds:g} seconds"
        )

    @property
    def _port_text(self) -> str:
        return "" if self._port == 443 else f":{self._port}"

    def _get(self, host_name: str, address: str, deadline: float, watchdog: _Watchdog) -> str:
        """GET the policy from ``address``, as ``host_name``; return its text."""
        step = min(FETCH_STEP_SECONDS, max(0.001, deadline - self._monotonic()))
        where = f"https://{host_name}{self._port_text}{_POLICY_PATH}"
        pool = _WatchedPool(
            address,
            watchdog=watchdog,
            port=self._port,
            ssl_context=self._context(),
            server_hostname=host_name,  # SNI, and the name the certificate must hold
            timeout=urllib3.Timeout(connect=step, read=step),
            retries=False,
            maxsize=1,
        )
        try:
            response = pool.urlopen(
                "GET",
                _POLICY_PATH,
                headers={
                    "Host": host_name if self._port == 443 else f"{host_name}:{self._port}",
                    "Accept": "text/plain",
                    "User-Agent": "bumail_queue (MTA-STS)",
                },
                redirect=False,
                retries=False,
                preload_content=False,
                assert_same_host=False,
            )
            try:
                return self._body(response, where, deadline)
            finally:
                response.release_conn()
        except urllib3.exceptions.SSLError as error:
            failed = certificate_failure(error)
            if failed is not None:
                raise PolicyError(
                    TLSResult.STS_WEBPKI_INVALID, f"The certificate of {where} is not valid: {failed[1]}"
                ) from None
            raise _fetch_error(f"TLS with {where} failed: {_reason(error)}") from None
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError) as error:
            raise _UnreachableError(f"{where} could not be reached at {_shown(address)}: {_reason(error)}") from None
        except urllib3.exceptions.HTTPError as error:
            raise _fetch_error(f"{where} failed: {_reason(error)}") from None
        finally:
            pool.close()

    def _body(self, response: urllib3.BaseHTTPResponse, where: str, deadline: float) -> str:
        """Return the response's text, once its status, media type and size pass."""
        if 300 <= response.status < 400:
            location = response.headers.get("Location", "")[:200]
            raise _fetch_error(
                f"{where} redirects ({response.status}) to {location!r}; RFC 8461 §3.3 forbids following"
            )
        if response.status != 200:
            raise _fetch_error(f"{where} answered HTTP {response.status}")
        media_type = response.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media_type != "text/plain":
            raise _invalid(f"{where} is served as {media_type or 'no media type'!r}, not 'text/plain' (RFC 8461 §3.2)")
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_POLICY_SIZE:
            raise _fetch_error(
                f"{where} is {int(length)} octets, more than the {MAX_POLICY_SIZE} octets a policy may have"
            )
        body = bytearray()
        while chunk := response.read1(_READ_SIZE):
            body += chunk
            if len(body) > MAX_POLICY_SIZE:
                raise _fetch_error(f"{where} is more than the {MAX_POLICY_SIZE} octets a policy may have")
            if self._monotonic() > deadline:
                raise _fetch_error(f"{where} took longer than {self._fetch_seconds:g} seconds")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid(f"{where} is not UTF-8 text") from None


class _Watchdog:
    """Ends a fetch's connections once its time is up, however slowly their bytes come.

    urllib3's read timeout, like http.client's under it, bounds each ``recv`` afresh: a
    policy host sending its status line or headers one byte every few seconds is never
    cut off by it. A timer that shuts the connections down at the deadline is: the read
    under way then ends at once, and so does the fetch. It holds a duplicate of each
    socket, since wrapping a socket in TLS detaches the object it was made with, and
    shutting a duplicate down ends the connection the TLS socket reads from.
    """

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock``'s connection down at the deadline (at once if it has passed)."""
        duplicate = sock.dup()
        with self._lock:
            self._sockets.append(duplicate)
            expired = self.expired
        if expired:
            _shut(duplicate)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedConnection(urllib3.connection.HTTPSConnection):
    """urllib3's HTTPS connection, its socket handed to the fetch's watchdog as soon as
    it exists, so that the TLS handshake is bounded too."""

    def __init__(self, *args: Any, watchdog: _Watchdog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watchdog = watchdog

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        self._watchdog.watch(sock)
        return sock


class _WatchedPool(urllib3.HTTPSConnectionPool):
    """A pool whose connections the watchdog given (``watchdog=``) ends at the deadline."""

    ConnectionCls = _WatchedConnection


class _UnreachableError(PolicyError):
    """The policy host could not be reached at one address: the next is tried."""

    def __init__(self, text: str) -> None:
        super().__init__(TLSResult.STS_POLICY_FETCH_ERROR, text)


def _reason(error: BaseException) -> str:
    """Say what went wrong in a line: the innermost cause urllib3 wrapped."""
    cause = error
    while isinstance(cause, urllib3.exceptions.HTTPError) and cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(getattr(cause, "reason", None) or cause).splitlines()[0] if str(cause) else type(cause).__name__
    return text[:300]


def _shown(address: str) -> str:
    return f"[{address}]" if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address) else address
