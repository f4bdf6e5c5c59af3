"""Where mail for a recipient domain goes: its MX hosts and their addresses.

``MXResolver.destinations(domain)`` applies RFC 5321 §5.1 and RFC 7505:

- the domain's MX records in preference order, lowest first, records of equal
  preference in random order;
- each MX host's A then AAAA addresses, each address one ``Host`` named after the
  MX host; an MX host without an address is left out (when every one is, the
  domain's recipients are deferred: ``4.4.3``);
- no MX record at all: the domain itself is the host (the implicit MX), but never
  after an MX lookup that failed temporarily;
- a null MX (``0 .``): the domain accepts no mail, its recipients fail (``5.1.10``);
- a domain that does not exist, or has neither MX nor address: they fail (``5.1.2``);
- a lookup that failed temporarily (SERVFAIL, no answer in time, no nameserver
  reachable): they are deferred (``4.4.3``);
- an address literal (``[192.0.2.1]``, ``[IPv6:2001:db8::1]``) is the host itself,
  with no DNS;
- an internationalized domain is looked up as its A-labels.

Every lookup goes through the nameservers given (``DNS_NAMESERVERS``), or those of
the system's resolver configuration when there are none, never through the
system's ``getaddrinfo``. Nothing is cached: each call asks again.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import random
import time
from collections.abc import Sequence

import dns.exception
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver
from dns.rdtypes.ANY.MX import MX
from dns.rdtypes.IN.A import A
from dns.rdtypes.IN.AAAA import AAAA

from bumail_queue.errors import QueueConfigurationError
from bumail_queue.items import Outcome, RecipientStatus, Reply

from .envelope import Host

__all__ = ["Destinations", "MXResolver"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Destinations:
    """The hosts to try for one domain, in order, or why its recipients get no session.

    Exactly one of the two is meaningful: ``hosts`` is empty when ``failure`` is set.
    ``failure`` is the outcome every recipient of the domain gets (``failed`` or
    ``deferred``, with ``Reply.code`` ``None``: no server answered).
    """

    hosts: tuple[Host, ...]
    failure: Outcome | None

    @classmethod
    def failed(cls, status: str, text: str) -> Destinations:
        """Return destinations whose recipients fail for good with ``status``."""
        return cls(hosts=(), failure=Outcome(status=RecipientStatus.FAILED, reply=Reply(code=None, status=status, text=text)))

    @classmethod
    def deferred(cls, text: str) -> Destinations:
        """Return destinations whose recipients are tried again later (``4.4.3``)."""
        return cls(hosts=(), failure=Outcome(status=RecipientStatus.DEFERRED, reply=Reply(code=None, status="4.4.3", text=text)))


@dataclasses.dataclass(frozen=True, slots=True)
class _Miss:
    """A lookup that gave no record: why, if it was not simply an empty answer."""

    nxdomain: bool = False
    temporary: str | None = None  # why the lookup failed for now


class MXResolver:
    """Finds the hosts to deliver a domain's mail to, through the given nameservers.

    ``nameservers`` are ``(ip, port)`` pairs, asked in order; ``None`` takes the
    system's resolver configuration (``/etc/resolv.conf``). ``port`` is the SMTP
    port of every host found (``MX_PORT``). ``timeout`` bounds a whole call of
    ``destinations()``, every lookup in it included. ``rng`` orders MX records of
    equal preference (a seeded one makes the order repeatable in tests).

    One resolver may serve many threads at once: a call changes no state of it.
    """

    def __init__(
        self,
        *,
        nameservers: Sequence[tuple[str, int]] | None,
        port: int,
        timeout: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be above 0 seconds; got {timeout!r}.")
        if nameservers is None:
            try:
                resolver = dns.resolver.Resolver(configure=True)
            except dns.resolver.NoResolverConfiguration as error:
                raise QueueConfigurationError(
                    "The system has no DNS resolver configuration to find MX hosts with; "
                    "set BUMAIL_QUEUE['DNS_NAMESERVERS']."
                ) from error
        else:
            if not nameservers:
                raise ValueError("nameservers must name at least one (ip, port), or be None for the system's.")
            resolver = dns.resolver.Resolver(configure=False)
            resolver.nameservers = [dns.nameserver.Do53Nameserver(ip, ns_port) for ip, ns_port in nameservers]
        resolver.cache = None
        self._resolver = resolver
        self._port = port
        self._timeout = float(timeout)
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 - an order, not a secret

    def destinations(self, domain: str) -> Destinations:
        """Return the hosts to try for ``domain``'s recipients, or why there are none."""
        domain = domain.strip()
        if domain.startswith("[") and domain.endswith("]"):
            return self._literal(domain)
        shown = domain.removesuffix(".")  # a fully qualified "example.com." is "example.com"
        try:
            a_labels = shown.lower().encode("idna").decode("ascii")
            if not a_labels or a_labels.endswith("."):
                raise UnicodeError("empty label")
            name = dns.name.from_text(a_labels)
        except (UnicodeError, dns.exception.DNSException):
            return Destinations.failed("5.1.3", f"{shown!r} is not a valid domain name.")
        deadline = time.monotonic() + self._timeout

        mx = self._lookup(name, dns.rdatatype.MX, deadline)
        if isinstance(mx, _Miss):
            if mx.nxdomain:
                return Destinations.failed("5.1.2", f"The domain {shown} does not exist (NXDOMAIN).")
            if mx.temporary is not None:
                # Never the implicit MX here: the domain may well have MX records.
                return Destinations.deferred(f"The MX lookup of {shown} failed for now: {mx.temporary}.")
            return self._implicit_mx(shown, name, deadline)

        records = [r for r in mx if isinstance(r, MX)]
        usable = [r for r in records if r.exchange != dns.name.root]
        if not usable:  # RFC 7505: "0 .", the domain says it takes no mail
            return Destinations.failed("5.1.10", f"The domain {shown} accepts no mail (null MX, RFC 7505).")

        hosts: list[Host] = []
        why: str | None = None
        for exchange in self._in_order(usable):
            host_name = exchange.to_text(omit_final_dot=True).lower()
            addresses, miss = self._addresses(exchange, deadline)
            hosts.extend(Host(name=host_name, address=address, port=self._port) for address in addresses)
            why = why or (miss.temporary if miss else None)
        hosts = _unique(hosts)
        if not hosts:
            detail = f" ({why})" if why else ""
            return Destinations.deferred(f"No MX host of {shown} has an address (A or AAAA){detail}.")
        return Destinations(hosts=tuple(hosts), failure=None)

    def _literal(self, domain: str) -> Destinations:
        inner = domain[1:-1]
        try:
            if inner[:5].lower() == "ipv6:":
                ipv6 = ipaddress.IPv6Address(inner[5:])
                if ipv6.scope_id:
                    raise ValueError("a zone index has no meaning beyond this machine")
                address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipv6
            else:
                address = ipaddress.IPv4Address(inner)
        except ValueError:
            return Destinations.failed(
                "5.1.2", f"The address literal {domain} is neither an IPv4 nor an IPv6 address: mail cannot be sent there."
            )
        return Destinations(hosts=(Host(name=str(address), address=str(address), port=self._port),), failure=None)

    def _implicit_mx(self, shown: str, name: dns.name.Name, deadline: float) -> Destinations:
        """RFC 5321 §5.1: with no MX record, the domain's own address is its mail host."""
        addresses, miss = self._addresses(name, deadline)
        if addresses:
            host_name = name.to_text(omit_final_dot=True)
            return Destinations(
                hosts=tuple(_unique([Host(name=host_name, address=a, port=self._port) for a in addresses])),
                failure=None,
            )
        if miss is not None and miss.temporary is not None:
            return Destinations.deferred(f"The address lookup of {shown} (it has no MX record) failed for now: {miss.temporary}.")
        if miss is not None and miss.nxdomain:
            return Destinations.failed("5.1.2", f"The domain {shown} does not exist (NXDOMAIN).")
        return Destinations.failed("5.1.2", f"The domain {shown} has no MX record and no address (A or AAAA).")

    def _in_order(self, records: list[MX]) -> list[dns.name.Name]:
        """Return the exchanges by preference, shuffling each group of equal preference."""
        groups: dict[int, list[dns.name.Name]] = {}
        for record in records:
            groups.setdefault(record.preference, []).append(record.exchange)
        ordered: list[dns.name.Name] = []
        for preference in sorted(groups):
            group = groups[preference]
            self._rng.shuffle(group)
            ordered.extend(group)
        return ordered

    def _addresses(self, name: dns.name.Name, deadline: float) -> tuple[list[str], _Miss | None]:
        """Return ``name``'s A then AAAA addresses, and the first miss that explains a gap."""
        addresses: list[str] = []
        misses: list[_Miss] = []
        for rdtype, kind in ((dns.rdatatype.A, A), (dns.rdatatype.AAAA, AAAA)):
            answer = self._lookup(name, rdtype, deadline)
            if isinstance(answer, _Miss):
                misses.append(answer)
                if answer.nxdomain:
                    break  # no AAAA either: the name does not exist
                continue
            addresses.extend(str(r.address) for r in answer if isinstance(r, kind))
        temporary = next((m for m in misses if m.temporary is not None), None)
        return addresses, temporary or next(iter(misses), None)

    def _lookup(self, name: dns.name.Name, rdtype: dns.rdatatype.RdataType, deadline: float) -> dns.resolver.Answer | _Miss:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return _Miss(temporary=f"the lookups took longer than {self._timeout:g} seconds")
        try:
            return self._resolver.resolve(name, rdtype, lifetime=remaining, search=False)
        except dns.resolver.NXDOMAIN:
            return _Miss(nxdomain=True)
        except dns.resolver.NoAnswer:
            return _Miss()
        except dns.exception.Timeout:
            return _Miss(temporary=f"no answer within {self._timeout:g} seconds")
        except dns.resolver.NoNameservers as error:
            return _Miss(temporary=_no_nameservers_reason(error))
        except dns.exception.DNSException as error:
            return _Miss(temporary=f"the lookup failed ({type(error).__name__})")


def _no_nameservers_reason(error: dns.resolver.NoNameservers) -> str:
    """Say in a few words what the nameservers did, from what dnspython recorded."""
    rcodes = sorted({entry[3] for entry in error.kwargs.get("errors", ()) if isinstance(entry[3], str)})
    if rcodes:
        return f"the nameservers answered {', '.join(rcodes)}"
    return "no nameserver could be reached or gave a usable answer"


def _unique(hosts: list[Host]) -> list[Host]:
    """Return ``hosts`` without a second host for an address already listed."""
    seen: set[str | None] = set()
    unique = []
    for host in hosts:
        if host.address not in seen:
            seen.add(host.address)
            unique.append(host)
    return unique
