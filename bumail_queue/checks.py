"""System checks: ``manage.py check`` reports what ``BUMAIL_QUEUE`` start-up would refuse."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings as django_settings
from django.core import checks

from .conf import SETTING_NAME, QueueSettings, Route, effective_hostname, get_settings, not_fqdn_reason, validate
from .errors import QueueError

BACKEND_PATH = "bumail_queue.backends.QueueEmailBackend"


@checks.register("bumail_queue")
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every problem of ``BUMAIL_QUEUE`` as an error with its id."""
    return [
        checks.Error(problem.message, obj=SETTING_NAME, id=problem.id)
        for problem in validate(getattr(django_settings, SETTING_NAME, {}))
    ]


@checks.register("bumail_queue")
def check_store(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report what the configured store finds wrong with its own set-up."""
    if validate(getattr(django_settings, SETTING_NAME, {})):
        return []  # check_settings reports those
    from .stores import store_from_settings

    try:
        store = store_from_settings(get_settings())
    except QueueError as error:
        return [checks.Error(error.message, obj=SETTING_NAME, id="bumail_queue.E003")]
    return list(store.check(**kwargs))


def _smarthosts_logging_in() -> dict[str, dict[str, Any]]:
    """The smarthost routes of a valid ``BUMAIL_QUEUE`` that send credentials, by where
    each is set (``ROUTE`` or ``ROUTES['domain']``); none when the setting is invalid
    (``check_settings`` reports that)."""
    raw = getattr(django_settings, SETTING_NAME, {})
    if validate(raw):
        return {}
    routes = {"ROUTE": raw.get("ROUTE", {}), **{f"ROUTES[{d!r}]": r for d, r in raw.get("ROUTES", {}).items()}}
    return {
        where: route for where, route in routes.items() if route.get("TYPE") == "smarthost" and route.get("USERNAME")
    }


@checks.register("bumail_queue")
def check_plaintext_auth(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn about a smarthost that would send its password without TLS."""
    return [
        checks.Warning(
            f"BUMAIL_QUEUE['{where}'] sends USERNAME and PASSWORD to its smarthost without TLS.",
            hint="Set 'TLS' to 'starttls' or 'implicit', or drop the credentials.",
            obj=SETTING_NAME,
            id="bumail_queue.W001",
        )
        for where, route in _smarthosts_logging_in().items()
        if route.get("TLS") == "none"
    ]


@checks.register("bumail_queue")
def check_unverified_auth(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn about a smarthost that would log in to a server whose certificate is not verified."""
    return [
        checks.Warning(
            f"BUMAIL_QUEUE['{where}'] sends USERNAME and PASSWORD to a smarthost whose certificate it does not "
            "verify (TLS_VERIFY is False): anyone on the path can pose as the server and take them.",
            hint="Remove 'TLS_VERIFY': False, so that the certificate is verified against the system's "
            "trusted certificates (add a private CA there), or drop the credentials.",
            obj=SETTING_NAME,
            id="bumail_queue.W002",
        )
        for where, route in _smarthosts_logging_in().items()
        # TLS "none" with credentials is W001's: no TLS at all, let alone a verified one.
        if route.get("TLS", "starttls") != "none" and route.get("TLS_VERIFY") is False
    ]


@checks.register("bumail_queue")
def check_hostname_is_fqdn(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn when the EHLO name (``HOSTNAME``, or ``socket.getfqdn()``) is no fully qualified domain name."""
    raw = getattr(django_settings, SETTING_NAME, {})
    if validate(raw):
        return []  # check_settings reports those
    hostname = effective_hostname(raw)
    reason = not_fqdn_reason(hostname)
    if reason is None:
        return []
    where = (
        "BUMAIL_QUEUE['HOSTNAME']"
        if raw.get("HOSTNAME")
        else "socket.getfqdn(), the default of BUMAIL_QUEUE['HOSTNAME'],"
    )
    return [
        checks.Warning(
            f"{where} is {hostname!r}: {reason}. The worker greets servers with it (EHLO) and names "
            "itself by it in delivery status notifications; receiving servers reject or score mail from such a name.",
            hint="Set BUMAIL_QUEUE['HOSTNAME'] to this machine's public name, one whose A or AAAA record "
            "and reverse DNS match the address mail leaves from, such as 'mail.example.com'.",
            obj=SETTING_NAME,
            id="bumail_queue.W004",
        )
    ]


@checks.register("bumail_queue")
def check_dkim_keys(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Read every ``DKIM`` key as the worker will: one that cannot sign is an error, a
    short RSA key a warning."""
    if validate(getattr(django_settings, SETTING_NAME, {})):
        return []  # check_settings reports those
    signers = get_settings().dkim
    if not signers:
        return []
    # Imported here: a project that signs nothing never loads the DKIM code and its
    # cryptography at start-up (every command runs this check).
    from .delivery.dkim import ADVISED_RSA_BITS, DKIMError, describe, load_key

    found: list[checks.CheckMessage] = []
    for signer in signers:
        try:
            key = load_key(signer)
        except DKIMError as error:
            found.append(
                checks.Error(
                    f"BUMAIL_QUEUE['DKIM'] cannot sign: {error}.",
                    hint="Give KEY as an unencrypted PEM private key of the ALGORITHM's type (RSA of 2,048 bits "
                    "or more, or Ed25519), a path to one, or the dotted path of a callable that returns one. "
                    "Until then the mail of that domain waits, deferred (see DKIM_UNSIGNED_ON_ERROR).",
                    obj=SETTING_NAME,
                    id="bumail_queue.E024",
                )
            )
            continue
        if signer.algorithm == "rsa-sha256" and key.bits < ADVISED_RSA_BITS:
            found.append(
                checks.Warning(
                    f"BUMAIL_QUEUE['DKIM'] signs {describe(signer)} with an RSA key of {key.bits} bits; "
                    f"receivers ask for {ADVISED_RSA_BITS} or more, and some score shorter keys as spam.",
                    hint="Make a key of 2,048 bits (openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048), "
                    "publish it under a new selector, then switch to it.",
                    obj=SETTING_NAME,
                    id="bumail_queue.W005",
                )
            )
    return found


@checks.register("bumail_queue")
def check_development_mail_goes_out(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Warn when ``DEBUG`` is on and a route delivers straight to recipients' MX hosts:
    a development machine running the worker would mail the real internet."""
    if not django_settings.DEBUG or validate(getattr(django_settings, SETTING_NAME, {})):
        return []
    settings = get_settings()
    direct = ["BUMAIL_QUEUE['ROUTE']"] if settings.route.type == "mx" else []
    direct += [f"BUMAIL_QUEUE['ROUTES'][{domain!r}]" for domain, route in settings.routes.items() if route.type == "mx"]
    if not direct:
        return []
    return [
        checks.Warning(
            f"DEBUG is True and {', '.join(direct)} delivers straight to the recipients' MX hosts: "
            "a queue_worker on this machine sends real mail to real people.",
            hint="For development, send everything to a local SMTP sink instead: BUMAIL_QUEUE = {'ROUTE': "
            "{'TYPE': 'smarthost', 'HOST': '127.0.0.1', 'PORT': 1025, 'TLS': 'none'}} with "
            "'python -m aiosmtpd -n -l 127.0.0.1:1025' running (docs/installation.md, 'Local development'). "
            "If this machine is meant to send, add 'bumail_queue.W006' to SILENCED_SYSTEM_CHECKS.",
            obj=SETTING_NAME,
            id="bumail_queue.W006",
        )
    ]


@checks.register("bumail_queue")
def check_firewall_in_debug(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn when ``DEBUG`` is on and no staging firewall (``ALLOW_RECIPIENTS``) stops
    mail to recipients outside the team: a copy of production's data mails its people.
    Mail that every route sends to an SMTP sink on this machine reaches no one."""
    if not django_settings.DEBUG or validate(getattr(django_settings, SETTING_NAME, {})):
        return []
    settings = get_settings()
    routes = [settings.route, *settings.routes.values(), *settings.channel_routes.values()]
    if settings.firewall is not None or all(map(_local_sink, routes)):
        return []
    return [
        checks.Warning(
            "DEBUG is on and mail goes to every recipient: no staging firewall (ALLOW_RECIPIENTS) holds "
            "mail to addresses outside your team.",
            hint="Set BUMAIL_QUEUE['ALLOW_RECIPIENTS'] to the domains and addresses that may get mail, such as "
            "['example.com', 'qa+*@example.net'] (and REDIRECT_TO to send the rest to one mailbox); "
            "docs/operations.md, 'Staging firewall'. If this machine is meant to mail everyone, "
            "add 'bumail_queue.W009' to SILENCED_SYSTEM_CHECKS.",
            obj=SETTING_NAME,
            id="bumail_queue.W009",
        )
    ]


def _local_sink(route: Route) -> bool:
    """Return whether ``route`` (and its fallbacks) delivers to a smarthost on this machine."""
    if route.type != "smarthost" or route.host is None:
        return False
    try:
        loopback = route.host == "localhost" or ipaddress.ip_address(route.host).is_loopback
    except ValueError:
        return False
    return loopback and (route.fallback is None or _local_sink(route.fallback))


@checks.register("bumail_queue")
def check_metrics_installed(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn when a metrics setting is given but prometheus-client, which serves them, is not installed."""
    raw = getattr(django_settings, SETTING_NAME, {})
    given = [key for key in ("METRICS_DOMAINS", "METRICS_TOKEN") if isinstance(raw, dict) and raw.get(key)]
    if not given:
        return []
    from .metrics import PROMETHEUS_MISSING, prometheus_installed

    if prometheus_installed():
        return []
    return [
        checks.Warning(
            f"BUMAIL_QUEUE sets {' and '.join(given)}, but no metrics can be served: {PROMETHEUS_MISSING}",
            hint="Install the extra, or remove the setting.",
            obj=SETTING_NAME,
            id="bumail_queue.W007",
        )
    ]


def check_shaping(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report ``SHAPING`` on a store that keeps no buckets (E029), and warn about a
    pattern no session can match because its mail goes through a smarthost (W008)."""
    if validate(getattr(django_settings, SETTING_NAME, {})):
        return []
    settings = get_settings()
    if not settings.shaping:
        return []
    from .stores import store_from_settings

    try:
        store = store_from_settings(settings)
    except QueueError:
        return []  # check_store reports it
    found: list[checks.CheckMessage] = []
    if not store.supports_shaping:
        found.append(
            checks.Error(
                f"BUMAIL_QUEUE['SHAPING'] is set, but the store {type(store).__name__} keeps no shaping state, "
                "so no limit could hold across workers.",
                hint="Use the 'orm' or 'redis' store, or give the store take_permit() and the other shaping methods "
                "(docs/shaping.md), and set supports_shaping.",
                obj=SETTING_NAME,
                id="bumail_queue.E029",
            )
        )
    for pattern in settings.shaping:
        problem = _never_shaped(settings, pattern)
        if problem:
            found.append(
                checks.Warning(
                    f"BUMAIL_QUEUE['SHAPING'][{pattern!r}] never applies: {problem}",
                    hint="Through a smarthost the session, and any 'slow down', is the smarthost's: "
                    "shape it by its HOST (docs/shaping.md, 'Which key a destination takes').",
                    obj=SETTING_NAME,
                    id="bumail_queue.W008",
                )
            )
    return found


def _never_shaped(settings: QueueSettings, pattern: str) -> str | None:
    """Say why ``pattern`` can match no session, or return ``None`` when some may."""
    smarthosts = {
        r.host.lower() for r in (settings.route, *settings.routes.values()) if r.type == "smarthost" and r.host
    }
    if pattern == "*" or pattern in smarthosts:
        return None
    if pattern.startswith("."):
        if settings.route.type == "mx" or any(r.type == "mx" for r in settings.routes.values()):
            return None
        if any(host.endswith(pattern) for host in smarthosts):
            return None
        return "every route is a smarthost, so no mail goes to MX hosts whose names it could end."
    route = settings.route_for(pattern)
    if route.type == "smarthost":
        return (
            f"mail to {pattern} goes through the smarthost {route.host}, whose host name is the key its sessions take."
        )
    return None
