"""Where mail for a recipient domain goes: its MX hosts and their addresses.

``MXResolver.destinations(domain)`` applies RFC 5321 §5.1 and RFC 7505:

- the domain's MX records in preference order, lowest first, records of equal
  preference in random order;
- each MX host's A then AAAA addresses, each address one ``Host`` named after the
  MX host; an MX host without an address is left out. When every one is, the
  domain's recipients are deferred (``4.4.3``) if any lookup failed temporarily,
  and fail (``5.4.4``) when every MX host looked up does not exist (NXDOMAIN) or
  has no A or AAAA record (NODATA), as Postfix does: the domain's own DNS says
  there is nowhere to deliver, and asking again for days would not change that;
- an MX host written as an IPv4 or IPv6 address (``10 192.0.2.1.``), where RFC 5321
  wants a host name, is taken as that address (as Postfix does), with a warning
  logged and no A or AAAA lookup: one ``Host`` named after the address, under the
  same destination policy as any other address;
- no MX record at all: the domain itself is the host (the implicit MX), but never
  after an MX lookup that failed temporarily;
- a null MX (``0 .``): the domain accepts no mail, its recipients fail (``5.1.10``);
- a domain that does not exist, or has neither MX nor address: they fail (``5.1.2``);
- a lookup that failed temporarily (SERVFAIL, no answer in time, no nameserver
  reachable): they are deferred (``4.4.3``);
- an address literal (``[192.0.2.1]``, ``[IPv6:2001:db8::1]``) is the host itself,
  with no DNS;
- an internationalized domain is looked up as its A-labels.

Two bounds hold whatever the DNS says (Postfix's ``smtp_mx_address_limit``):

- at most ``address_limit`` addresses are kept, over all MX hosts in preference order,
  and no A or AAAA lookup is made once that many are kept;
- at most ``MX_HOSTS_PER_ADDRESS * address_limit`` MX hosts are looked up, so a call
  makes at most ``1 + 2 * MX_HOSTS_PER_ADDRESS * address_limit`` lookups however many
  MX records the domain publishes (21 with the default limit of 5).

Only globally routable addresses are kept (``destination_refusal``), unless they lie
in ``allowed_networks``: a recipient address or a DNS answer chosen by someone else
must not aim the worker at a service inside its own network. Each address refused
is logged; when none is left, the recipients fail (``5.4.4``).

Every lookup goes through the nameservers given (``DNS_NAMESERVERS``), or those of
the system's resolver configuration when there are none, never through the
system's ``getaddrinfo``. Nothing is cached: each call asks again.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
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

from bumail_queue.addresses import a_labels
from bumail_queue.errors import QueueConfigurationError

from .envelope import Destinations, Host

__all__ = ["MX_HOSTS_PER_ADDRESS", "Destinations", "MXResolver", "destination_refusal", "make_resolver"]

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: How many MX hosts are looked up per address kept, at most: room for MX hosts
#: without a usable address, while a domain of 1,000 MX records costs a few lookups.
MX_HOSTS_PER_ADDRESS = 2

#: How many refused addresses, or MX hosts without an address, a reply text names;
#: the rest are counted.
_NAMED_IN_REPLY = 5

# RFC 3463 X.4.4, "unable to route": the DNS gave no next hop this system may use,
# because every address was refused or no MX host has an address record. It is a
# routing failure on this side, not a refusal by any server (X.7.x), and it is
# permanent: only the operator (ALLOWED_PRIVATE_NETWORKS) or the domain's owner can
# change it, and retrying would ask the same question again for days. Postfix gives
# the same status to MX hosts whose address lookups all found nothing.
_UNROUTABLE_STATUS = "5.4.4"


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
    ``allowed_networks`` are the networks beyond the globally routable ones that a
    host may be in (``ALLOWED_PRIVATE_NETWORKS``); ``address_limit`` is how many
    addresses a call returns at most (``MX_ADDRESS_LIMIT``).

    One resolver may serve many threads at once: a call changes no state of it.
    """

    def __init__(
        self,
        *,
        nameservers: Sequence[tuple[str, int]] | None,
        port: int,
        timeout: float = 30.0,
        rng: random.Random | None = None,
        allowed_networks: Sequence[IPNetwork] = (),
        address_limit: int = 5,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be above 0 seconds; got {timeout!r}.")
        if address_limit < 1:
            raise ValueError(f"address_limit must be at least 1; got {address_limit!r}.")
        self._resolver = make_resolver(nameservers)
        self._asked = _nameservers_of(self._resolver, system=nameservers is None)
        self._port = port
        self._timeout = float(timeout)
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 - an order, not a secret
        self._allowed = tuple(allowed_networks)
        self._address_limit = address_limit

    def destinations(self, domain: str) -> Destinations:
        """Return the hosts to try for ``domain``'s recipients, or why there are none."""
        domain = domain.strip()
        if domain.startswith("[") and domain.endswith("]"):
            return self._literal(domain)
        shown = domain.removesuffix(".")  # a fully qualified "example.com." is "example.com"
        try:
            ascii_name = a_labels(shown.lower())
            if not ascii_name or ascii_name.endswith("."):
                raise UnicodeError("empty label")
            name = dns.name.from_text(ascii_name)
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

        found = _Found(domain=shown, port=self._port, limit=self._address_limit, allowed=self._allowed)
        exchanges = self._in_order(usable)[: MX_HOSTS_PER_ADDRESS * self._address_limit]
        why, not_found = self._add_exchanges(found, exchanges, deadline)
        if found.hosts:
            return Destinations(hosts=tuple(found.hosts), failure=None)
        if why is not None:
            # Never failed for a DNS that is down: the MX host it could not look up may have an address.
            refused = f" {found.refused_text()}" if found.refused else ""
            return Destinations.deferred(f"No MX host of {shown} has a usable address (A or AAAA) ({why}).{refused}")
        if found.refused:
            return found.all_refused()
        # Here every MX host looked up was answered "not found": the domain's DNS, not a failure, says so.
        return Destinations.failed(_UNROUTABLE_STATUS, f"No MX host of {shown} has an address: {_some_of(not_found)}.")

    def _literal(self, domain: str) -> Destinations:
        inner = domain[1:-1]
        try:
            if inner[:5].lower() == "ipv6:":
                ipv6 = ipaddress.IPv6Address(inner[5:])
                if ipv6.scope_id:
                    raise ValueError("a zone index has no meaning beyond this machine")
                address: IPAddress = ipv6
            else:
                address = ipaddress.IPv4Address(inner)
        except ValueError:
            return Destinations.failed(
                "5.1.2",
                f"The address literal {domain} is neither an IPv4 nor an IPv6 address: mail cannot be sent there.",
            )
        found = _Found(domain=domain, port=self._port, limit=1, allowed=self._allowed)
        found.offer(str(address), str(address))
        return Destinations(hosts=tuple(found.hosts), failure=None) if found.hosts else found.all_refused()

    def _implicit_mx(self, shown: str, name: dns.name.Name, deadline: float) -> Destinations:
        """RFC 5321 §5.1: with no MX record, the domain's own address is its mail host."""
        found = _Found(domain=shown, port=self._port, limit=self._address_limit, allowed=self._allowed)
        miss = self._add_addresses(found, name, deadline)
        if found.hosts:
            return Destinations(hosts=tuple(found.hosts), failure=None)
        if miss is not None and miss.temporary is not None:
            refused = f" {found.refused_text()}" if found.refused else ""
            return Destinations.deferred(
                f"The address lookup of {shown} (it has no MX record) failed for now: {miss.temporary}.{refused}"
            )
        if found.refused:
            return found.all_refused()
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

    def _add_exchanges(
        self, found: _Found, exchanges: list[dns.name.Name], deadline: float
    ) -> tuple[str | None, list[str]]:
        """Offer each MX host's addresses to ``found``, in order, until it is full.

        Return the first temporary failure met, if any, and what each MX host whose
        lookups found nothing lacks ("mx.example.com does not exist (NXDOMAIN)").
        """
        temporary: str | None = None
        not_found: list[str] = []
        for exchange in exchanges:
            if found.full:
                break
            address = _numeric_exchange(exchange)
            if address is not None:
                found.offer_numeric_exchange(exchange.to_text(omit_final_dot=True), address)
                continue
            miss = self._add_addresses(found, exchange, deadline)
            if miss is None:
                continue
            if miss.temporary is not None:
                temporary = temporary or miss.temporary
            else:
                not_found.append(_not_found_text(exchange, miss))
        return temporary, not_found

    def _add_addresses(self, found: _Found, name: dns.name.Name, deadline: float) -> _Miss | None:
        """Offer ``name``'s A then AAAA addresses to ``found``; return why there is a gap, if there is one.

        A temporary failure of either lookup is returned even when the other gave
        addresses (the one not answered may hold a better one); otherwise a miss is
        returned only when neither lookup gave an address. The AAAA lookup is not
        made once ``found`` is full.
        """
        host_name = name.to_text(omit_final_dot=True).lower()
        misses: list[_Miss] = []
        offered = False
        for rdtype, kind in ((dns.rdatatype.A, A), (dns.rdatatype.AAAA, AAAA)):
            if found.full:
                break
            answer = self._lookup(name, rdtype, deadline)
            if isinstance(answer, _Miss):
                misses.append(answer)
                if answer.nxdomain:
                    break  # no AAAA either: the name does not exist
                continue
            addresses = [str(record.address) for record in answer if isinstance(record, kind)]
            if not addresses:
                misses.append(_Miss())  # an answer without a record of its type is no more than NODATA
            for address in addresses:
                found.offer(host_name, address)
            offered = offered or bool(addresses)
        temporary = next((m for m in misses if m.temporary is not None), None)
        if temporary is not None or offered:
            return temporary
        return next(iter(misses), None)

    def _lookup(
        self, name: dns.name.Name, rdtype: dns.rdatatype.RdataType, deadline: float
    ) -> dns.resolver.Answer | _Miss:
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
            return _Miss(temporary=f"no answer within {self._timeout:g} seconds from {self._asked}")
        except dns.resolver.NoNameservers as error:
            return _Miss(temporary=f"{_no_nameservers_reason(error)} ({self._asked})")
        except dns.exception.DNSException as error:
            return _Miss(temporary=f"the lookup failed ({type(error).__name__}, {self._asked})")


def _numeric_exchange(exchange: dns.name.Name) -> IPAddress | None:
    """Return the address an MX record's exchange is written as (``10 192.0.2.1.``), if it is one.

    An IPv6 address with a zone index ("fe80::1%eth0") is no address here: it names
    an interface of this machine, which the DNS has no business choosing.
    """
    try:
        address = ipaddress.ip_address(exchange.to_text(omit_final_dot=True))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        return None
    return address


def _not_found_text(exchange: dns.name.Name, miss: _Miss) -> str:
    """Say in a few words what the DNS answered for an MX host without an address."""
    name = exchange.to_text(omit_final_dot=True).lower()
    return f"{name} does not exist (NXDOMAIN)" if miss.nxdomain else f"{name} has no A or AAAA record"


def _some_of(items: list[str]) -> str:
    """List the first few ``items``, and count the rest, so a reply stays short."""
    named = items[:_NAMED_IN_REPLY]
    more = len(items) - len(named)
    return ", ".join(named) + (f" and {more} more" if more else "")


def make_resolver(nameservers: Sequence[tuple[str, int]] | None) -> dns.resolver.Resolver:
    """Return a resolver asking ``nameservers`` (``(ip, port)`` pairs) in order, or the
    system's (``/etc/resolv.conf``) for ``None``; it caches nothing."""
    if nameservers is None:
        try:
            resolver = dns.resolver.Resolver(configure=True)
        except dns.resolver.NoResolverConfiguration as error:
            raise QueueConfigurationError(
                "The system has no DNS resolver configuration to look names up with; "
                "set BUMAIL_QUEUE['DNS_NAMESERVERS']."
            ) from error
    else:
        if not nameservers:
            raise ValueError("nameservers must name at least one (ip, port), or be None for the system's.")
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver(ip, ns_port) for ip, ns_port in nameservers]
    resolver.cache = None
    return resolver


def _nameservers_of(resolver: dns.resolver.Resolver, *, system: bool) -> str:
    """Name the nameservers a resolver asks, for the texts of failed lookups."""
    asked = [
        f"{ns.address}:{ns.port}" if isinstance(ns, dns.nameserver.Do53Nameserver) else f"{ns}:{resolver.port}"
        for ns in resolver.nameservers
    ]
    where = ", ".join(asked) or "none"
    return f"the system's nameservers, {where}" if system else f"DNS_NAMESERVERS {where}"


def _no_nameservers_reason(error: dns.resolver.NoNameservers) -> str:
    """Say in a few words what the nameservers did, from what dnspython recorded."""
    rcodes = sorted({entry[3] for entry in error.kwargs.get("errors", ()) if isinstance(entry[3], str)})
    if rcodes:
        return f"the nameservers answered {', '.join(rcodes)}"
    return "no nameserver could be reached or gave a usable answer"


class _Found:
    """The hosts kept for one domain, in the order offered, and the addresses refused.

    An address is kept once, whichever MX host names it first; at most ``limit`` are
    kept. An address the destination policy refuses is logged and set aside.
    """

    def __init__(self, *, domain: str, port: int, limit: int, allowed: Sequence[IPNetwork]) -> None:
        self.domain = domain
        self.hosts: list[Host] = []
        self.refused: dict[str, str] = {}  # address -> why
        self._port = port
        self._limit = limit
        self._allowed = allowed

    @property
    def full(self) -> bool:
        return len(self.hosts) >= self._limit

    def offer(self, host_name: str, address: str) -> None:
        """Keep ``address`` as a host named ``host_name``, unless it is refused, listed or over the limit."""
        if self.full or address in self.refused or any(h.address == address for h in self.hosts):
            return
        why = destination_refusal(address, self._allowed)
        if why is None:
            self.hosts.append(Host(name=host_name, address=address, port=self._port))
            return
        self.refused[address] = why
        logger.warning(
            "destination refused: domain=%s host=%s address=%s reason=%s; see ALLOWED_PRIVATE_NETWORKS",
            self.domain, host_name, address, why,
        )  # fmt: skip

    def offer_numeric_exchange(self, exchange: str, address: IPAddress) -> None:
        """Offer an MX host written as an address, as a host named after that address.

        RFC 5321 §5.1 wants a domain name in an MX record; Postfix takes an address
        there as it is, with a warning, and so does this: the domain's owner learns of
        the mistake from the log, the mail still goes. The policy applies as to any address.
        """
        logger.warning(
            "numeric MX host: domain=%s exchange=%s address=%s; an MX record should name a host, "
            "the address is used without an A or AAAA lookup",
            self.domain, exchange, address,
        )  # fmt: skip
        self.offer(str(address), str(address))

    def refused_text(self) -> str:
        """Say which addresses were refused and which setting would open them."""
        listing = _some_of([f"{address} ({why})" for address, why in self.refused.items()])
        return (
            f"Refused as not globally routable: {listing}. "
            "To deliver there on purpose, add its network to BUMAIL_QUEUE['ALLOWED_PRIVATE_NETWORKS']."
        )

    def all_refused(self) -> Destinations:
        """Return the failure of a domain whose every address was refused."""
        return Destinations.failed(_UNROUTABLE_STATUS, f"No usable address for {self.domain}. {self.refused_text()}")


# -- Destination policy ---------------------------------------------------------------------

# The IANA special-purpose registries' entries that are not globally reachable
# (RFC 6890 and its updates), with multicast and the IPv6 space outside global
# unicast. ipaddress's ``is_global`` is asked as well, but on Python 3.11 it calls
# multicast, 192.0.0.8, 3fff::/20, 5f00::/16 and 2002::/16 global; this table names
# them. The more specific entries come first: the first match gives the reason.
_SPECIAL_IPV4: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(network), reason)
    for network, reason in (
        ("0.0.0.0/8", "this network (RFC 791)"),
        ("10.0.0.0/8", "private (RFC 1918)"),
        ("100.64.0.0/10", "shared address space, CGNAT (RFC 6598)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private (RFC 1918)"),
        # 192.0.0.9 and 192.0.0.10 are reachable anycast services, never a mail server.
        ("192.0.0.0/24", "IETF protocol assignments (RFC 6890)"),
        ("192.0.2.0/24", "documentation (RFC 5737)"),
        ("192.88.99.0/24", "6to4 relay anycast (RFC 7526)"),
        ("192.168.0.0/16", "private (RFC 1918)"),
        ("198.18.0.0/15", "benchmarking (RFC 2544)"),
        ("198.51.100.0/24", "documentation (RFC 5737)"),
        ("203.0.113.0/24", "documentation (RFC 5737)"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved (RFC 1112), or broadcast"),
    )
)
_SPECIAL_IPV6: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(network), reason)
    for network, reason in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        # RFC 4291 §2.5.5.1: IPv4-compatible addresses are deprecated; none is a mail server.
        ("::/96", "IPv4-compatible (deprecated, RFC 4291)"),
        ("64:ff9b:1::/48", "local-use NAT64 (RFC 8215)"),
        ("100::/64", "discard-only (RFC 6666)"),
        # Teredo, benchmarking, ORCHID, AMT and the other IETF protocol assignments.
        ("2001::/23", "IETF protocol assignments (RFC 2928)"),
        ("2001:db8::/32", "documentation (RFC 3849)"),
        ("3fff::/20", "documentation (RFC 9637)"),
        ("5f00::/16", "segment routing (RFC 9602)"),
        ("fc00::/7", "unique-local (RFC 4193)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated, RFC 3879)"),
        ("ff00::/8", "multicast"),
    )
)
# RFC 4291 §2.4: global unicast is 2000::/3; the rest of the space is unassigned or
# special (the forms that embed an IPv4 address are judged by that address).
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix


def destination_refusal(address: str | IPAddress, allowed: Sequence[IPNetwork] = ()) -> str | None:
    """Return why the worker may not connect to ``address``, or ``None`` when it may.

    An address in ``allowed`` may always be used, as may the IPv4 address an
    IPv4-mapped one stands for. Otherwise only globally routable unicast addresses
    may: the forms that embed an IPv4 address (IPv4-mapped, 6to4, NAT64) are judged
    by the IPv4 address they reach.
    """
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    if any(ip in network or (mapped is not None and mapped in network) for network in allowed):
        return None
    if isinstance(ip, ipaddress.IPv4Address):
        return _ipv4_refusal(ip)
    return _ipv6_refusal(ip)


def _ipv4_refusal(ip: ipaddress.IPv4Address) -> str | None:
    reason = next((reason for network, reason in _SPECIAL_IPV4 if ip in network), None)
    if reason is None and not ip.is_global:
        reason = "not globally routable"
    return reason


def _ipv6_refusal(ip: ipaddress.IPv6Address) -> str | None:
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        form, ipv4 = embedded
        why = _ipv4_refusal(ipv4)
        return None if why is None else f"{form} of {ipv4}, {why}"
    if ip.scope_id:
        return "scoped to a link"
    reason = next((reason for network, reason in _SPECIAL_IPV6 if ip in network), None)
    if reason is None and (ip not in _GLOBAL_UNICAST or not ip.is_global):
        reason = "not globally routable"
    return reason


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """Return the IPv4 address an IPv6 form reaches, and the form's name, if it is one."""
    if ip.ipv4_mapped is not None:  # RFC 4291 §2.5.5.2: the very IPv4 host, on a dual stack
        return "IPv4-mapped", ip.ipv4_mapped
    if ip.sixtofour is not None:  # RFC 3056: a relay forwards to the embedded address
        return "6to4", ip.sixtofour
    if ip in _NAT64:  # RFC 6052: a translator forwards to the last 32 bits
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None
