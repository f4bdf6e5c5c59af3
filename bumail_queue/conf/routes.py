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
    "smarthost": {"TYPE", "HOST", "PORT", "USERNAME", "PASSWORD", "TLS", "TLS_VERIFY", "NAME", "FALLBACK"},
    "backend": {"TYPE", "BACKEND", "OPTIONS", "NAME", "FALLBACK"},
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
    # Where the mail goes when this route was not reached at all (FALLBACK).
    fallback: Route | None = None

    @property
    def label(self) -> str:
        """What the route is called: its ``NAME``, else its smarthost's ``HOST:PORT``."""
        if self.name is not None:
            return self.name
        return f"{self.host}:{self.port}" if self.type == "smarthost" else self.type


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
    if route_type != "mx":
        _check_name(check, value, where)
    fallback = value.get("FALLBACK")
    if isinstance(fallback, Mapping):
        if fallback.get("TYPE") not in ("smarthost", "backend") or "FALLBACK" in fallback:
            check.add(
                "bumail_queue.E007",
                where,
                f"{where}['FALLBACK'] must be a smarthost or backend route of no fallback of its own, or the NAME of one.",
            )
        else:
            check_route(check, fallback, f"{where}['FALLBACK']")
    elif fallback is not None and not isinstance(fallback, str):
        check.add("bumail_queue.E007", where, f"{where}['FALLBACK'] must be a route, or the NAME of one.")
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
    options = value.get("OPTIONS", {})
    # Never echo the options: they hold API keys.
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        check.add(
            "bumail_queue.E007",
            where,
            f"{where}['OPTIONS'] must be a dict of the keyword arguments the backend is made with.",
        )


def _check_name(check: Validator, value: Mapping[str, Any], where: str) -> None:
    name = value.get("NAME")
    if name is not None and (not isinstance(name, str) or not CHANNEL_PATTERN.fullmatch(name)):
        check.add(
            "bumail_queue.E007",
            where,
            f"{where}['NAME'] must be a name of ASCII letters, digits, '.', '_', ':' and '-', such as 'postmark'.",
        )


def check_routes(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check ``ROUTE``, each route of ``ROUTES``, keyed by recipient domain, and of
    ``CHANNEL_ROUTES``, keyed by channel; two backend routes that differ never share a name."""
    check_route(check, raw.get("ROUTE", DEFAULTS["ROUTE"]), "BUMAIL_QUEUE['ROUTE']")
    _check_channel_routes(check, raw)
    _check_backend_names(check, raw)
    _check_fallback_names(check, raw)
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


def _places(raw: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Every route of the settings, with where it is set."""
    places = [("BUMAIL_QUEUE['ROUTE']", raw.get("ROUTE", DEFAULTS["ROUTE"]))]
    for key in ("ROUTES", "CHANNEL_ROUTES"):
        table = raw.get(key)
        if isinstance(table, Mapping):
            places += [(f"BUMAIL_QUEUE[{key!r}][{name!r}]", route) for name, route in table.items()]
    return places


def _label(route: Mapping[str, Any]) -> str | None:
    """What a route's raw setting calls it (``NAME``, a backend's path, ``HOST:PORT``)."""
    if "NAME" in route:
        return str(route["NAME"])
    if route.get("TYPE") == "backend":
        return str(route.get("BACKEND"))
    if route.get("TYPE") == "smarthost":
        tls = route.get("TLS", "starttls")
        return f"{route.get('HOST')}:{route.get('PORT', 465 if tls == 'implicit' else 587)}"
    return None


def _check_fallback_names(check: Validator, raw: Mapping[str, Any]) -> None:
    """A FALLBACK given by name names a smarthost or backend route set elsewhere, not itself."""
    places = [(where, route) for where, route in _places(raw) if isinstance(route, Mapping)]
    named = {_label(route): route for _, route in places if route.get("TYPE") in ("smarthost", "backend")}
    for where, route in places:
        fallback = route.get("FALLBACK")
        if not isinstance(fallback, str):
            continue
        target = named.get(fallback)
        if target is None or target is route:
            check.add(
                "bumail_queue.E007",
                where,
                f"{where}['FALLBACK'] names {fallback!r}, and no other smarthost or backend route of "
                "ROUTE, ROUTES or CHANNEL_ROUTES is so named.",
            )


def routes_from(raw: Mapping[str, Any]) -> tuple[Route, dict[str, Route], dict[str, Route]]:
    """``ROUTE``, ``ROUTES`` (by normal domain) and ``CHANNEL_ROUTES`` of valid settings,
    each FALLBACK given by name replaced by the route it names."""
    route = route_from(raw["ROUTE"])
    routes = {normalise_domain(domain): route_from(value) for domain, value in raw["ROUTES"].items()}
    channels = {channel: route_from(value) for channel, value in raw["CHANNEL_ROUTES"].items()}
    named = {r.label: r for r in (route, *routes.values(), *channels.values()) if r.type != "mx"}

    def resolved(given: Route, value: Mapping[str, Any]) -> Route:
        fallback = value.get("FALLBACK")
        if not isinstance(fallback, str):
            return given
        # The route named, as itself: one fallback per attempt, never a chain.
        return dataclasses.replace(given, fallback=dataclasses.replace(named[fallback], fallback=None))

    return (
        resolved(route, raw["ROUTE"]),
        {
            d: resolved(r, raw["ROUTES"][k])
            for (k, _), (d, r) in zip(raw["ROUTES"].items(), routes.items(), strict=True)
        },
        {c: resolved(r, raw["CHANNEL_ROUTES"][c]) for c, r in channels.items()},
    )


def route_from(raw: Mapping[str, Any]) -> Route:
    if raw["TYPE"] == "mx":
        return Route(type="mx", tls_required=raw.get("TLS_REQUIRED", False))
    if raw["TYPE"] == "backend":
        backend = raw["BACKEND"]
        return Route(
            type="backend",
            backend=backend,
            options=dict(raw.get("OPTIONS", {})),
            name=raw.get("NAME", backend),
            fallback=_inline_fallback(raw),
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
        name=raw.get("NAME"),
        fallback=_inline_fallback(raw),
    )


def _inline_fallback(raw: Mapping[str, Any]) -> Route | None:
    fallback = raw.get("FALLBACK")
    return route_from(fallback) if isinstance(fallback, Mapping) else None
