"""Hosts, domains, nameservers and networks as the settings write them, and the forms
they are compared and used in."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from typing import Any, Final

from bumail_queue.addresses import normal_domain

HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_PORT = re.compile(r"[0-9]{1,5}")


def normalise_domain(domain: str) -> str:
    """Return the form domains are compared in (:func:`~bumail_queue.addresses.normal_domain`):
    lowercase IDNA2008 A-labels, no trailing dot."""
    return normal_domain(domain)


# Suffixes of names that are no fully qualified domain name of a mail host, though
# E006 takes them: RFC 5321 §4.1.1.1 wants EHLO to give the client's FQDN, and
# receivers reject or score the greeting of a name only its own network knows
# ("localhost" itself is a single label; "localhost.localdomain" ends in one of these).
_NON_GLOBAL_SUFFIXES: Final = (
    ".localhost",  # RFC 6761 §6.3: loopback names, this machine's alone
    ".localdomain",  # no registered TLD: the placeholder distributions and Postfix append to a bare host name
    ".local",  # RFC 6762: multicast DNS, answered on the link alone
)


def effective_hostname(raw: Mapping[str, Any]) -> str:
    """Return the EHLO name a raw ``BUMAIL_QUEUE`` gives: ``HOSTNAME``, else ``socket.getfqdn()``."""
    return raw.get("HOSTNAME") or socket.getfqdn()


def not_fqdn_reason(hostname: str) -> str | None:
    """Say why ``hostname`` is no fully qualified domain name to greet with, or return ``None``."""
    name = hostname.rstrip(".").lower()
    if is_ip(name):
        # RFC 5321 §4.1.3: an address goes in EHLO as a literal, "[192.0.2.1]", and
        # only when the host has no name.
        return "it is an IP address, not a name"
    if "." not in name:
        return "it is a single label, not a fully qualified name"
    if name.endswith(_NON_GLOBAL_SUFFIXES):
        return "it is a name that only this machine or its local network knows"
    return None


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def parse_network(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if not isinstance(value, str):
        return None
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None


def parse_nameserver(value: str) -> tuple[str, int] | None:
    host, port = value, 53
    if value.startswith("["):  # [::1]:5353
        host, _, rest = value[1:].partition("]")
        if rest:
            if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]):
                return None
            port = int(rest[1:])
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
        if not _PORT.fullmatch(port_text):
            return None
        port = int(port_text)
    if not is_ip(host) or not 0 < port < 65536:
        return None
    return host, port
