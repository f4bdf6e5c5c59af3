"""The typed ``BUMAIL_QUEUE`` that ``load()`` returns."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from datetime import timedelta

from bumail_queue.firewall import Firewall, RecipientPattern
from bumail_queue.shaping import Limits

from .archive import archive_duration
from .dkim import DKIMSigner
from .mailboxes import InboundMailbox
from .names import normalise_domain
from .routes import Route
from .tasks import TaskSettings
from .unsubscribe import ChannelUnsubscribe


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Timeouts:
    """How long each step of an SMTP session may take, in seconds (RFC 5321 §4.5.3.2)."""

    connect: float
    greeting: float
    mail: float
    rcpt: float
    data: float
    data_block: float
    data_end: float
    session: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class QueueSettings:
    """The validated ``BUMAIL_QUEUE``; see ``docs/settings.md`` for each field."""

    store: str
    database: str
    redis_connection: str
    redis_key_prefix: str
    hostname: str
    route: Route
    routes: Mapping[str, Route]
    channel_routes: Mapping[str, Route] = dataclasses.field(default_factory=dict)
    mx_port: int
    dns_nameservers: tuple[tuple[str, int], ...] | None
    concurrency: int
    domain_concurrency: int
    lease_seconds: int
    max_age: timedelta
    delay_warning: timedelta
    dsn_priority: int
    max_items: int | None
    max_message_size: int
    max_recipients: int
    allowed_private_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    mx_address_limit: int
    mx_session_limit: int
    unreachable_host_memory: timedelta
    dkim: tuple[DKIMSigner, ...]
    dkim_unsigned_on_error: bool
    mta_sts: bool
    mta_sts_https_port: int
    tls_ca_file: str | None
    retry_min_delay: timedelta
    retry_max_delay: timedelta
    retry_factor: float
    retry_jitter: float
    timeouts: Timeouts
    connection_reuse_seconds: float
    claim_batch_size: int
    poll_seconds: float
    delivery_log: bool
    delivery_log_retention: timedelta | None
    suppression: bool
    suppression_duration: timedelta
    suppression_expiry_window: timedelta | None
    suppression_dsn: bool
    return_path: str | None = None  # RETURN_PATH, with its {token}
    feedback_addresses: frozenset[str] = frozenset()  # FEEDBACK_ADDRESSES, normal form, ASCII-lowercase
    # INBOUND_MAILBOXES, by URL; repr=False: each holds a password.
    inbound_mailboxes: Mapping[str, InboundMailbox] = dataclasses.field(default_factory=dict, repr=False)
    tasks: TaskSettings | None = None
    metrics_domains: frozenset[str] = frozenset()
    metrics_token: str | None = dataclasses.field(default=None, repr=False)
    shaping: Mapping[str, Limits] = dataclasses.field(default_factory=dict)
    unsubscribe: Mapping[str, ChannelUnsubscribe] = dataclasses.field(default_factory=dict)  # UNSUBSCRIBE, by channel
    allow_recipients: tuple[RecipientPattern, ...] | None = None  # None: no staging firewall
    redirect_to: str | None = None
    archive: Mapping[str, timedelta] = dataclasses.field(default_factory=dict)  # ARCHIVE, by channel (0: not archived)
    redact_after: timedelta = timedelta(days=30)  # REDACT_AFTER

    def archive_for(self, channel: str) -> timedelta | None:
        """Return how long ``channel``'s delivered mail is kept whole (``ARCHIVE``: its
        entry, else ``"default"``'s), or ``None`` when it is not archived."""
        return archive_duration(self.archive, channel)

    @property
    def firewall(self) -> Firewall | None:
        """Return the staging firewall of ``ALLOW_RECIPIENTS`` and ``REDIRECT_TO``, or
        ``None`` when mail goes to every recipient."""
        if self.allow_recipients is None:
            return None
        return Firewall(self.allow_recipients, self.redirect_to)

    @property
    def lease(self) -> timedelta:
        """Return a claim's lease as a duration."""
        return timedelta(seconds=self.lease_seconds)

    def route_for(self, domain: str, channel: str | None = None) -> Route:
        """Return the route of a recipient domain in ``channel``: the domain's ``ROUTES``
        entry, else the channel's ``CHANNEL_ROUTES`` entry, else ``ROUTE``."""
        route = self.routes.get(normalise_domain(domain))
        if route is not None:
            return route
        if channel is not None and (by_channel := self.channel_routes.get(channel)) is not None:
            return by_channel
        return self.route
