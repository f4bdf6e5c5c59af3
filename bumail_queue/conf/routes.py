"""``ROUTE`` and ``ROUTES``: where mail goes, checked and made into ``Route`` values."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from bumail_queue.sts import STSMode

from .defaults import DEFAULTS
from .names import HOSTNAME, is_ip, normalise_domain
from .validator import Validator

ROUTE_TYPES: Final = ("mx", "smarthost")
TLS_MODES: Final = ("starttls", "implicit", "none")
_ROUTE_KEYS: Final = {
    "mx": {"TYPE", "TLS_REQUIRED"},
    "smarthost": {"TYPE", "HOST", "PORT", "USERNAME", "PASSWORD", "TLS", "TLS_VERIFY"},
}


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


def check_routes(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check ``ROUTE`` and each route of ``ROUTES``, keyed by recipient domain."""
    check_route(check, raw.get("ROUTE", DEFAULTS["ROUTE"]), "BUMAIL_QUEUE['ROUTE']")
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


def route_from(raw: Mapping[str, Any]) -> Route:
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
