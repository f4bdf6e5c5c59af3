"""``ROUTE``, ``ROUTES`` and ``CHANNEL_ROUTES``: where mail goes, checked and made into
``Route`` values."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Final

from bumail_queue.items import CHANNEL_PATTERN
from bumail_queue.sts import STSMode

from .defaults import DEFAULTS
from .names import HOSTNAME, is_ip, normalise_domain
from .validator import Validator

ROUTE_TYPES: Final = ("mx", "smarthost", "backend")
TLS_MODES: Final = ("starttls", "implicit", "none")
_ROUTE_KEYS: Final = {
    "mx": {"TYPE", "TLS_REQUIRED"},
    "smarthost": {"TYPE", "HOST", "PORT", "USERNAME", "PASSWORD", "TLS", "TLS_VERIFY"},
    "backend": {"TYPE", "BACKEND", "OPTIONS", "NAME"},
}
_DOTTED_PATH: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    """Where mail for a domain goes: its MX hosts, a smarthost, or a Django email backend.

    ``mta_sts`` is never set from the settings: the worker sets it on an MX route when
    the recipient domain's MTA-STS policy applies (RFC 8461). ``enforce`` requires
    STARTTLS and a certificate valid for the MX host's name; ``testing`` checks the
    same, reports what failed, and goes on as without a policy.

    A ``backend`` route names the dotted path of a Django email backend and the
    ``options`` it is made with (``get_connection(backend, **options)``): they often
    hold an API key, so they are never in its ``repr``, and take no part in its
    equality. Its ``name`` (``NAME``, else the backend's path) tells two routes of one
    backend apart, and is what ``SHAPING``, ``DOMAIN_CONCURRENCY`` and messages call it.
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
    backend: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False, hash=False)
    name: str | None = None


def check_route(check: Validator, value: Any, where: str) -> None:
    if not isinstance(value, Mapping):
        check.add("bumail_queue.E007", where, f"{where} must be a dict with a 'TYPE'; got {type(value).__name__}.")
        return
    route_type = value.get("TYPE")
    if route_type not in ROUTE_TYPES:
        check.add(
            "bumail_queue.E007",
            where,
            f"{where}['TYPE'] must be one of {', '.join(map(repr, ROUTE_TYPES))}; got {route_type!r}.",
        )
        return
    unknown = sorted(set(value) - _ROUTE_KEYS[route_type])
    if unknown:
        check.add(
            "bumail_queue.E007",
            where,
            f"{where} has keys a {route_type!r} route does not take: {', '.join(unknown)} (allowed: {', '.join(sorted(_ROUTE_KEYS[route_type]))}).",
        )
    if route_type == "smarthost":
        _check_smarthost(check, value, where)
    elif route_type == "backend":
        _check_backend(check, value, where)
    for flag in ("TLS_REQUIRED", "TLS_VERIFY"):
        if flag in value and not isinstance(value[flag], bool):
            check.add("bumail_queue.E007", where, f"{where}['{flag}'] must be True or False.")


def _check_smarthost(check: Validator, value: Mapping[str, Any], where: str) -> None:
    host = value.get("HOST")
    if "HOST" not in value:
        check.add(
            "bumail_queue.E007",
            where,
            f"{where} needs a 'HOST': a smarthost route sends all its mail to that host name or IP address.",
        )
    elif not isinstance(host, str) or not host or not (HOSTNAME.fullmatch(host) or is_ip(host)):
        check.add("bumail_queue.E007", where, f"{where}['HOST'] must be a host name or IP address; got {host!r}.")
    port = value.get("PORT", 587)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        check.add("bumail_queue.E007", where, f"{where}['PORT'] must be a port number from 1 to 65535; got {port!r}.")
    tls = value.get("TLS", "starttls")
    if tls not in TLS_MODES:
        check.add(
            "bumail_queue.E007",
            where,
            f"{where}['TLS'] must be one of {', '.join(map(repr, TLS_MODES))}; got {tls!r}.",
        )
    username, password = value.get("USERNAME"), value.get("PASSWORD")
    if username is not None and not isinstance(username, str):
        check.add("bumail_queue.E007", where, f"{where}['USERNAME'] must be a string.")
    if password is not None and not isinstance(password, str):
        # Never echo the value: it is a secret even when it has the wrong type.
        check.add("bumail_queue.E007", where, f"{where}['PASSWORD'] must be a string.")
    if (username is None) != (password is None):
        check.add("bumail_queue.E007", where, f"{where} needs both 'USERNAME' and 'PASSWORD' for AUTH, or neither.")


def _check_backend(check: Validator, value: Mapping[str, Any], where: str) -> None:
    backend = value.get("BACKEND")
    if not isinstance(backend, str) or not _DOTTED_PATH.fullmatch(backend):
        shown = repr(backend) if isinstance(backend, str) and len(backend) <= 200 else type(backend).__name__
        check.add(
            "bumail_queue.E007",
            where,
            f"{where}['BACKEND'] must be the dotted path of a Django email backend, such as "
            f"'anymail.backends.postmark.EmailBackend'; got {shown}.",
        )
    name = value.get("NAME")
    if name is not None and (not isinstance(name, str) or not CHANNEL_PATTERN.fullmatch(name)):
        check.add(
            "bumail_queue.E007",
            where,
            f"{where}['NAME'] must be a name of ASCII letters, digits, '.', '_', ':' and '-', such as 'postmark'.",
        )
    options = value.get("OPTIONS", {})
    # Never echo the options: they hold API keys.
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        check.add(
            "bumail_queue.E007",
            where,
            f"{where}['OPTIONS'] must be a dict of the keyword arguments the backend is made with.",
        )


def check_routes(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check ``ROUTE``, each route of ``ROUTES``, keyed by recipient domain, and of
    ``CHANNEL_ROUTES``, keyed by channel; two backend routes that differ never share a name."""
    check_route(check, raw.get("ROUTE", DEFAULTS["ROUTE"]), "BUMAIL_QUEUE['ROUTE']")
    _check_channel_routes(check, raw)
    _check_backend_names(check, raw)
    routes = raw.get("ROUTES", DEFAULTS["ROUTES"])
    if not isinstance(routes, Mapping):
        check.add("bumail_queue.E007", "ROUTES", "BUMAIL_QUEUE['ROUTES'] must be a dict of recipient domain to route.")
    else:
        for domain, route in routes.items():
            if not isinstance(domain, str) or not HOSTNAME.fullmatch(normalise_domain(domain)):
                check.add(
                    "bumail_queue.E007", "ROUTES", f"BUMAIL_QUEUE['ROUTES'] has a key that is not a domain: {domain!r}."
                )
            check_route(check, route, f"BUMAIL_QUEUE['ROUTES'][{domain!r}]")


def _check_channel_routes(check: Validator, raw: Mapping[str, Any]) -> None:
    channel_routes = raw.get("CHANNEL_ROUTES", DEFAULTS["CHANNEL_ROUTES"])
    if not isinstance(channel_routes, Mapping):
        check.add(
            "bumail_queue.E007", "CHANNEL_ROUTES", "BUMAIL_QUEUE['CHANNEL_ROUTES'] must be a dict of channel to route."
        )
        return
    for channel, route in channel_routes.items():
        if not isinstance(channel, str) or not CHANNEL_PATTERN.fullmatch(channel):
            check.add(
                "bumail_queue.E007",
                "CHANNEL_ROUTES",
                f"BUMAIL_QUEUE['CHANNEL_ROUTES'] has a key that is not a channel name: {channel!r}.",
            )
        check_route(check, route, f"BUMAIL_QUEUE['CHANNEL_ROUTES'][{channel!r}]")


def _check_backend_names(check: Validator, raw: Mapping[str, Any]) -> None:
    """Two backend routes that differ (another backend, other options) need names of
    their own: the worker tells routes apart by name, and counts limits by it."""
    found: dict[str, tuple[str, Mapping[str, Any]]] = {}
    places = [("BUMAIL_QUEUE['ROUTE']", raw.get("ROUTE"))]
    for key in ("ROUTES", "CHANNEL_ROUTES"):
        table = raw.get(key)
        if isinstance(table, Mapping):
            places += [(f"BUMAIL_QUEUE[{key!r}][{name!r}]", route) for name, route in table.items()]
    for where, route in places:
        if (
            not isinstance(route, Mapping)
            or route.get("TYPE") != "backend"
            or not isinstance(route.get("BACKEND"), str)
        ):
            continue
        name = route.get("NAME", route["BACKEND"])
        if not isinstance(name, str):
            continue
        first = found.setdefault(name, (where, route))
        if first[1] != route:
            check.add(
                "bumail_queue.E007",
                where,
                f"{where} is a backend route named {name!r}, as {first[0]} is, and they differ: give each its own 'NAME'.",
            )


def route_from(raw: Mapping[str, Any]) -> Route:
    if raw["TYPE"] == "mx":
        return Route(type="mx", tls_required=raw.get("TLS_REQUIRED", False))
    if raw["TYPE"] == "backend":
        backend = raw["BACKEND"]
        return Route(
            type="backend", backend=backend, options=dict(raw.get("OPTIONS", {})), name=raw.get("NAME", backend)
        )
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
