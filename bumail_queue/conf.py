"""``BUMAIL_QUEUE``: read in this one place, validated, typed, reloaded on change.

``validate()`` is the single validator: ``load()`` raises on what it finds, and the
checks framework reports the same problems with ids, so ``manage.py check`` and a
start-up say the same thing. No message ever repeats the value of ``PASSWORD``.

It is long because every key has its rule here, next to its default and its typed
field: one place to read what a setting takes and what a wrong value says.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import ipaddress
import math
import os
import re
import socket
import ssl
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .addresses import normal_domain
from .errors import QueueConfigurationError, QueueError
from .items import check_priority
from .shaping import DEFAULT_PATTERN, SLOW_START_INITIAL, Limits, parse_rate
from .sts import STSMode

SETTING_NAME: Final = "BUMAIL_QUEUE"

DEFAULTS: Final[Mapping[str, Any]] = {
    "STORE": "orm",
    "DATABASE": "default",
    "REDIS_CONNECTION": "default",
    "REDIS_KEY_PREFIX": "bumail:queue:",
    "HOSTNAME": None,  # socket.getfqdn() when read
    "ROUTE": {"TYPE": "mx"},
    "ROUTES": {},
    "MX_PORT": 25,
    "DNS_NAMESERVERS": None,
    "CONCURRENCY": 20,
    "DOMAIN_CONCURRENCY": 20,
    "LEASE_SECONDS": 600,
    "MAX_AGE": timedelta(days=5),
    "DELAY_WARNING": timedelta(hours=4),
    # The priority of the DSNs the worker sends (-100 to 100); each goes in the
    # channel of the mail it reports on.
    "DSN_PRIORITY": 0,
    "MAX_ITEMS": None,
    "MAX_MESSAGE_SIZE": 25 * 1024 * 1024,
    # Postfix's smtpd_recipient_limit.
    "MAX_RECIPIENTS": 1000,
    # Networks that MX, A/AAAA and address-literal destinations may be in beyond the
    # globally routable ones (ROUTE/ROUTES hosts are trusted as written).
    "ALLOWED_PRIVATE_NETWORKS": [],
    # Postfix's smtp_mx_address_limit and smtp_mx_session_limit.
    "MX_ADDRESS_LIMIT": 5,
    "MX_SESSION_LIMIT": 2,
    # RFC 5321 §4.5.4.1: hosts that did not answer are not tried again for this long
    # (Postfix keeps a dead destination for minimal_backoff_time, 300 s); 0: off.
    "UNREACHABLE_HOST_MEMORY": timedelta(minutes=5),
    # DKIM signers (RFC 6376, RFC 8463), each {"DOMAIN", "SELECTOR", "KEY", "ALGORITHM"};
    # a message whose signing fails waits (deferred) unless DKIM_UNSIGNED_ON_ERROR.
    "DKIM": [],
    "DKIM_UNSIGNED_ON_ERROR": False,
    # RFC 8461 for MX delivery, as KumoMTA has it: on unless turned off. The policy is
    # fetched over HTTPS from port MTA_STS_HTTPS_PORT; TLS_CA_FILE (None: the system's
    # trust store) verifies policy hosts, MX hosts under a policy and smarthosts.
    "MTA_STS": True,
    "MTA_STS_HTTPS_PORT": 443,
    "TLS_CA_FILE": None,
    # RFC 5321 §4.5.4.1: retries at least 30 minutes apart, growing, with jitter.
    "RETRY_MIN_DELAY": timedelta(minutes=30),
    "RETRY_MAX_DELAY": timedelta(hours=4),
    "RETRY_FACTOR": 2.0,
    "RETRY_JITTER": 0.1,
    "TIMEOUTS": {},
    "CONNECTION_REUSE_SECONDS": 10,
    "CLAIM_BATCH_SIZE": 50,
    "POLL_SECONDS": 5,
    # The delivery log: each recipient's outcome, kept after the item left the queue.
    "DELIVERY_LOG": True,
    "DELIVERY_LOG_RETENTION": timedelta(days=30),
    # A task framework to send a delivery task to on commit of each enqueue
    # (docs/tasks.md): None (off), "django", "celery", or a dict with FRAMEWORK.
    "TASKS": None,
    # Prometheus metrics (docs/metrics.md): the recipient domains that get a label of
    # their own (every other is "other"), and the bearer token of the metrics view.
    "METRICS_DOMAINS": [],
    "METRICS_TOKEN": None,
    # The suppression list: addresses whose mailbox or domain does not exist, or whose
    # delivery time expired twice within SUPPRESSION_EXPIRY_WINDOW (None: never), fail
    # at once for SUPPRESSION_DURATION; SUPPRESSION_DSN: with a DSN, as other failures.
    "SUPPRESSION": True,
    "SUPPRESSION_DURATION": timedelta(days=30),
    "SUPPRESSION_EXPIRY_WINDOW": timedelta(days=30),
    "SUPPRESSION_DSN": True,
    # Limits per destination pattern, held across every worker (docs/shaping.md).
    "SHAPING": {},
}

#: RFC 5321 §4.5.3.2's timeouts, in seconds; ``TIMEOUTS`` overrides any of them.
#: CONNECT and SESSION are ours: the TCP connection, and a whole session, DNS included.
DEFAULT_TIMEOUTS: Final[Mapping[str, float]] = {
    "CONNECT": 30,
    "GREETING": 300,
    "MAIL": 300,
    "RCPT": 300,
    "DATA": 120,
    "DATA_BLOCK": 180,
    "DATA_END": 600,
    "SESSION": 1800,
}

#: The store aliases bumail_queue ships; anything else is a dotted path.
BUILTIN_STORES: Final = {
    "orm": "bumail_queue.stores.orm.ORMStore",
    "memory": "bumail_queue.stores.memory.MemoryStore",
    "redis": "bumail_queue.stores.redis.RedisStore",
}

#: The task frameworks ``TASKS`` may name, each with the module of its delivery task.
TASK_FRAMEWORKS: Final = {
    "django": "bumail_queue.tasks.django",
    "celery": "bumail_queue.tasks.celery",
}
#: What each framework needs importable: Django 6's own module, or the backport.
_TASK_FRAMEWORK_MODULES: Final = {"django": ("django.tasks", "django_tasks"), "celery": ("celery",)}
_TASK_KEYS: Final = {
    "django": {"FRAMEWORK", "BACKEND", "QUEUE", "CLAIM_SECONDS"},
    "celery": {"FRAMEWORK", "QUEUE", "CLAIM_SECONDS"},
}
DEFAULT_TASK_CLAIM_SECONDS: Final = 60.0

ROUTE_TYPES: Final = ("mx", "smarthost")
TLS_MODES: Final = ("starttls", "implicit", "none")
_ROUTE_KEYS: Final = {
    "mx": {"TYPE", "TLS_REQUIRED"},
    "smarthost": {"TYPE", "HOST", "PORT", "USERNAME", "PASSWORD", "TLS", "TLS_VERIFY"},
}
_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_REDIS_PREFIX = re.compile(r"[a-z][a-z0-9_:.\-]{0,39}")
_PORT = re.compile(r"[0-9]{1,5}")
#: The most ``METRICS_DOMAINS`` a project may name: each is a label value of every
#: worker's attempt counters, and Prometheus keeps a series per value.
MAX_METRICS_DOMAINS: Final = 50
#: The shortest ``METRICS_TOKEN``: 16 characters, guessed by no one.
MIN_METRICS_TOKEN: Final = 16
_TOKEN = re.compile(r"[\x21-\x7e]+")
# Durations beyond this are a mistake (and beyond what a timer or timedelta holds).
_MAX_DURATION_SECONDS = 10 * 366 * 24 * 3600
# The longest a step may wait: 2**31 - 1 ms (about 24 days), the most a timer of
# many platforms and libraries holds; anything longer is a mistake.
_MAX_TIMEOUT_SECONDS = 2147483


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One thing wrong with ``BUMAIL_QUEUE``: the check id, the key, and what to do."""

    id: str
    key: str
    message: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    """Where mail for a domain goes: its MX hosts, or a smarthost.

    ``mta_sts`` is never set from the settings: the worker sets it on an MX route when
    the recipient domain's MTA-STS policy applies (RFC 8461). ``enforce`` requires
    STARTTLS and a certificate valid for the MX host's name; ``testing`` checks the
    same, reports what failed, and goes on as without a policy.
    """

    type: str
    host: str | None = None
    port: int | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    tls: str = "starttls"
    tls_verify: bool = True
    tls_required: bool = False
    mta_sts: STSMode | None = None


DKIM_ALGORITHMS: Final = ("rsa-sha256", "ed25519-sha256")
_DKIM_KEYS: Final = frozenset({"DOMAIN", "SELECTOR", "KEY", "ALGORITHM"})


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DKIMSigner:
    """One ``DKIM`` entry: who signs (``d=``, ``s=``), with which key and algorithm.

    ``key`` is as written: a PEM, a path to a PEM file, or the dotted path of a
    callable that returns one; ``delivery.dkim`` reads it. It is never shown.
    """

    domain: str  # lowercase A-labels
    selector: str
    key: str = dataclasses.field(repr=False)
    algorithm: str = "rsa-sha256"


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
class TaskSettings:
    """``TASKS``: the framework the delivery tasks are sent to, and how (docs/tasks.md)."""

    framework: str  # a key of TASK_FRAMEWORKS
    module: str  # the module of its delivery task
    backend: str = "default"  # the django.tasks backend alias
    queue: str | None = None  # None: the framework's own default (or Celery's routes)
    claim_seconds: float = DEFAULT_TASK_CLAIM_SECONDS


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
    tasks: TaskSettings | None = None
    metrics_domains: frozenset[str] = frozenset()
    metrics_token: str | None = dataclasses.field(default=None, repr=False)
    shaping: Mapping[str, Limits] = dataclasses.field(default_factory=dict)

    @property
    def lease(self) -> timedelta:
        """Return a claim's lease as a duration."""
        return timedelta(seconds=self.lease_seconds)

    def route_for(self, domain: str) -> Route:
        """Return the route of a recipient domain: its ``ROUTES`` entry, else ``ROUTE``."""
        return self.routes.get(normalise_domain(domain), self.route)


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
    if _is_ip(name):
        # RFC 5321 §4.1.3: an address goes in EHLO as a literal, "[192.0.2.1]", and
        # only when the host has no name.
        return "it is an IP address, not a name"
    if "." not in name:
        return "it is a single label, not a fully qualified name"
    if name.endswith(_NON_GLOBAL_SUFFIXES):
        return "it is a name that only this machine or its local network knows"
    return None


class _Validator:
    """Collects every problem of one raw ``BUMAIL_QUEUE`` rather than stopping at the first."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, check_id: str, key: str, message: str) -> None:
        self.problems.append(Problem(id=check_id, key=key, message=message))

    def positive_int(self, raw: Mapping[str, Any], key: str, check_id: str, *, optional: bool = False) -> None:
        value = raw.get(key, DEFAULTS[key])
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            allowed = "a whole number above 0" + (", or None" if optional else "")
            self.add(check_id, key, f"BUMAIL_QUEUE['{key}'] must be {allowed}; got {value!r}.")

    def port(self, raw: Mapping[str, Any], key: str, check_id: str) -> None:
        value = raw.get(key, DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            self.add(check_id, key, f"BUMAIL_QUEUE['{key}'] must be a port number from 1 to 65535; got {value!r}.")

    def duration(self, raw: Mapping[str, Any], key: str, check_id: str, *, zero_is_off: bool = False) -> float | None:
        """Check a duration; return it in seconds, or ``None`` when it is not valid.

        ``zero_is_off``: 0 is valid too, and turns the setting's feature off.
        """
        value = raw.get(key, DEFAULTS[key])
        seconds = 0.0 if zero_is_off and _is_zero(value) else _duration_seconds(value)
        if seconds is None:
            allowed = "from 0 (off) to 10 years" if zero_is_off else "above 0 and at most 10 years"
            self.add(
                check_id,
                key,
                f"BUMAIL_QUEUE['{key}'] must be a timedelta or a number of seconds {allowed}; got {value!r}.",
            )
        return seconds

    def route(self, value: Any, where: str) -> None:
        if not isinstance(value, Mapping):
            self.add("bumail_queue.E007", where, f"{where} must be a dict with a 'TYPE'; got {type(value).__name__}.")
            return
        route_type = value.get("TYPE")
        if route_type not in ROUTE_TYPES:
            self.add(
                "bumail_queue.E007",
                where,
                f"{where}['TYPE'] must be one of {', '.join(map(repr, ROUTE_TYPES))}; got {route_type!r}.",
            )
            return
        unknown = sorted(set(value) - _ROUTE_KEYS[route_type])
        if unknown:
            self.add(
                "bumail_queue.E007",
                where,
                f"{where} has keys a {route_type!r} route does not take: {', '.join(unknown)} (allowed: {', '.join(sorted(_ROUTE_KEYS[route_type]))}).",
            )
        if route_type == "smarthost":
            self._smarthost(value, where)
        for flag in ("TLS_REQUIRED", "TLS_VERIFY"):
            if flag in value and not isinstance(value[flag], bool):
                self.add("bumail_queue.E007", where, f"{where}['{flag}'] must be True or False.")

    def _smarthost(self, value: Mapping[str, Any], where: str) -> None:
        host = value.get("HOST")
        if "HOST" not in value:
            self.add(
                "bumail_queue.E007",
                where,
                f"{where} needs a 'HOST': a smarthost route sends all its mail to that host name or IP address.",
            )
        elif not isinstance(host, str) or not host or not (_HOSTNAME.fullmatch(host) or _is_ip(host)):
            self.add("bumail_queue.E007", where, f"{where}['HOST'] must be a host name or IP address; got {host!r}.")
        port = value.get("PORT", 587)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            self.add(
                "bumail_queue.E007", where, f"{where}['PORT'] must be a port number from 1 to 65535; got {port!r}."
            )
        tls = value.get("TLS", "starttls")
        if tls not in TLS_MODES:
            self.add(
                "bumail_queue.E007",
                where,
                f"{where}['TLS'] must be one of {', '.join(map(repr, TLS_MODES))}; got {tls!r}.",
            )
        username, password = value.get("USERNAME"), value.get("PASSWORD")
        if username is not None and not isinstance(username, str):
            self.add("bumail_queue.E007", where, f"{where}['USERNAME'] must be a string.")
        if password is not None and not isinstance(password, str):
            # Never echo the value: it is a secret even when it has the wrong type.
            self.add("bumail_queue.E007", where, f"{where}['PASSWORD'] must be a string.")
        if (username is None) != (password is None):
            self.add("bumail_queue.E007", where, f"{where} needs both 'USERNAME' and 'PASSWORD' for AUTH, or neither.")


def _duration_seconds(value: Any) -> float | None:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return None
    return float(seconds) if 0 < seconds <= _MAX_DURATION_SECONDS else None


def _is_zero(value: Any) -> bool:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    return not isinstance(seconds, bool) and isinstance(seconds, int | float) and seconds == 0


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _parse_network(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if not isinstance(value, str):
        return None
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None


def _parse_nameserver(value: str) -> tuple[str, int] | None:
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
    if not _is_ip(host) or not 0 < port < 65536:
        return None
    return host, port


def validate(raw: Any) -> list[Problem]:
    """Return every problem of a raw ``BUMAIL_QUEUE`` value; empty when it is valid."""
    check = _Validator()
    if not isinstance(raw, Mapping):
        check.add("bumail_queue.E001", "", f"BUMAIL_QUEUE must be a dict; got {type(raw).__name__}.")
        return check.problems
    for key in sorted(set(raw) - set(DEFAULTS), key=repr):
        near = difflib.get_close_matches(str(key), DEFAULTS, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else f" Known keys: {', '.join(DEFAULTS)}."
        check.add("bumail_queue.E002", str(key), f"BUMAIL_QUEUE has an unknown key {key!r}.{hint}")

    store = raw.get("STORE", DEFAULTS["STORE"])
    if not isinstance(store, str) or not store or (store not in BUILTIN_STORES and "." not in store):
        check.add(
            "bumail_queue.E003",
            "STORE",
            f"BUMAIL_QUEUE['STORE'] must be one of {', '.join(map(repr, BUILTIN_STORES))} or the dotted path of a QueueStore class; got {store!r}.",
        )
    database = raw.get("DATABASE", DEFAULTS["DATABASE"])
    if not isinstance(database, str) or database not in django_settings.DATABASES:
        check.add(
            "bumail_queue.E004",
            "DATABASE",
            f"BUMAIL_QUEUE['DATABASE'] must name an alias of DATABASES ({', '.join(map(repr, django_settings.DATABASES))}); got {database!r}.",
        )
    if not isinstance(raw.get("REDIS_CONNECTION", DEFAULTS["REDIS_CONNECTION"]), str):
        check.add("bumail_queue.E005", "REDIS_CONNECTION", "BUMAIL_QUEUE['REDIS_CONNECTION'] must name a CACHES alias.")
    prefix = raw.get("REDIS_KEY_PREFIX", DEFAULTS["REDIS_KEY_PREFIX"])
    if not isinstance(prefix, str) or not _REDIS_PREFIX.fullmatch(prefix):
        check.add(
            "bumail_queue.E005",
            "REDIS_KEY_PREFIX",
            "BUMAIL_QUEUE['REDIS_KEY_PREFIX'] must be 1 to 40 of lowercase letters, digits, '_', ':', '.' and '-', "
            f"starting with a letter (no '{{' and no glob character); got {prefix!r}.",
        )
    hostname = raw.get("HOSTNAME")
    if hostname is not None and (not isinstance(hostname, str) or not _HOSTNAME.fullmatch(hostname)):
        check.add(
            "bumail_queue.E006",
            "HOSTNAME",
            f"BUMAIL_QUEUE['HOSTNAME'] must be a host name (letters, digits, hyphens and dots), or None for socket.getfqdn(); got {hostname!r}.",
        )

    check.route(raw.get("ROUTE", DEFAULTS["ROUTE"]), "BUMAIL_QUEUE['ROUTE']")
    routes = raw.get("ROUTES", DEFAULTS["ROUTES"])
    if not isinstance(routes, Mapping):
        check.add("bumail_queue.E007", "ROUTES", "BUMAIL_QUEUE['ROUTES'] must be a dict of recipient domain to route.")
    else:
        for domain, route in routes.items():
            if not isinstance(domain, str) or not _HOSTNAME.fullmatch(normalise_domain(domain)):
                check.add(
                    "bumail_queue.E007", "ROUTES", f"BUMAIL_QUEUE['ROUTES'] has a key that is not a domain: {domain!r}."
                )
            check.route(route, f"BUMAIL_QUEUE['ROUTES'][{domain!r}]")

    check.port(raw, "MX_PORT", "bumail_queue.E008")
    nameservers = raw.get("DNS_NAMESERVERS")
    if nameservers is not None and (
        isinstance(nameservers, str)
        or not isinstance(nameservers, list | tuple)
        or not nameservers
        or not all(isinstance(ns, str) and _parse_nameserver(ns) for ns in nameservers)
    ):
        check.add(
            "bumail_queue.E009",
            "DNS_NAMESERVERS",
            f"BUMAIL_QUEUE['DNS_NAMESERVERS'] must be None or a non-empty list of 'ip' or 'ip:port' strings; got {nameservers!r}.",
        )
    for key in ("CONCURRENCY", "DOMAIN_CONCURRENCY", "LEASE_SECONDS"):
        check.positive_int(raw, key, "bumail_queue.E010")
    for key in ("MAX_AGE", "DELAY_WARNING"):
        check.duration(raw, key, "bumail_queue.E011")
    check.positive_int(raw, "MAX_ITEMS", "bumail_queue.E012", optional=True)
    check.positive_int(raw, "MAX_MESSAGE_SIZE", "bumail_queue.E012")
    check.positive_int(raw, "MAX_RECIPIENTS", "bumail_queue.E012")
    networks = raw.get("ALLOWED_PRIVATE_NETWORKS", DEFAULTS["ALLOWED_PRIVATE_NETWORKS"])
    if (
        isinstance(networks, str)
        or not isinstance(networks, list | tuple)
        or not all(_parse_network(n) for n in networks)
    ):
        check.add(
            "bumail_queue.E021",
            "ALLOWED_PRIVATE_NETWORKS",
            f"BUMAIL_QUEUE['ALLOWED_PRIVATE_NETWORKS'] must be a list of CIDR strings such as '10.0.0.0/8' or 'fd00::/8'; got {networks!r}.",
        )
    for key in ("MX_ADDRESS_LIMIT", "MX_SESSION_LIMIT"):
        check.positive_int(raw, key, "bumail_queue.E021")
    check.duration(raw, "UNREACHABLE_HOST_MEMORY", "bumail_queue.E021", zero_is_off=True)
    _check_dkim(check, raw)
    _check_mta_sts(check, raw)
    min_delay = check.duration(raw, "RETRY_MIN_DELAY", "bumail_queue.E015")
    max_delay = check.duration(raw, "RETRY_MAX_DELAY", "bumail_queue.E015")
    if min_delay is not None and max_delay is not None and min_delay > max_delay:
        check.add(
            "bumail_queue.E015",
            "RETRY_MAX_DELAY",
            "BUMAIL_QUEUE['RETRY_MAX_DELAY'] must not be shorter than 'RETRY_MIN_DELAY'.",
        )
    factor = raw.get("RETRY_FACTOR", DEFAULTS["RETRY_FACTOR"])
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not math.isfinite(factor)
        or not 1 <= factor <= 10
    ):
        check.add(
            "bumail_queue.E015",
            "RETRY_FACTOR",
            f"BUMAIL_QUEUE['RETRY_FACTOR'] must be a number from 1 to 10; got {factor!r}.",
        )
    jitter = raw.get("RETRY_JITTER", DEFAULTS["RETRY_JITTER"])
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter < 1:
        check.add(
            "bumail_queue.E015",
            "RETRY_JITTER",
            f"BUMAIL_QUEUE['RETRY_JITTER'] must be a number from 0 up to (not including) 1; got {jitter!r}.",
        )
    timeouts = raw.get("TIMEOUTS", DEFAULTS["TIMEOUTS"])
    if not isinstance(timeouts, Mapping):
        check.add("bumail_queue.E016", "TIMEOUTS", "BUMAIL_QUEUE['TIMEOUTS'] must be a dict of step name to seconds.")
    else:
        for step, seconds in timeouts.items():
            if step not in DEFAULT_TIMEOUTS:
                check.add(
                    "bumail_queue.E016",
                    "TIMEOUTS",
                    f"BUMAIL_QUEUE['TIMEOUTS'] has an unknown step {step!r}; the steps are {', '.join(DEFAULT_TIMEOUTS)}.",
                )
            elif (
                isinstance(seconds, bool)
                or not isinstance(seconds, int | float)
                or not math.isfinite(seconds)
                or not 0 < seconds <= _MAX_TIMEOUT_SECONDS
            ):
                check.add(
                    "bumail_queue.E016",
                    "TIMEOUTS",
                    f"BUMAIL_QUEUE['TIMEOUTS'][{step!r}] must be a number of seconds above 0 and at most {_MAX_TIMEOUT_SECONDS}; got {seconds!r}.",
                )
    reuse = raw.get("CONNECTION_REUSE_SECONDS", DEFAULTS["CONNECTION_REUSE_SECONDS"])
    if (
        isinstance(reuse, bool)
        or not isinstance(reuse, int | float)
        or not math.isfinite(reuse)
        or not 0 <= reuse <= 3600
    ):
        check.add(
            "bumail_queue.E017",
            "CONNECTION_REUSE_SECONDS",
            f"BUMAIL_QUEUE['CONNECTION_REUSE_SECONDS'] must be a number of seconds from 0 (no reuse) to 3600; got {reuse!r}.",
        )
    check.positive_int(raw, "CLAIM_BATCH_SIZE", "bumail_queue.E017")
    poll = raw.get("POLL_SECONDS", DEFAULTS["POLL_SECONDS"])
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not math.isfinite(poll) or not 0 < poll <= 3600:
        check.add(
            "bumail_queue.E017",
            "POLL_SECONDS",
            f"BUMAIL_QUEUE['POLL_SECONDS'] must be a number of seconds above 0 and at most 3600; got {poll!r}.",
        )
    dsn_priority = raw.get("DSN_PRIORITY", DEFAULTS["DSN_PRIORITY"])
    try:
        check_priority(dsn_priority, "BUMAIL_QUEUE['DSN_PRIORITY']")
    except QueueError as error:
        check.add("bumail_queue.E031", "DSN_PRIORITY", error.message)
    if not isinstance(raw.get("DELIVERY_LOG", DEFAULTS["DELIVERY_LOG"]), bool):
        check.add(
            "bumail_queue.E020",
            "DELIVERY_LOG",
            f"BUMAIL_QUEUE['DELIVERY_LOG'] must be True or False; got {raw.get('DELIVERY_LOG')!r}.",
        )
    if raw.get("DELIVERY_LOG_RETENTION", DEFAULTS["DELIVERY_LOG_RETENTION"]) is not None:
        check.duration(raw, "DELIVERY_LOG_RETENTION", "bumail_queue.E020")
    for problem in _task_problems(raw.get("TASKS")):
        check.add("bumail_queue.E025", "TASKS", f"BUMAIL_QUEUE['TASKS'] {problem}.")
    _check_metrics(check, raw)
    _check_suppression(check, raw)
    _check_shaping(check, raw.get("SHAPING", DEFAULTS["SHAPING"]))
    return check.problems


def _task_problems(value: Any) -> list[str]:
    """What is wrong with ``TASKS``; finding the framework imports nothing of it."""
    if value is None:
        return []
    if isinstance(value, str):
        value = {"FRAMEWORK": value}
    if not isinstance(value, Mapping):
        return [f"must be None, 'django', 'celery' or a dict with 'FRAMEWORK'; got {value!r}"]
    framework = value.get("FRAMEWORK")
    if framework not in TASK_FRAMEWORKS:
        return [f"names the framework {framework!r}; it must be one of {', '.join(map(repr, TASK_FRAMEWORKS))}"]
    problems = [
        f"has a key a {framework!r} set-up does not take: {key!r} (allowed: {', '.join(sorted(_TASK_KEYS[framework]))})"
        for key in sorted(set(value) - _TASK_KEYS[framework], key=repr)
    ]
    for key in ("BACKEND", "QUEUE"):
        if key in value and not (isinstance(value[key], str) and value[key]):
            problems.append(f"['{key}'] must be a non-empty string; got {value[key]!r}")
    seconds = value.get("CLAIM_SECONDS", DEFAULT_TASK_CLAIM_SECONDS)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= 3600:
        problems.append(f"['CLAIM_SECONDS'] must be a number of seconds above 0 and at most 3600; got {seconds!r}")
    if not any(_importable(module) for module in _TASK_FRAMEWORK_MODULES[framework]):
        problems.append(_missing_framework(framework))
    elif framework == "django":
        problems += _django_task_backend_problems(value.get("BACKEND", "default"))
    return problems


def task_framework(raw: Any) -> str | None:
    """The framework a raw ``BUMAIL_QUEUE`` names in ``TASKS``, read without validating
    the rest (``None``: off, or a value ``validate()`` refuses)."""
    value = raw.get("TASKS") if isinstance(raw, Mapping) else None
    framework = value.get("FRAMEWORK") if isinstance(value, Mapping) else value
    return framework if isinstance(framework, str) and framework in TASK_FRAMEWORKS else None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


def _missing_framework(framework: str) -> str:
    if framework == "celery":
        return "names Celery, which is not installed: pip install 'bumail_queue[celery]'"
    return (
        "names django.tasks, which Django 6.0 brings and Django 5.2 has from the django-tasks package: "
        "pip install 'bumail_queue[tasks]', or upgrade Django"
    )


def _django_task_backend_problems(backend: Any) -> list[str]:
    if not isinstance(backend, str) or not backend:
        return []  # said above
    # Django's TASKS (and the backport's) default to one "default" backend.
    aliases = getattr(django_settings, "TASKS", None) or {"default": {}}
    if backend in aliases:
        return []
    return [f"['BACKEND'] is {backend!r}, which is not an alias of the TASKS setting ({', '.join(map(repr, aliases))})"]


def _tasks_from(raw: Any) -> TaskSettings | None:
    if raw is None:
        return None
    value = {"FRAMEWORK": raw} if isinstance(raw, str) else raw
    return TaskSettings(
        framework=value["FRAMEWORK"],
        module=TASK_FRAMEWORKS[value["FRAMEWORK"]],
        backend=value.get("BACKEND", "default"),
        queue=value.get("QUEUE"),
        claim_seconds=float(value.get("CLAIM_SECONDS", DEFAULT_TASK_CLAIM_SECONDS)),
    )


def _check_metrics(check: _Validator, raw: Mapping[str, Any]) -> None:
    """Check ``METRICS_DOMAINS`` (a bounded list of domains: label values) and
    ``METRICS_TOKEN`` (never repeated in a message: it is a secret)."""
    domains = raw.get("METRICS_DOMAINS", DEFAULTS["METRICS_DOMAINS"])
    if isinstance(domains, str) or not isinstance(domains, list | tuple | set | frozenset):
        check.add(
            "bumail_queue.E026",
            "METRICS_DOMAINS",
            f"BUMAIL_QUEUE['METRICS_DOMAINS'] must be a list of recipient domains such as ['gmail.com']; got {domains!r}.",
        )
    else:
        bad = [d for d in domains if not (isinstance(d, str) and _is_dkim_domain(d))]
        if bad:
            check.add(
                "bumail_queue.E026",
                "METRICS_DOMAINS",
                f"BUMAIL_QUEUE['METRICS_DOMAINS'] must hold domain names such as 'gmail.com'; these are not: "
                f"{', '.join(map(repr, bad))}.",
            )
        elif len({normalise_domain(d) for d in domains}) > MAX_METRICS_DOMAINS:
            check.add(
                "bumail_queue.E026",
                "METRICS_DOMAINS",
                f"BUMAIL_QUEUE['METRICS_DOMAINS'] names {len(domains)} domains; at most {MAX_METRICS_DOMAINS} may "
                "have a label of their own (each multiplies the series Prometheus keeps).",
            )
    token = raw.get("METRICS_TOKEN")
    if token is not None and not (
        isinstance(token, str) and len(token) >= MIN_METRICS_TOKEN and _TOKEN.fullmatch(token)
    ):
        check.add(
            "bumail_queue.E026",
            "METRICS_TOKEN",
            f"BUMAIL_QUEUE['METRICS_TOKEN'] must be None or a string of at least {MIN_METRICS_TOKEN} printable "
            "ASCII characters without spaces (python -c 'import secrets; print(secrets.token_urlsafe(32))' "
            "makes one).",
        )


def _check_suppression(check: _Validator, raw: Mapping[str, Any]) -> None:
    for key in ("SUPPRESSION", "SUPPRESSION_DSN"):
        if not isinstance(raw.get(key, DEFAULTS[key]), bool):
            check.add("bumail_queue.E030", key, f"BUMAIL_QUEUE['{key}'] must be True or False; got {raw[key]!r}.")
    check.duration(raw, "SUPPRESSION_DURATION", "bumail_queue.E030")
    if raw.get("SUPPRESSION_EXPIRY_WINDOW", DEFAULTS["SUPPRESSION_EXPIRY_WINDOW"]) is not None:
        check.duration(raw, "SUPPRESSION_EXPIRY_WINDOW", "bumail_queue.E030")


_SHAPING_KEYS: Final = ("CONCURRENCY", "RATE", "SLOW_START", "SUSPEND")


def shaping_pattern(key: Any) -> str | None:
    """Return a ``SHAPING`` key in the form it is matched in, or ``None`` for one that is
    no pattern: ``"*"``, a domain (``"example.com"``), or a dot and a domain, an MX host
    suffix (``".google.com"``), each lowercase in A-labels."""
    if key == DEFAULT_PATTERN:
        return DEFAULT_PATTERN
    if not isinstance(key, str) or not key.strip("."):
        return None
    suffix = key.startswith(".")
    name = normalise_domain(key[1:] if suffix else key)
    if not _HOSTNAME.fullmatch(name) or name.endswith(".") or _is_ip(name):
        return None
    return f".{name}" if suffix else name


def _check_shaping(check: _Validator, shaping: Any) -> None:
    where = "BUMAIL_QUEUE['SHAPING']"
    if not isinstance(shaping, Mapping):
        check.add(
            "bumail_queue.E028",
            "SHAPING",
            f"{where} must be a dict of destination pattern to limits; got {type(shaping).__name__}.",
        )
        return
    seen: dict[str, Any] = {}
    for key, limits in shaping.items():
        pattern = shaping_pattern(key)
        if pattern is None:
            check.add(
                "bumail_queue.E028",
                "SHAPING",
                f"{where} has a key that is no destination pattern: {key!r}. A key is a recipient domain "
                "('example.com'), an MX host suffix starting with a dot ('.google.com'), or '*' for every other destination.",
            )
        elif pattern in seen:
            check.add(
                "bumail_queue.E028", "SHAPING", f"{where} names {pattern!r} twice: {seen[pattern]!r} and {key!r}."
            )
        else:
            seen[pattern] = key
        for problem in _limits_problems(limits):
            check.add("bumail_queue.E028", "SHAPING", f"{where}[{key!r}] {problem}.")


def _limits_problems(limits: Any) -> list[str]:
    if not isinstance(limits, Mapping):
        return [f"must be a dict of {', '.join(_SHAPING_KEYS)}; got {type(limits).__name__}"]
    problems = [
        f"has the unknown key {key!r} (it takes {', '.join(_SHAPING_KEYS)})"
        for key in sorted(set(limits) - set(_SHAPING_KEYS), key=repr)
    ]
    concurrency = limits.get("CONCURRENCY")
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        problems.append(f"has a CONCURRENCY that is not a whole number above 0: {concurrency!r}")
        concurrency = None
    if limits.get("RATE") is not None and parse_rate(limits["RATE"]) is None:
        problems.append(
            f"has a RATE that is not 'N/s', 'N/m' or 'N/h' with N a whole number above 0: {limits['RATE']!r}"
        )
    slow_start = limits.get("SLOW_START", False)
    if not isinstance(slow_start, bool) and (not isinstance(slow_start, int) or slow_start < 1):
        problems.append(
            f"has a SLOW_START that is not True, False or the number of sessions to start at: {slow_start!r}"
        )
    elif slow_start is not False and "CONCURRENCY" not in limits:
        problems.append("has SLOW_START without CONCURRENCY: slow start grows its sessions up to CONCURRENCY")
    if "SUSPEND" in limits and _duration_seconds(limits["SUSPEND"]) is None:
        problems.append(
            f"has a SUSPEND that is not a timedelta or a number of seconds above 0 and at most 10 years: {limits['SUSPEND']!r}"
        )
    return problems


def _limits_from(raw: Mapping[str, Any]) -> Limits:
    concurrency = raw.get("CONCURRENCY")
    slow_start = raw.get("SLOW_START", False)
    if slow_start is True:
        slow_start = SLOW_START_INITIAL
    return Limits(
        concurrency=concurrency,
        rate=parse_rate(raw.get("RATE")),
        slow_start=None if slow_start is False or concurrency is None else min(slow_start, concurrency),
        suspend=_as_timedelta(raw["SUSPEND"]) if "SUSPEND" in raw else Limits().suspend,
    )


def _shaping_from(raw: Mapping[str, Any]) -> dict[str, Limits]:
    return {pattern: _limits_from(limits) for key, limits in raw.items() if (pattern := shaping_pattern(key))}


def _check_dkim(check: _Validator, raw: Mapping[str, Any]) -> None:
    """Check the shape of ``DKIM`` and ``DKIM_UNSIGNED_ON_ERROR``; the keys themselves
    are read by the system check ``bumail_queue.E024``, as reading one may call code."""
    if not isinstance(raw.get("DKIM_UNSIGNED_ON_ERROR", False), bool):
        check.add(
            "bumail_queue.E023",
            "DKIM_UNSIGNED_ON_ERROR",
            f"BUMAIL_QUEUE['DKIM_UNSIGNED_ON_ERROR'] must be True or False; got {raw['DKIM_UNSIGNED_ON_ERROR']!r}.",
        )
    signers = raw.get("DKIM", DEFAULTS["DKIM"])
    if not isinstance(signers, list | tuple):
        check.add("bumail_queue.E023", "DKIM", f"BUMAIL_QUEUE['DKIM'] must be a list of signers; got {signers!r}.")
        return
    for index, signer in enumerate(signers):
        for problem in _dkim_signer_problems(signer):
            check.add("bumail_queue.E023", "DKIM", f"BUMAIL_QUEUE['DKIM'][{index}] {problem}.")


def _dkim_signer_problems(signer: Any) -> list[str]:
    if not isinstance(signer, Mapping):
        return [f"must be a dict with DOMAIN, SELECTOR, KEY and ALGORITHM; got {type(signer).__name__}"]
    problems = [f"has the unknown key {key!r}" for key in sorted(set(signer) - _DKIM_KEYS, key=repr)]
    problems += [f"needs {key!r}" for key in ("DOMAIN", "SELECTOR", "KEY") if key not in signer]
    domain, selector = signer.get("DOMAIN"), signer.get("SELECTOR")
    if "DOMAIN" in signer and not (isinstance(domain, str) and _is_dkim_domain(domain)):
        problems.append(f"has a DOMAIN that is not a domain name such as 'example.com': {domain!r}")
    if "SELECTOR" in signer and not (
        isinstance(selector, str) and not selector.endswith(".") and _HOSTNAME.fullmatch(selector)
    ):
        problems.append(f"has a SELECTOR that is not one or more DNS labels such as 's2026': {selector!r}")
    if "KEY" in signer and not (isinstance(signer["KEY"], str) and signer["KEY"].strip()):
        # Never the value: it may be the private key itself.
        problems.append("has a KEY that is not a PEM, a path to a PEM file or the dotted path of a callable")
    if signer.get("ALGORITHM", "rsa-sha256") not in DKIM_ALGORITHMS:
        problems.append(
            f"has the ALGORITHM {signer.get('ALGORITHM')!r}; it must be one of {', '.join(DKIM_ALGORITHMS)}"
        )
    return problems


def _check_mta_sts(check: _Validator, raw: Mapping[str, Any]) -> None:
    """Check ``MTA_STS``, ``MTA_STS_HTTPS_PORT`` and ``TLS_CA_FILE``: a flag, a port, a
    file of PEM certificates this process can read."""
    if not isinstance(raw.get("MTA_STS", DEFAULTS["MTA_STS"]), bool):
        check.add(
            "bumail_queue.E027", "MTA_STS", f"BUMAIL_QUEUE['MTA_STS'] must be True or False; got {raw['MTA_STS']!r}."
        )
    check.port(raw, "MTA_STS_HTTPS_PORT", "bumail_queue.E027")
    ca_file = raw.get("TLS_CA_FILE")
    if ca_file is None:
        return
    problem = _ca_file_problem(ca_file)
    if problem is not None:
        check.add(
            "bumail_queue.E027",
            "TLS_CA_FILE",
            f"BUMAIL_QUEUE['TLS_CA_FILE'] must be None (the system's trust store) or the path of a file of PEM "
            f"CA certificates; {ca_file!r} {problem}.",
        )


def _ca_file_problem(ca_file: Any) -> str | None:
    """Say why ``ca_file`` is no readable file of CA certificates, or return ``None``."""
    if not isinstance(ca_file, str | os.PathLike) or not os.fspath(ca_file):
        return "is not a path"
    path = os.fspath(ca_file)
    if not os.path.isfile(path):
        return "is not a file"
    if not os.access(path, os.R_OK):
        return "cannot be read by this process"
    try:
        ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError, ValueError) as error:
        return f"holds no certificate Python's ssl module can load ({error})"
    return None


def _is_dkim_domain(domain: str) -> bool:
    name = normalise_domain(domain)
    return bool(_HOSTNAME.fullmatch(name)) and "." in name.strip(".") and not _is_ip(name)


def _dkim_from(raw: Mapping[str, Any]) -> DKIMSigner:
    return DKIMSigner(
        domain=normalise_domain(raw["DOMAIN"]),
        selector=raw["SELECTOR"].lower(),
        key=raw["KEY"],
        algorithm=raw.get("ALGORITHM", "rsa-sha256"),
    )


def _route_from(raw: Mapping[str, Any]) -> Route:
    if raw["TYPE"] == "mx":
        return Route(type="mx", tls_required=raw.get("TLS_REQUIRED", False))
    tls = raw.get("TLS", "starttls")
    return Route(
        type="smarthost",
        host=raw["HOST"],
        port=raw.get("PORT", 465 if tls == "implicit" else 587),
        username=raw.get("USERNAME"),
        password=raw.get("PASSWORD"),
        tls=tls,
        tls_verify=raw.get("TLS_VERIFY", True),
        tls_required=tls != "none",
    )


def _as_timedelta(value: timedelta | float) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def load(raw: Any) -> QueueSettings:
    """Validate a raw ``BUMAIL_QUEUE`` and return it typed; raise on any problem."""
    problems = validate(raw)
    if problems:
        lines = "\n".join(f"- {p.message} ({p.id})" for p in problems)
        raise QueueConfigurationError(f"BUMAIL_QUEUE is not valid:\n{lines}")
    values = {**DEFAULTS, **raw}
    nameservers = values["DNS_NAMESERVERS"]
    return QueueSettings(
        store=values["STORE"],
        database=values["DATABASE"],
        redis_connection=values["REDIS_CONNECTION"],
        redis_key_prefix=values["REDIS_KEY_PREFIX"],
        hostname=effective_hostname(values),
        route=_route_from(values["ROUTE"]),
        routes={normalise_domain(domain): _route_from(route) for domain, route in values["ROUTES"].items()},
        mx_port=values["MX_PORT"],
        dns_nameservers=None if nameservers is None else tuple(filter(None, map(_parse_nameserver, nameservers))),
        concurrency=values["CONCURRENCY"],
        domain_concurrency=values["DOMAIN_CONCURRENCY"],
        lease_seconds=values["LEASE_SECONDS"],
        max_age=_as_timedelta(values["MAX_AGE"]),
        delay_warning=_as_timedelta(values["DELAY_WARNING"]),
        dsn_priority=values["DSN_PRIORITY"],
        max_items=values["MAX_ITEMS"],
        max_message_size=values["MAX_MESSAGE_SIZE"],
        max_recipients=values["MAX_RECIPIENTS"],
        allowed_private_networks=tuple(filter(None, map(_parse_network, values["ALLOWED_PRIVATE_NETWORKS"]))),
        mx_address_limit=values["MX_ADDRESS_LIMIT"],
        mx_session_limit=values["MX_SESSION_LIMIT"],
        unreachable_host_memory=_as_timedelta(values["UNREACHABLE_HOST_MEMORY"]),
        dkim=tuple(map(_dkim_from, values["DKIM"])),
        dkim_unsigned_on_error=values["DKIM_UNSIGNED_ON_ERROR"],
        mta_sts=values["MTA_STS"],
        mta_sts_https_port=values["MTA_STS_HTTPS_PORT"],
        tls_ca_file=None if values["TLS_CA_FILE"] is None else os.fspath(values["TLS_CA_FILE"]),
        retry_min_delay=_as_timedelta(values["RETRY_MIN_DELAY"]),
        retry_max_delay=_as_timedelta(values["RETRY_MAX_DELAY"]),
        retry_factor=float(values["RETRY_FACTOR"]),
        retry_jitter=float(values["RETRY_JITTER"]),
        timeouts=Timeouts(**{step.lower(): float(s) for step, s in {**DEFAULT_TIMEOUTS, **values["TIMEOUTS"]}.items()}),
        connection_reuse_seconds=float(values["CONNECTION_REUSE_SECONDS"]),
        claim_batch_size=values["CLAIM_BATCH_SIZE"],
        poll_seconds=float(values["POLL_SECONDS"]),
        delivery_log=values["DELIVERY_LOG"],
        delivery_log_retention=None
        if values["DELIVERY_LOG_RETENTION"] is None
        else _as_timedelta(values["DELIVERY_LOG_RETENTION"]),
        tasks=_tasks_from(values["TASKS"]),
        metrics_domains=frozenset(map(normalise_domain, values["METRICS_DOMAINS"])),
        metrics_token=values["METRICS_TOKEN"],
        suppression=values["SUPPRESSION"],
        suppression_duration=_as_timedelta(values["SUPPRESSION_DURATION"]),
        suppression_expiry_window=None
        if values["SUPPRESSION_EXPIRY_WINDOW"] is None
        else _as_timedelta(values["SUPPRESSION_EXPIRY_WINDOW"]),
        suppression_dsn=values["SUPPRESSION_DSN"],
        shaping=_shaping_from(values["SHAPING"]),
    )


@functools.cache
def get_settings() -> QueueSettings:
    """Return the project's validated ``BUMAIL_QUEUE``, read once and cached."""
    return load(getattr(django_settings, SETTING_NAME, {}))


RELOADED_BY: Final = frozenset({SETTING_NAME, "DATABASES", "CACHES"})
"""The Django settings whose change makes the queue read its settings, and build its
store, anew (the store's own receiver is connected in ``apps.py``)."""


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    # override_settings would otherwise leave the cached values in place (the
    # limitation DRF's APISettings documents).
    if setting in RELOADED_BY:
        get_settings.cache_clear()
