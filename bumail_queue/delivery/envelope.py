"""What the delivery layer passes between its parts: envelopes, hosts, results."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from bumail_queue.items import Outcome


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Envelope:
    """One SMTP transaction's worth of mail: a sender, some recipients, the message."""

    item_id: str
    sender: str  # "" is the null sender <>
    recipients: tuple[str, ...]
    message: bytes


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    """A server to connect to: its name (for TLS and logs), an address if known, a port.

    ``address`` is set when the resolver found it (an MX host's A/AAAA record);
    ``None`` means connect by ``name`` through the system's resolver (a smarthost).
    """

    name: str
    port: int
    address: str | None = None

    def __str__(self) -> str:
        where = self.address or self.name
        return f"{self.name}[{where}]:{self.port}" if self.address and self.address != self.name else f"{where}:{self.port}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    """What delivering one envelope decided: an outcome for every one of its recipients.

    ``remote_host`` names the server that gave the deciding replies (``None`` when no
    server answered: DNS, every host unreachable). ``tls`` says whether that server's
    session ran over TLS (STARTTLS or implicit), for the delivery log.
    """

    outcomes: Mapping[str, Outcome]
    remote_host: str | None = None
    tls: bool = False
