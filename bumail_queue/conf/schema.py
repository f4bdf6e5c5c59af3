"""``validate()``, the one validator of ``BUMAIL_QUEUE``, and ``load()``, which returns it typed."""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings as django_settings

from bumail_queue import verp
from bumail_queue.addresses import ascii_lower, mailbox_problem, normal_address
from bumail_queue.errors import QueueConfigurationError, QueueError
from bumail_queue.items import check_priority

from .archive import archive_from, check_archive, redact_after_from
from .defaults import BUILTIN_STORES, DEFAULT_TIMEOUTS, DEFAULTS, MAX_TIMEOUT_SECONDS
from .dkim import check_dkim, dkim_from
from .firewall import allow_recipients_from, check_firewall
from .mailboxes import check_mailboxes, mailboxes_from
from .monitoring import check_metrics, check_suppression
from .mta_sts import check_mta_sts
from .names import HOSTNAME, effective_hostname, normalise_domain, parse_nameserver, parse_network
from .routes import check_routes, routes_from
from .shaping import check_shaping, shaping_from
from .tasks import task_problems, tasks_from
from .unsubscribe import check_unsubscribe, unsubscribe_from
from .validator import Problem, Validator, as_timedelta
from .values import QueueSettings, Timeouts

_REDIS_PREFIX = re.compile(r"[a-z][a-z0-9_:.\-]{0,39}")


def validate(raw: Any) -> list[Problem]:
    """Return every problem of a raw ``BUMAIL_QUEUE`` value; empty when it is valid.

    Each area adds what it finds, always in this order, so a report reads the same each time.
    """
    check = Validator()
    if not isinstance(raw, Mapping):
        check.add("bumail_queue.E001", "", f"BUMAIL_QUEUE must be a dict; got {type(raw).__name__}.")
        return check.problems
    _check_keys(check, raw)
    _check_store(check, raw)
    check_routes(check, raw)
    _check_destinations(check, raw)
    check_dkim(check, raw)
    check_mta_sts(check, raw)
    _check_retries(check, raw)
    _check_sessions(check, raw)
    _check_reports(check, raw)
    _check_return_path(check, raw)
    check_mailboxes(check, raw)
    for problem in task_problems(raw.get("TASKS")):
        check.add("bumail_queue.E025", "TASKS", f"BUMAIL_QUEUE['TASKS'] {problem}.")
    check_metrics(check, raw)
    check_suppression(check, raw)
    check_unsubscribe(check, raw)
    check_firewall(check, raw)
    check_archive(check, raw)
    check_shaping(check, raw.get("SHAPING", DEFAULTS["SHAPING"]))
    return check.problems


def _check_keys(check: Validator, raw: Mapping[str, Any]) -> None:
    """A key ``BUMAIL_QUEUE`` does not have is a typo until shown otherwise."""
    for key in sorted(set(raw) - set(DEFAULTS), key=repr):
        near = difflib.get_close_matches(str(key), DEFAULTS, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else f" Known keys: {', '.join(DEFAULTS)}."
        check.add("bumail_queue.E002", str(key), f"BUMAIL_QUEUE has an unknown key {key!r}.{hint}")


def _check_store(check: Validator, raw: Mapping[str, Any]) -> None:
    """``STORE``, ``DATABASE``, the Redis keys and ``HOSTNAME``."""
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
    if hostname is not None and (not isinstance(hostname, str) or not HOSTNAME.fullmatch(hostname)):
        check.add(
            "bumail_queue.E006",
            "HOSTNAME",
            f"BUMAIL_QUEUE['HOSTNAME'] must be a host name (letters, digits, hyphens and dots), or None for socket.getfqdn(); got {hostname!r}.",
        )


def _check_destinations(check: Validator, raw: Mapping[str, Any]) -> None:
    """How MX destinations are found and tried, and what mail is taken for them."""
    check.port(raw, "MX_PORT", "bumail_queue.E008")
    nameservers = raw.get("DNS_NAMESERVERS")
    if nameservers is not None and (
        isinstance(nameservers, str)
        or not isinstance(nameservers, list | tuple)
        or not nameservers
        or not all(isinstance(ns, str) and parse_nameserver(ns) for ns in nameservers)
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
        or not all(parse_network(n) for n in networks)
    ):
        check.add(
            "bumail_queue.E021",
            "ALLOWED_PRIVATE_NETWORKS",
            f"BUMAIL_QUEUE['ALLOWED_PRIVATE_NETWORKS'] must be a list of CIDR strings such as '10.0.0.0/8' or 'fd00::/8'; got {networks!r}.",
        )
    for key in ("MX_ADDRESS_LIMIT", "MX_SESSION_LIMIT"):
        check.positive_int(raw, key, "bumail_queue.E021")
    check.duration(raw, "UNREACHABLE_HOST_MEMORY", "bumail_queue.E021", zero_is_off=True)


def _check_retries(check: Validator, raw: Mapping[str, Any]) -> None:
    """When a deferred recipient is tried again (RFC 5321 §4.5.4.1)."""
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


def _check_sessions(check: Validator, raw: Mapping[str, Any]) -> None:
    """How long each SMTP step may take, how long a connection is kept, how the worker claims."""
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
                or not 0 < seconds <= MAX_TIMEOUT_SECONDS
            ):
                check.add(
                    "bumail_queue.E016",
                    "TIMEOUTS",
                    f"BUMAIL_QUEUE['TIMEOUTS'][{step!r}] must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS}; got {seconds!r}.",
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


def _check_reports(check: Validator, raw: Mapping[str, Any]) -> None:
    """What the worker says of its outcomes: the DSNs' priority and the delivery log."""
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


def _check_return_path(check: Validator, raw: Mapping[str, Any]) -> None:
    """``RETURN_PATH``: an address with ``{token}`` once in its local part, short enough
    for RFC 5321 with the token in it; ``FEEDBACK_ADDRESSES``: a list of addresses."""
    addresses = raw.get("FEEDBACK_ADDRESSES", DEFAULTS["FEEDBACK_ADDRESSES"])
    if isinstance(addresses, str) or not isinstance(addresses, list | tuple | set | frozenset):
        check.add(
            "bumail_queue.E032",
            "FEEDBACK_ADDRESSES",
            f"BUMAIL_QUEUE['FEEDBACK_ADDRESSES'] must be a list of addresses such as ['fbl@example.com']; got {addresses!r}.",
        )
    else:
        bad = [a for a in addresses if not isinstance(a, str) or mailbox_problem(a)]
        if bad:
            check.add(
                "bumail_queue.E032",
                "FEEDBACK_ADDRESSES",
                f"BUMAIL_QUEUE['FEEDBACK_ADDRESSES'] must hold addresses; these are not: {', '.join(map(repr, bad))}.",
            )
    template = raw.get("RETURN_PATH")
    if template is None:
        return
    example = "'bounces+{token}@example.com'"
    if not isinstance(template, str) or template.count(verp.PLACEHOLDER) != 1:
        check.add(
            "bumail_queue.E032",
            "RETURN_PATH",
            f"BUMAIL_QUEUE['RETURN_PATH'] must be an address with {{token}} once in its local part, such as {example}; got {template!r}.",
        )
        return
    local, _, domain = template.rpartition("@")
    problem = mailbox_problem(template.replace(verp.PLACEHOLDER, "token"))
    if verp.PLACEHOLDER not in local or problem or not HOSTNAME.fullmatch(domain):
        check.add(
            "bumail_queue.E032",
            "RETURN_PATH",
            f"BUMAIL_QUEUE['RETURN_PATH'] must be an address with {{token}} in its local part, such as {example}; "
            f"{template!r} is not ({problem or 'the token must be before the @, the domain a host name'}).",
        )
    elif verp.local_part_length(template) > verp.LOCAL_PART_LIMIT:
        check.add(
            "bumail_queue.E032",
            "RETURN_PATH",
            f"BUMAIL_QUEUE['RETURN_PATH']'s local part would be {verp.local_part_length(template)} octets with its "
            f"token (43 characters); RFC 5321 allows {verp.LOCAL_PART_LIMIT}: shorten {local!r}.",
        )


def load(raw: Any) -> QueueSettings:
    """Validate a raw ``BUMAIL_QUEUE`` and return it typed; raise on any problem."""
    problems = validate(raw)
    if problems:
        lines = "\n".join(f"- {p.message} ({p.id})" for p in problems)
        raise QueueConfigurationError(f"BUMAIL_QUEUE is not valid:\n{lines}")
    values = {**DEFAULTS, **raw}
    nameservers = values["DNS_NAMESERVERS"]
    route, routes, channel_routes = routes_from(values)
    return QueueSettings(
        store=values["STORE"],
        database=values["DATABASE"],
        redis_connection=values["REDIS_CONNECTION"],
        redis_key_prefix=values["REDIS_KEY_PREFIX"],
        hostname=effective_hostname(values),
        route=route,
        routes=routes,
        channel_routes=channel_routes,
        mx_port=values["MX_PORT"],
        dns_nameservers=None if nameservers is None else tuple(filter(None, map(parse_nameserver, nameservers))),
        concurrency=values["CONCURRENCY"],
        domain_concurrency=values["DOMAIN_CONCURRENCY"],
        lease_seconds=values["LEASE_SECONDS"],
        max_age=as_timedelta(values["MAX_AGE"]),
        delay_warning=as_timedelta(values["DELAY_WARNING"]),
        dsn_priority=values["DSN_PRIORITY"],
        max_items=values["MAX_ITEMS"],
        max_message_size=values["MAX_MESSAGE_SIZE"],
        max_recipients=values["MAX_RECIPIENTS"],
        allowed_private_networks=tuple(filter(None, map(parse_network, values["ALLOWED_PRIVATE_NETWORKS"]))),
        mx_address_limit=values["MX_ADDRESS_LIMIT"],
        mx_session_limit=values["MX_SESSION_LIMIT"],
        unreachable_host_memory=as_timedelta(values["UNREACHABLE_HOST_MEMORY"]),
        dkim=tuple(map(dkim_from, values["DKIM"])),
        dkim_unsigned_on_error=values["DKIM_UNSIGNED_ON_ERROR"],
        mta_sts=values["MTA_STS"],
        mta_sts_https_port=values["MTA_STS_HTTPS_PORT"],
        tls_ca_file=None if values["TLS_CA_FILE"] is None else os.fspath(values["TLS_CA_FILE"]),
        retry_min_delay=as_timedelta(values["RETRY_MIN_DELAY"]),
        retry_max_delay=as_timedelta(values["RETRY_MAX_DELAY"]),
        retry_factor=float(values["RETRY_FACTOR"]),
        retry_jitter=float(values["RETRY_JITTER"]),
        timeouts=Timeouts(**{step.lower(): float(s) for step, s in {**DEFAULT_TIMEOUTS, **values["TIMEOUTS"]}.items()}),
        connection_reuse_seconds=float(values["CONNECTION_REUSE_SECONDS"]),
        claim_batch_size=values["CLAIM_BATCH_SIZE"],
        poll_seconds=float(values["POLL_SECONDS"]),
        delivery_log=values["DELIVERY_LOG"],
        delivery_log_retention=None
        if values["DELIVERY_LOG_RETENTION"] is None
        else as_timedelta(values["DELIVERY_LOG_RETENTION"]),
        tasks=tasks_from(values["TASKS"]),
        metrics_domains=frozenset(map(normalise_domain, values["METRICS_DOMAINS"])),
        metrics_token=values["METRICS_TOKEN"],
        suppression=values["SUPPRESSION"],
        suppression_duration=as_timedelta(values["SUPPRESSION_DURATION"]),
        suppression_expiry_window=None
        if values["SUPPRESSION_EXPIRY_WINDOW"] is None
        else as_timedelta(values["SUPPRESSION_EXPIRY_WINDOW"]),
        suppression_dsn=values["SUPPRESSION_DSN"],
        shaping=shaping_from(values["SHAPING"]),
        unsubscribe=unsubscribe_from(values["UNSUBSCRIBE"]),
        allow_recipients=allow_recipients_from(values["ALLOW_RECIPIENTS"]),
        redirect_to=values["REDIRECT_TO"],
        archive=archive_from(values["ARCHIVE"]),
        redact_after=redact_after_from(values["REDACT_AFTER"]),
        return_path=values["RETURN_PATH"],
        feedback_addresses=frozenset(ascii_lower(normal_address(a)) for a in values["FEEDBACK_ADDRESSES"]),
        inbound_mailboxes=mailboxes_from(values),
    )
