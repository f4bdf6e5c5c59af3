"""Which route each recipient takes, grouped so that one destination gets one transaction."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from bumail_queue.addresses import domain_of
from bumail_queue.conf import QueueSettings, Route, normalise_domain


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Destination:
    """Where a group of recipients goes: a smarthost, one domain's MX hosts, or a
    Django email backend.

    ``domain`` is the recipient domain for an MX route, ``None`` for a smarthost or a
    backend (all its recipients share one transaction, or one message to the backend).
    ``limit_key`` is what ``DOMAIN_CONCURRENCY`` counts sessions by: the recipient
    domain, the smarthost's host, or the backend route's name.
    """

    route: Route
    domain: str | None

    @property
    def limit_key(self) -> str:
        if self.domain is not None:
            return self.domain
        if self.route.type == "backend":
            return f"backend:{self.route.name}"
        return f"{self.route.host}:{self.route.port}"


def group_by_destination(
    addresses: Iterable[str], settings: QueueSettings, channel: str | None = None
) -> dict[Destination, list[str]]:
    """Return the recipients of an item in ``channel`` grouped by destination, each
    group in the envelope's order."""
    groups: dict[Destination, list[str]] = {}
    for address in addresses:
        domain = normalise_domain(domain_of(address))
        route = settings.route_for(domain, channel)
        destination = Destination(route=route, domain=domain if route.type == "mx" else None)
        groups.setdefault(destination, []).append(address)
    return groups
