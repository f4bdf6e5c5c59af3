"""Which route each recipient takes, grouped so that one destination gets one transaction."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from bumail_queue.addresses import domain_of
from bumail_queue.conf import QueueSettings, Route, normalise_domain


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Destination:
    """Where a group of recipients goes: a smarthost, or one domain's MX hosts.

    ``domain`` is the recipient domain for an MX route, ``None`` for a smarthost (all
    its recipients share one transaction). ``limit_key`` is what ``DOMAIN_CONCURRENCY``
    counts sessions by: the recipient domain, or the smarthost's host.
    """

    route: Route
    domain: str | None

    @property
    def limit_key(self) -> str:
        if self.domain is not None:
            return self.domain
        return f"{self.route.host}:{self.route.port}"


def group_by_destination(addresses: Iterable[str], settings: QueueSettings) -> dict[Destination, list[str]]:
    """Return the recipients grouped by destination, each group in the envelope's order."""
    groups: dict[Destination, list[str]] = {}
    for address in addresses:
        domain = normalise_domain(domain_of(address))
        route = settings.route_for(domain)
        destination = Destination(route=route, domain=domain if route.type == "mx" else None)
        groups.setdefault(destination, []).append(address)
    return groups
