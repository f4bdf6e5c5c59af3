"""``BUMAIL_QUEUE``: its defaults, every problem the validator reports, and reloading."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from bumail_queue.conf import (
    DEFAULTS,
    QueueSettings,
    Route,
    get_settings,
    load,
    validate,
)
from bumail_queue.errors import ErrorCode, QueueConfigurationError
from bumail_queue.stores import get_store
from bumail_queue.stores.memory import MemoryStore
from bumail_queue.stores.orm import ORMStore

SECRET = "hunter2-secret-value"
SMARTHOST = {"TYPE": "smarthost", "HOST": "smtp.example.com"}


def ids(raw: object) -> list[str]:
    return [problem.id for problem in validate(raw)]


# -- defaults -------------------------------------------------------------------------


def test_load_of_an_empty_dict_gives_every_default(monkeypatch):
    monkeypatch.setattr("socket.getfqdn", lambda *args: "fallback.example.net")

    loaded = load({})

    assert loaded.store == "orm"
    assert loaded.database == "default"
    assert loaded.redis_connection == "default"
    assert loaded.redis_key_prefix == "bumail:queue:"
    assert loaded.hostname == "fallback.example.net"
    assert loaded.route == Route(type="mx", tls_required=False)
    assert loaded.routes == {}
    assert loaded.mx_port == 25
    assert loaded.dns_nameservers is None
    assert loaded.concurrency == 20
    assert loaded.domain_concurrency == 20
    assert loaded.lease_seconds == 600
    assert loaded.lease == timedelta(minutes=10)
    assert loaded.max_age == timedelta(days=5)
    assert loaded.delay_warning == timedelta(hours=4)
    assert loaded.max_items is None
    assert loaded.max_message_size == 25 * 1024 * 1024
    assert loaded.max_recipients == 1000
    assert loaded.allowed_private_networks == ()
    assert (loaded.mx_address_limit, loaded.mx_session_limit) == (5, 2)
    assert loaded.unreachable_host_memory == timedelta(minutes=5)
    assert (loaded.mta_sts, loaded.mta_sts_https_port, loaded.tls_ca_file) == (True, 443, None)


def test_every_setting_has_a_field_of_the_loaded_settings():
    assert {field.name for field in dataclasses.fields(QueueSettings)} == {key.lower() for key in DEFAULTS}


def test_an_empty_dict_is_valid():
    assert validate({}) == []


def test_hostname_falls_back_to_the_fqdn(monkeypatch):
    monkeypatch.setattr("socket.getfqdn", lambda *args: "fallback.example.net")

    assert load({}).hostname == "fallback.example.net"
    assert load({"HOSTNAME": None}).hostname == "fallback.example.net"


def test_a_given_hostname_wins_over_the_fqdn(monkeypatch):
    monkeypatch.setattr("socket.getfqdn", lambda *args: "fallback.example.net")

    assert load({"HOSTNAME": "mta.example.com"}).hostname == "mta.example.com"


def test_durations_may_be_seconds():
    loaded = load({"MAX_AGE": 3600, "DELAY_WARNING": 1.5})

    assert loaded.max_age == timedelta(hours=1)
    assert loaded.delay_warning == timedelta(seconds=1.5)


@pytest.mark.parametrize(
    ("value", "memory"),
    [
        (90, timedelta(seconds=90)),
        (timedelta(minutes=2), timedelta(minutes=2)),
        (0, timedelta(0)),
        (timedelta(0), timedelta(0)),
    ],
)
def test_the_unreachable_host_memory_is_a_duration_that_zero_turns_off(value, memory):
    assert validate({"UNREACHABLE_HOST_MEMORY": value}) == []
    assert load({"UNREACHABLE_HOST_MEMORY": value}).unreachable_host_memory == memory


def test_nameservers_are_parsed_with_their_ports():
    loaded = load({"DNS_NAMESERVERS": ["192.0.2.53", "192.0.2.54:5353", "[2001:db8::53]:5300", "2001:db8::1"]})

    assert loaded.dns_nameservers == (
        ("192.0.2.53", 53),
        ("192.0.2.54", 5353),
        ("2001:db8::53", 5300),
        ("2001:db8::1", 53),
    )


def test_max_items_may_be_a_limit():
    assert load({"MAX_ITEMS": 1000}).max_items == 1000


@pytest.mark.parametrize(
    ("tls", "port"),
    [("starttls", 587), ("implicit", 465), ("none", 587)],
)
def test_a_smarthost_port_defaults_by_its_tls_mode(tls, port):
    route = load({"ROUTE": {**SMARTHOST, "TLS": tls}}).route

    assert route.type == "smarthost"
    assert route.host == "smtp.example.com"
    assert route.port == port
    assert route.tls == tls
    assert route.tls_verify is True
    assert route.tls_required is (tls != "none")
    assert route.username is None
    assert route.password is None


def test_a_smarthost_keeps_its_credentials_and_port():
    route = load(
        {"ROUTE": {**SMARTHOST, "PORT": 2525, "USERNAME": "mailer", "PASSWORD": SECRET, "TLS_VERIFY": False}}
    ).route

    assert (route.port, route.username, route.password, route.tls_verify) == (2525, "mailer", SECRET, False)


def test_an_mx_route_may_require_tls():
    assert load({"ROUTE": {"TYPE": "mx", "TLS_REQUIRED": True}}).route == Route(type="mx", tls_required=True)


# -- problems -------------------------------------------------------------------------

PROBLEMS = [
    # (raw, check id, text the message must hold)
    ({"CONCURENCY": 3}, "bumail_queue.E002", "Did you mean 'CONCURRENCY'?"),
    ({"MAX_SIZE": 10}, "bumail_queue.E002", "'MAX_SIZE'"),
    ({"XYZZY": 1}, "bumail_queue.E002", "Known keys: STORE"),
    ({"STORE": "mongodb"}, "bumail_queue.E003", "'orm', 'memory'"),
    ({"STORE": ""}, "bumail_queue.E003", "'orm', 'memory'"),
    ({"STORE": 5}, "bumail_queue.E003", "dotted path of a QueueStore class"),
    ({"DATABASE": "replica"}, "bumail_queue.E004", "DATABASES ('default'); got 'replica'"),
    ({"DATABASE": None}, "bumail_queue.E004", "DATABASES ('default')"),
    ({"REDIS_CONNECTION": 3}, "bumail_queue.E005", "REDIS_CONNECTION"),
    ({"REDIS_KEY_PREFIX": "bumail{queue}:"}, "bumail_queue.E005", "no '{'"),
    ({"REDIS_KEY_PREFIX": "bumail:*"}, "bumail_queue.E005", "no glob character"),
    ({"REDIS_KEY_PREFIX": "q" * 41}, "bumail_queue.E005", "1 to 40"),
    ({"REDIS_KEY_PREFIX": ""}, "bumail_queue.E005", "1 to 40"),
    ({"REDIS_KEY_PREFIX": "Bumail:"}, "bumail_queue.E005", "lowercase"),
    ({"HOSTNAME": "not a host"}, "bumail_queue.E006", "must be a host name"),
    ({"HOSTNAME": "-mta.example.com"}, "bumail_queue.E006", "got '-mta.example.com'"),
    ({"HOSTNAME": "mta_1.example.com"}, "bumail_queue.E006", "must be a host name"),
    ({"HOSTNAME": 42}, "bumail_queue.E006", "got 42"),
    ({"ROUTE": "mx"}, "bumail_queue.E007", "must be a dict with a 'TYPE'"),
    ({"ROUTE": {}}, "bumail_queue.E007", "['TYPE'] must be one of 'mx', 'smarthost'"),
    ({"ROUTE": {"TYPE": "lmtp"}}, "bumail_queue.E007", "got 'lmtp'"),
    ({"ROUTE": {"TYPE": "mx", "HOST": "smtp.example.com"}}, "bumail_queue.E007", "does not take: HOST"),
    ({"ROUTE": {"TYPE": "mx", "TLS_REQUIRED": "yes"}}, "bumail_queue.E007", "['TLS_REQUIRED'] must be True or False"),
    ({"ROUTE": {**SMARTHOST, "TLS": "ssl"}}, "bumail_queue.E007", "'starttls', 'implicit', 'none'; got 'ssl'"),
    ({"ROUTE": {"TYPE": "smarthost"}}, "bumail_queue.E007", "BUMAIL_QUEUE['ROUTE'] needs a 'HOST': a smarthost route"),
    ({"ROUTE": {"TYPE": "smarthost", "HOST": None}}, "bumail_queue.E007", "['HOST'] must be a host name or IP address"),
    ({"ROUTE": {"TYPE": "smarthost", "HOST": "smtp example"}}, "bumail_queue.E007", "got 'smtp example'"),
    ({"ROUTE": {**SMARTHOST, "PORT": 0}}, "bumail_queue.E007", "['PORT'] must be a port number from 1 to 65535"),
    ({"ROUTE": {**SMARTHOST, "PORT": 65536}}, "bumail_queue.E007", "got 65536"),
    ({"ROUTE": {**SMARTHOST, "PORT": True}}, "bumail_queue.E007", "got True"),
    ({"ROUTE": {**SMARTHOST, "PORT": "587"}}, "bumail_queue.E007", "got '587'"),
    ({"ROUTE": {**SMARTHOST, "USERNAME": "mailer"}}, "bumail_queue.E007", "needs both 'USERNAME' and 'PASSWORD'"),
    ({"ROUTE": {**SMARTHOST, "PASSWORD": SECRET}}, "bumail_queue.E007", "needs both 'USERNAME' and 'PASSWORD'"),
    ({"ROUTE": {**SMARTHOST, "USERNAME": 7, "PASSWORD": SECRET}}, "bumail_queue.E007", "['USERNAME'] must be a string"),
    ({"ROUTE": {**SMARTHOST, "TLS_VERIFY": "no"}}, "bumail_queue.E007", "['TLS_VERIFY'] must be True or False"),
    ({"ROUTE": {**SMARTHOST, "TIMEOUT": 5}}, "bumail_queue.E007", "does not take: TIMEOUT"),
    ({"ROUTES": [("example.org", SMARTHOST)]}, "bumail_queue.E007", "['ROUTES'] must be a dict"),
    ({"ROUTES": {"not a domain": {"TYPE": "mx"}}}, "bumail_queue.E007", "not a domain: 'not a domain'"),
    ({"ROUTES": {"example.org": {"TYPE": "relay"}}}, "bumail_queue.E007", "['ROUTES']['example.org']['TYPE']"),
    ({"MX_PORT": 0}, "bumail_queue.E008", "['MX_PORT'] must be a port number from 1 to 65535; got 0"),
    ({"MX_PORT": 65536}, "bumail_queue.E008", "got 65536"),
    ({"MX_PORT": True}, "bumail_queue.E008", "got True"),
    ({"MX_PORT": "25"}, "bumail_queue.E008", "got '25'"),
    ({"DNS_NAMESERVERS": "192.0.2.53"}, "bumail_queue.E009", "non-empty list of 'ip' or 'ip:port' strings"),
    ({"DNS_NAMESERVERS": []}, "bumail_queue.E009", "got []"),
    ({"DNS_NAMESERVERS": ["dns.example.com"]}, "bumail_queue.E009", "got ['dns.example.com']"),
    ({"DNS_NAMESERVERS": ["192.0.2.53:0"]}, "bumail_queue.E009", "'ip:port'"),
    ({"DNS_NAMESERVERS": ["192.0.2.53:65536"]}, "bumail_queue.E009", "'ip:port'"),
    ({"DNS_NAMESERVERS": ["192.0.2.53:dns"]}, "bumail_queue.E009", "'ip:port'"),
    ({"DNS_NAMESERVERS": [53]}, "bumail_queue.E009", "'ip:port'"),
    ({"CONCURRENCY": 0}, "bumail_queue.E010", "['CONCURRENCY'] must be a whole number above 0; got 0"),
    ({"CONCURRENCY": -1}, "bumail_queue.E010", "got -1"),
    ({"CONCURRENCY": True}, "bumail_queue.E010", "got True"),
    ({"CONCURRENCY": 2.5}, "bumail_queue.E010", "got 2.5"),
    ({"CONCURRENCY": "20"}, "bumail_queue.E010", "got '20'"),
    ({"DOMAIN_CONCURRENCY": 0}, "bumail_queue.E010", "['DOMAIN_CONCURRENCY'] must be a whole number above 0"),
    ({"DOMAIN_CONCURRENCY": False}, "bumail_queue.E010", "got False"),
    ({"LEASE_SECONDS": 0}, "bumail_queue.E010", "['LEASE_SECONDS'] must be a whole number above 0"),
    ({"LEASE_SECONDS": True}, "bumail_queue.E010", "got True"),
    ({"MAX_AGE": 0}, "bumail_queue.E011", "['MAX_AGE'] must be a timedelta or a number of seconds above 0"),
    ({"MAX_AGE": timedelta(0)}, "bumail_queue.E011", "got datetime.timedelta(0)"),
    ({"MAX_AGE": timedelta(seconds=-1)}, "bumail_queue.E011", "['MAX_AGE']"),
    ({"MAX_AGE": True}, "bumail_queue.E011", "got True"),
    ({"MAX_AGE": "5 days"}, "bumail_queue.E011", "got '5 days'"),
    (
        {"DELAY_WARNING": -60},
        "bumail_queue.E011",
        "['DELAY_WARNING'] must be a timedelta or a number of seconds above 0",
    ),
    ({"DELAY_WARNING": None}, "bumail_queue.E011", "got None"),
    ({"MAX_ITEMS": 0}, "bumail_queue.E012", "['MAX_ITEMS'] must be a whole number above 0, or None"),
    ({"MAX_ITEMS": True}, "bumail_queue.E012", "got True"),
    ({"MAX_MESSAGE_SIZE": 0}, "bumail_queue.E012", "['MAX_MESSAGE_SIZE'] must be a whole number above 0"),
    ({"MAX_MESSAGE_SIZE": None}, "bumail_queue.E012", "got None"),
    ({"MAX_MESSAGE_SIZE": 1e6}, "bumail_queue.E012", "got 1000000.0"),
    ({"MAX_RECIPIENTS": 0}, "bumail_queue.E012", "['MAX_RECIPIENTS'] must be a whole number above 0"),
    ({"ALLOWED_PRIVATE_NETWORKS": "10.0.0.0/8"}, "bumail_queue.E021", "must be a list of CIDR strings"),
    ({"ALLOWED_PRIVATE_NETWORKS": ["10.0.0.0/33"]}, "bumail_queue.E021", "got ['10.0.0.0/33']"),
    ({"ALLOWED_PRIVATE_NETWORKS": [10]}, "bumail_queue.E021", "got [10]"),
    ({"MX_ADDRESS_LIMIT": 0}, "bumail_queue.E021", "['MX_ADDRESS_LIMIT'] must be a whole number above 0"),
    ({"MX_SESSION_LIMIT": "2"}, "bumail_queue.E021", "got '2'"),
    (
        {"UNREACHABLE_HOST_MEMORY": -1},
        "bumail_queue.E021",
        "BUMAIL_QUEUE['UNREACHABLE_HOST_MEMORY'] must be a timedelta or a number of seconds from 0 (off) to 10 years; got -1.",
    ),
    ({"UNREACHABLE_HOST_MEMORY": timedelta(seconds=-1)}, "bumail_queue.E021", "['UNREACHABLE_HOST_MEMORY']"),
    ({"UNREACHABLE_HOST_MEMORY": "5 minutes"}, "bumail_queue.E021", "got '5 minutes'"),
    ({"UNREACHABLE_HOST_MEMORY": None}, "bumail_queue.E021", "got None"),
    ({"UNREACHABLE_HOST_MEMORY": False}, "bumail_queue.E021", "got False"),
    ({"UNREACHABLE_HOST_MEMORY": float("inf")}, "bumail_queue.E021", "got inf"),
    ({"MTA_STS": "yes"}, "bumail_queue.E027", "BUMAIL_QUEUE['MTA_STS'] must be True or False; got 'yes'."),
    ({"MTA_STS": None}, "bumail_queue.E027", "got None"),
    ({"MTA_STS_HTTPS_PORT": 0}, "bumail_queue.E027", "['MTA_STS_HTTPS_PORT'] must be a port number from 1 to 65535"),
    ({"MTA_STS_HTTPS_PORT": 65536}, "bumail_queue.E027", "got 65536"),
    ({"MTA_STS_HTTPS_PORT": True}, "bumail_queue.E027", "got True"),
    ({"MTA_STS_HTTPS_PORT": "443"}, "bumail_queue.E027", "got '443'"),
    ({"TLS_CA_FILE": 42}, "bumail_queue.E027", "42 is not a path"),
    ({"TLS_CA_FILE": ""}, "bumail_queue.E027", "'' is not a path"),
    ({"TLS_CA_FILE": "/no/such/ca.pem"}, "bumail_queue.E027", "'/no/such/ca.pem' is not a file"),
    ({"TLS_CA_FILE": "/"}, "bumail_queue.E027", "the system's trust store) or the path of a file of PEM CA"),
    ({1: "one"}, "bumail_queue.E002", "unknown key 1"),
    ({"SUPPRESSION": "yes"}, "bumail_queue.E030", "BUMAIL_QUEUE['SUPPRESSION'] must be True or False; got 'yes'."),
    ({"SUPPRESSION": None}, "bumail_queue.E030", "got None"),
    ({"SUPPRESSION_DSN": 1}, "bumail_queue.E030", "BUMAIL_QUEUE['SUPPRESSION_DSN'] must be True or False; got 1."),
    (
        {"SUPPRESSION_DURATION": 0},
        "bumail_queue.E030",
        "BUMAIL_QUEUE['SUPPRESSION_DURATION'] must be a timedelta or a number of seconds above 0",
    ),
    ({"SUPPRESSION_DURATION": None}, "bumail_queue.E030", "got None"),
    ({"SUPPRESSION_DURATION": "30d"}, "bumail_queue.E030", "got '30d'"),
    ({"SUPPRESSION_EXPIRY_WINDOW": timedelta(days=-1)}, "bumail_queue.E030", "['SUPPRESSION_EXPIRY_WINDOW']"),
    ({"SUPPRESSION_EXPIRY_WINDOW": False}, "bumail_queue.E030", "got False"),
]


@pytest.mark.parametrize(
    ("raw", "check_id", "text"), PROBLEMS, ids=[f"{p[1][-4:]}-{sorted(p[0])[0]}-{i}" for i, p in enumerate(PROBLEMS)]
)
def test_each_problem_is_reported_with_its_id(raw, check_id, text):
    problems = validate(raw)

    assert [problem.id for problem in problems] == [check_id]
    assert text in problems[0].message


@pytest.mark.parametrize(("raw", "check_id", "text"), PROBLEMS[::7])
def test_load_refuses_what_validate_reports(raw, check_id, text):
    with pytest.raises(QueueConfigurationError) as info:
        load(raw)

    assert text in info.value.message
    assert f"({check_id})" in info.value.message


def test_keys_of_any_type_are_reported_not_crashed_on():
    problems = validate({1: "one", None: 2, "CONCURENCY": 3, ("a",): 4})

    assert [p.id for p in problems] == ["bumail_queue.E002"] * 4


def test_private_networks_are_loaded_as_networks():
    loaded = load({"ALLOWED_PRIVATE_NETWORKS": ["10.20.0.0/16", "127.0.0.1", "fd00::/8"]})

    assert [str(n) for n in loaded.allowed_private_networks] == ["10.20.0.0/16", "127.0.0.1/32", "fd00::/8"]


def test_a_setting_that_is_not_a_dict_is_e001():
    problems = validate(["STORE", "orm"])

    assert [(p.id, p.message) for p in problems] == [("bumail_queue.E001", "BUMAIL_QUEUE must be a dict; got list.")]


def test_problems_name_the_key_they_are_about():
    by_id = {p.id: p.key for p in validate({"CONCURENCY": 1, "STORE": "mongodb", "MX_PORT": 0, "MAX_AGE": 0})}

    assert by_id == {
        "bumail_queue.E002": "CONCURENCY",
        "bumail_queue.E003": "STORE",
        "bumail_queue.E008": "MX_PORT",
        "bumail_queue.E011": "MAX_AGE",
    }


def test_every_problem_is_reported_at_once():
    raw = {
        "CONCURENCY": 4,
        "STORE": "mongodb",
        "DATABASE": "replica",
        "ROUTE": {**SMARTHOST, "TLS": "ssl", "PORT": 0},
        "MX_PORT": 0,
        "CONCURRENCY": 0,
        "LEASE_SECONDS": -5,
        "MAX_ITEMS": 0,
    }

    assert sorted(ids(raw)) == [
        "bumail_queue.E002",
        "bumail_queue.E003",
        "bumail_queue.E004",
        "bumail_queue.E007",
        "bumail_queue.E007",
        "bumail_queue.E008",
        "bumail_queue.E010",
        "bumail_queue.E010",
        "bumail_queue.E012",
    ]
    with pytest.raises(QueueConfigurationError) as info:
        load(raw)
    message = info.value.message
    for problem in validate(raw):
        assert f"- {problem.message} ({problem.id})" in message


def test_load_raises_an_improperly_configured_naming_the_key_and_the_allowed_values():
    with pytest.raises(ImproperlyConfigured) as info:
        load({"ROUTE": {**SMARTHOST, "TLS": "ssl"}})

    error = info.value
    assert isinstance(error, QueueConfigurationError)
    assert error.code == ErrorCode.INVALID_OPTION
    assert str(error).startswith("INVALID_OPTION: BUMAIL_QUEUE is not valid:")
    assert "BUMAIL_QUEUE['ROUTE']['TLS']" in str(error)
    assert "'starttls', 'implicit', 'none'" in str(error)
    assert "got 'ssl'" in str(error)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**15])
def test_a_duration_that_cannot_be_a_timedelta_is_reported_not_crashed_on(value):
    # What manage.py check accepts, start-up must accept too: here neither may.
    with pytest.raises(QueueConfigurationError) as info:
        load({"MAX_AGE": value})

    assert "(bumail_queue.E011)" in info.value.message
    assert "MAX_AGE" in info.value.message


# -- the password ---------------------------------------------------------------------

PASSWORD_CONFIGS = [
    {"ROUTE": {**SMARTHOST, "PASSWORD": SECRET}},
    {"ROUTE": {**SMARTHOST, "PASSWORD": 12345678}},
    {"ROUTE": {**SMARTHOST, "USERNAME": "mailer", "PASSWORD": 12345678}},
    {"ROUTE": {**SMARTHOST, "USERNAME": "mailer", "PASSWORD": SECRET, "TLS": "ssl", "EXTRA": 1}},
    {"ROUTE": {**SMARTHOST, "USERNAME": 99, "PASSWORD": SECRET, "PORT": -1}},
    {"ROUTE": {"TYPE": "mx", "USERNAME": "mailer", "PASSWORD": SECRET}},
    {"ROUTE": {"TYPE": "relay", "USERNAME": "mailer", "PASSWORD": SECRET}},
    {"ROUTES": {"example.org": {**SMARTHOST, "HOST": "", "USERNAME": "mailer", "PASSWORD": SECRET}}},
    {"ROUTES": {"example.org": {**SMARTHOST, "PASSWORD": [SECRET]}}},
    {"PASSWORD": SECRET},
]


@pytest.mark.parametrize("raw", PASSWORD_CONFIGS)
def test_no_problem_message_repeats_the_password(raw):
    problems = validate(raw)
    assert problems  # each of these is wrong somewhere
    with pytest.raises(QueueConfigurationError) as info:
        load(raw)

    for text in [*(p.message for p in problems), str(info.value), repr(info.value)]:
        assert SECRET not in text
        assert "12345678" not in text


def test_the_loaded_settings_do_not_show_the_password():
    loaded = load(
        {
            "ROUTE": {**SMARTHOST, "USERNAME": "mailer", "PASSWORD": SECRET},
            "ROUTES": {"example.org": {**SMARTHOST, "USERNAME": "other", "PASSWORD": SECRET}},
        }
    )

    assert loaded.route.password == SECRET
    assert loaded.route_for("example.org").password == SECRET
    for text in (repr(loaded), str(loaded), repr(loaded.route), str(loaded.route), repr(loaded.routes)):
        assert SECRET not in text
    assert "username='mailer'" in repr(loaded.route)


# -- get_settings() and ROUTES --------------------------------------------------------


def test_get_settings_reads_the_project_setting_once():
    first = get_settings()

    assert first.hostname == "mta.example.com"
    assert get_settings() is first


def test_get_settings_follows_override_settings():
    assert get_settings().concurrency == 20

    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "other.example.net", "CONCURRENCY": 3}):
        assert get_settings().hostname == "other.example.net"
        assert get_settings().concurrency == 3

    assert get_settings().hostname == "mta.example.com"
    assert get_settings().concurrency == 20


def test_the_store_follows_override_settings_too():
    assert isinstance(get_store(), ORMStore)

    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "STORE": "memory"}):
        assert isinstance(get_store(), MemoryStore)

    assert isinstance(get_store(), ORMStore)


def test_get_settings_raises_for_an_invalid_override():
    with override_settings(BUMAIL_QUEUE={"CONCURRENCY": 0}), pytest.raises(QueueConfigurationError) as info:
        get_settings()

    assert "CONCURRENCY" in info.value.message


def test_get_settings_gives_the_defaults_without_the_setting(settings, monkeypatch):
    monkeypatch.setattr("socket.getfqdn", lambda *args: "fallback.example.net")
    del settings.BUMAIL_QUEUE

    loaded = get_settings()

    assert loaded.hostname == "fallback.example.net"
    assert loaded.concurrency == 20


def test_route_for_picks_routes_by_domain_whatever_the_case():
    loaded = load(
        {
            "ROUTE": {"TYPE": "mx"},
            "ROUTES": {
                "Example.ORG": {**SMARTHOST, "TLS": "implicit"},
                "corp.example.net": {"TYPE": "mx", "TLS_REQUIRED": True},
            },
        }
    )

    for domain in ("example.org", "EXAMPLE.ORG", "Example.Org"):
        route = loaded.route_for(domain)
        assert (route.type, route.host, route.port) == ("smarthost", "smtp.example.com", 465)
    assert loaded.route_for("CORP.example.net") == Route(type="mx", tls_required=True)
    assert loaded.route_for("elsewhere.example") == Route(type="mx", tls_required=False)
    assert loaded.route_for("mail.example.org") == Route(type="mx", tls_required=False)


@pytest.mark.parametrize("written", ["Example.ORG", "example.org.", "bücher.example"])
def test_routes_match_a_domain_however_it_is_written(written):
    smarthost = {"TYPE": "smarthost", "HOST": "smtp.example.net", "TLS": "starttls"}
    settings = load({"ROUTES": {written: smarthost}})
    domain = written.lower().rstrip(".")
    assert settings.route_for(domain).type == "smarthost"
    assert settings.route_for(domain.upper() + ".").type == "smarthost"
    assert settings.route_for("other.example").type == "mx"


def test_dkim_signers_are_loaded_with_their_domain_as_a_labels_and_their_key_never_shown():
    from bumail_queue.conf import DKIMSigner

    loaded = load(
        {
            "DKIM": [
                {"DOMAIN": "Bücher.Example", "SELECTOR": "S2026", "KEY": "-----BEGIN PRIVATE KEY-----\nsecret"},
                {"DOMAIN": "example.com", "SELECTOR": "ed", "KEY": "keys/ed.pem", "ALGORITHM": "ed25519-sha256"},
            ],
            "DKIM_UNSIGNED_ON_ERROR": True,
        }
    )

    assert loaded.dkim == (
        DKIMSigner(domain="xn--bcher-kva.example", selector="s2026", key="-----BEGIN PRIVATE KEY-----\nsecret"),
        DKIMSigner(domain="example.com", selector="ed", key="keys/ed.pem", algorithm="ed25519-sha256"),
    )
    assert loaded.dkim_unsigned_on_error is True
    assert "secret" not in repr(loaded)
    assert load({}).dkim == ()


# -- MTA-STS ------------------------------------------------------------------------------


def test_a_tls_ca_file_of_pem_certificates_is_taken_as_a_path_or_a_string(test_pki):
    assert load({"TLS_CA_FILE": test_pki.ca_file}).tls_ca_file == test_pki.ca_file
    assert load({"TLS_CA_FILE": Path(test_pki.ca_file)}).tls_ca_file == test_pki.ca_file


def test_a_tls_ca_file_without_certificates_is_e027(tmp_path):
    path = tmp_path / "not-a-ca.pem"
    path.write_text("this is no certificate\n")
    [problem] = validate({"TLS_CA_FILE": str(path)})
    assert problem.id == "bumail_queue.E027"
    assert "holds no certificate Python's ssl module can load" in problem.message


def test_mta_sts_can_be_turned_off_and_its_port_moved():
    loaded = load({"MTA_STS": False, "MTA_STS_HTTPS_PORT": 8443})
    assert (loaded.mta_sts, loaded.mta_sts_https_port) == (False, 8443)


def test_the_suppression_list_is_on_for_30_days_with_dsns_by_default():
    loaded = load({})

    assert loaded.suppression is True
    assert loaded.suppression_duration == timedelta(days=30)
    assert loaded.suppression_expiry_window == timedelta(days=30)
    assert loaded.suppression_dsn is True


def test_suppression_durations_take_seconds_and_the_window_takes_none():
    loaded = load({"SUPPRESSION_DURATION": 3600, "SUPPRESSION_EXPIRY_WINDOW": None, "SUPPRESSION": False})

    assert (loaded.suppression, loaded.suppression_duration, loaded.suppression_expiry_window) == (
        False,
        timedelta(hours=1),
        None,
    )


# -- backend routes and channel routes ----------------------------------------------------

POSTMARK = {
    "TYPE": "backend",
    "BACKEND": "anymail.backends.postmark.EmailBackend",
    "OPTIONS": {"server_token": "pm-s3cret-token-value"},
}


def test_a_backend_route_keeps_its_backend_and_options_and_is_named_by_them():
    route = load({"ROUTE": POSTMARK}).route
    assert (route.type, route.backend, route.name) == ("backend", POSTMARK["BACKEND"], POSTMARK["BACKEND"])
    assert route.options == {"server_token": "pm-s3cret-token-value"}
    assert "pm-s3cret" not in repr(route)
    named = load({"ROUTE": {**POSTMARK, "NAME": "postmark"}}).route
    assert named.name == "postmark"


def test_a_channels_route_comes_after_the_domains_and_before_the_default():
    loaded = load(
        {
            "ROUTE": {"TYPE": "mx"},
            "ROUTES": {"corp.example": SMARTHOST},
            "CHANNEL_ROUTES": {"newsletter": {**POSTMARK, "NAME": "postmark"}},
        }
    )
    assert loaded.route_for("example.org", "newsletter").name == "postmark"
    assert loaded.route_for("corp.example", "newsletter").type == "smarthost"
    assert loaded.route_for("example.org", "default").type == "mx"
    assert loaded.route_for("example.org").type == "mx"


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"ROUTE": {"TYPE": "backend"}}, "['BACKEND'] must be the dotted path of a Django email backend"),
        ({"ROUTE": {**POSTMARK, "BACKEND": "not a path"}}, "got 'not a path'"),
        ({"ROUTE": {**POSTMARK, "OPTIONS": ["pm-s3cret-token-value"]}}, "['OPTIONS'] must be a dict"),
        ({"ROUTE": {**POSTMARK, "NAME": "has space"}}, "['NAME'] must be a name"),
        ({"ROUTE": {**POSTMARK, "HOST": "x"}}, "keys a 'backend' route does not take: HOST"),
        ({"CHANNEL_ROUTES": {"bad name": POSTMARK}}, "has a key that is not a channel name"),
        ({"CHANNEL_ROUTES": []}, "must be a dict of channel to route"),
        (
            {"ROUTE": POSTMARK, "ROUTES": {"b.example": {**POSTMARK, "OPTIONS": {"server_token": "other-s3cret"}}}},
            "is a backend route named 'anymail.backends.postmark.EmailBackend', as BUMAIL_QUEUE['ROUTE'] is",
        ),
    ],
)
def test_a_backend_route_set_up_wrongly_is_e007_and_its_options_are_never_shown(raw, words):
    problems = validate(raw)
    assert [p.id for p in problems] == ["bumail_queue.E007"]
    assert words in problems[0].message
    assert "s3cret" not in problems[0].message
