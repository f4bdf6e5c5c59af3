"""System checks: ``manage.py check`` reports what start-up would refuse, with ids."""

from __future__ import annotations

import io
import re
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

from bumail_queue.checks import check_settings, check_store
from bumail_queue.stores.memory import MemoryStore
from tests.dkim_keys import ed25519_pem_body, shows_key_text

HOST = {"HOSTNAME": "mta.example.com"}

# Django's own model checks may ask the database for its features (JSONField support).
needs_db = pytest.mark.django_db


class ComplainingStore(MemoryStore):
    """A store that finds something wrong with its own set-up."""

    def check(self, **kwargs):
        return [checks.Error("The complaining store is not ready.", id="testapp.E001")]


@needs_db
def test_the_test_settings_pass_the_check_command():
    out = io.StringIO()

    call_command("check", stdout=out)

    assert "System check identified no issues" in out.getvalue()


def test_the_test_settings_give_no_message_of_ours():
    assert check_settings(None) == []
    assert check_store(None) == []


@needs_db
@pytest.mark.parametrize(
    ("raw", "check_id", "text"),
    [
        (
            {**HOST, "CONCURRENCY": 0},
            "bumail_queue.E010",
            "BUMAIL_QUEUE['CONCURRENCY'] must be a whole number above 0; got 0.",
        ),
        ({**HOST, "CONCURENCY": 4}, "bumail_queue.E002", "Did you mean 'CONCURRENCY'?"),
        ({**HOST, "STORE": "mongodb"}, "bumail_queue.E003", "BUMAIL_QUEUE['STORE'] must be one of 'orm', 'memory'"),
        (
            {**HOST, "ROUTE": {"TYPE": "smarthost", "HOST": "smtp.example.com", "TLS": "ssl"}},
            "bumail_queue.E007",
            "got 'ssl'",
        ),
        ({**HOST, "MAX_AGE": 0}, "bumail_queue.E011", "BUMAIL_QUEUE['MAX_AGE'] must be a timedelta"),
    ],
    ids=["E010", "E002", "E003", "E007", "E011"],
)
def test_the_check_command_fails_on_a_bad_setting(raw, check_id, text):
    with override_settings(BUMAIL_QUEUE=raw), pytest.raises(SystemCheckError) as info:
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())

    assert f"{check_id}" in str(info.value)
    assert text in str(info.value)


@needs_db
def test_the_check_command_reports_every_problem():
    raw = {"CONCURRENCY": 0, "MX_PORT": 0, "DATABASE": "replica"}

    with override_settings(BUMAIL_QUEUE=raw), pytest.raises(SystemCheckError) as info:
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())

    for check_id in ("bumail_queue.E004", "bumail_queue.E008", "bumail_queue.E010"):
        assert check_id in str(info.value)


@pytest.mark.parametrize(
    ("raw", "check_id"),
    [
        (["not", "a", "dict"], "bumail_queue.E001"),
        ({**HOST, "CONCURENCY": 4}, "bumail_queue.E002"),
        ({**HOST, "STORE": "mongodb"}, "bumail_queue.E003"),
        ({**HOST, "DATABASE": "replica"}, "bumail_queue.E004"),
        ({**HOST, "REDIS_KEY_PREFIX": "q:*"}, "bumail_queue.E005"),
        ({"HOSTNAME": "not a host"}, "bumail_queue.E006"),
        (
            {**HOST, "ROUTE": {"TYPE": "smarthost", "HOST": "smtp.example.com", "USERNAME": "mailer"}},
            "bumail_queue.E007",
        ),
        ({**HOST, "MX_PORT": 70000}, "bumail_queue.E008"),
        ({**HOST, "DNS_NAMESERVERS": ["dns.example.com"]}, "bumail_queue.E009"),
        ({**HOST, "LEASE_SECONDS": 0}, "bumail_queue.E010"),
        ({**HOST, "DELAY_WARNING": -1}, "bumail_queue.E011"),
        ({**HOST, "MAX_MESSAGE_SIZE": 0}, "bumail_queue.E012"),
        ({**HOST, "RETRY_MIN_DELAY": timedelta(hours=1), "RETRY_MAX_DELAY": timedelta(minutes=1)}, "bumail_queue.E015"),
        ({**HOST, "RETRY_FACTOR": 0.5}, "bumail_queue.E015"),
        ({**HOST, "TIMEOUTS": {"HELLO": 30}}, "bumail_queue.E016"),
        ({**HOST, "TIMEOUTS": ["DATA", 30]}, "bumail_queue.E016"),
        ({**HOST, "CONNECTION_REUSE_SECONDS": -1}, "bumail_queue.E017"),
        ({**HOST, "CLAIM_BATCH_SIZE": 0}, "bumail_queue.E017"),
        ({**HOST, "POLL_SECONDS": 0}, "bumail_queue.E017"),
        ({**HOST, "UNREACHABLE_HOST_MEMORY": -300}, "bumail_queue.E021"),
        ({**HOST, "UNREACHABLE_HOST_MEMORY": "5m"}, "bumail_queue.E021"),
        ({**HOST, "MTA_STS": "yes"}, "bumail_queue.E027"),
        ({**HOST, "TLS_CA_FILE": "/no/such/ca.pem"}, "bumail_queue.E027"),
        ({**HOST, "SUPPRESSION_DURATION": timedelta(0)}, "bumail_queue.E030"),
        ({**HOST, "SUPPRESSION_DSN": "no"}, "bumail_queue.E030"),
        ({**HOST, "DSN_PRIORITY": 101}, "bumail_queue.E031"),
        ({**HOST, "DSN_PRIORITY": "high"}, "bumail_queue.E031"),
        ({**HOST, "DSN_PRIORITY": True}, "bumail_queue.E031"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_check_settings_returns_an_error_with_the_id(raw, check_id):
    with override_settings(BUMAIL_QUEUE=raw):
        messages = check_settings(None)

    assert [(type(m), m.id, m.level) for m in messages] == [(checks.Error, check_id, checks.ERROR)]
    assert messages[0].obj == "BUMAIL_QUEUE"
    assert messages[0].msg.startswith("BUMAIL_QUEUE")


def test_check_settings_returns_one_error_per_problem():
    with override_settings(BUMAIL_QUEUE={**HOST, "CONCURRENCY": 0, "DOMAIN_CONCURRENCY": 0, "MAX_ITEMS": -1}):
        messages = check_settings(None)

    assert sorted(m.id for m in messages) == ["bumail_queue.E010", "bumail_queue.E010", "bumail_queue.E012"]
    assert all(isinstance(m, checks.Error) for m in messages)


@pytest.mark.parametrize(
    ("store", "text"),
    [
        ("bumail_queue.stores.nowhere.RedisStore", "cannot be imported"),
        ("bumail_queue.stores.memory.NoSuchStore", "cannot be imported"),
        ("bumail_queue.conf.Route", "not a QueueStore subclass"),
        ("bumail_queue.conf.DEFAULTS", "not a QueueStore subclass"),
    ],
)
def test_check_store_reports_a_store_path_that_is_no_store(store, text):
    with override_settings(BUMAIL_QUEUE={**HOST, "STORE": store}):
        assert check_settings(None) == []  # the path is well formed
        messages = check_store(None)

    assert [(type(m), m.id) for m in messages] == [(checks.Error, "bumail_queue.E003")]
    assert f"BUMAIL_QUEUE['STORE'] is {store!r}" in messages[0].msg
    assert text in messages[0].msg


@needs_db
def test_the_check_command_fails_on_a_store_path_that_cannot_be_imported():
    with (
        override_settings(BUMAIL_QUEUE={**HOST, "STORE": "myproject.stores.Missing"}),
        pytest.raises(SystemCheckError) as info,
    ):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())

    assert "bumail_queue.E003" in str(info.value)
    assert "'myproject.stores.Missing'" in str(info.value)


@pytest.mark.parametrize("store", ["memory", "orm", "bumail_queue.stores.memory.MemoryStore"])
def test_check_store_accepts_the_shipped_stores(store):
    with override_settings(BUMAIL_QUEUE={**HOST, "STORE": store}):
        assert check_store(None) == []


def test_check_store_returns_what_the_store_itself_reports():
    with override_settings(BUMAIL_QUEUE={**HOST, "STORE": f"{__name__}.ComplainingStore"}):
        messages = check_store(None)

    assert [(m.id, m.msg) for m in messages] == [("testapp.E001", "The complaining store is not ready.")]


def test_check_store_leaves_an_invalid_setting_to_check_settings():
    with override_settings(BUMAIL_QUEUE={"STORE": "myproject.stores.Missing", "CONCURRENCY": 0}):
        assert check_store(None) == []
        assert [m.id for m in check_settings(None)] == ["bumail_queue.E010"]


def test_a_smarthost_sending_credentials_without_tls_is_warned_about():
    from bumail_queue.checks import check_plaintext_auth

    route = {
        "TYPE": "smarthost",
        "HOST": "smtp.example.com",
        "PORT": 25,
        "TLS": "none",
        "USERNAME": "u",
        "PASSWORD": "hunter2-secret",
    }
    with override_settings(BUMAIL_QUEUE={"ROUTES": {"example.org": route}}):
        warnings = check_plaintext_auth()
    assert [w.id for w in warnings] == ["bumail_queue.W001"]
    assert "without TLS" in warnings[0].msg
    assert "hunter2-secret" not in warnings[0].msg
    with override_settings(BUMAIL_QUEUE={"ROUTE": {**route, "TLS": "starttls"}}):
        assert check_plaintext_auth() == []


def test_an_abstract_store_class_is_reported_not_crashed_on():
    from bumail_queue.checks import check_store

    with override_settings(BUMAIL_QUEUE={"STORE": "bumail_queue.stores.base.QueueStore"}):
        errors = check_store()
    assert [e.id for e in errors] == ["bumail_queue.E003"]
    assert "cannot be built" in errors[0].msg


def test_credentials_to_a_smarthost_whose_certificate_is_not_verified_are_warned_about():
    from bumail_queue.checks import check_unverified_auth

    route = {
        "TYPE": "smarthost",
        "HOST": "smtp.example.com",
        "TLS_VERIFY": False,
        "USERNAME": "u",
        "PASSWORD": "hunter2-secret",
    }
    with override_settings(BUMAIL_QUEUE={**HOST, "ROUTES": {"example.org": route}}):
        warnings = check_unverified_auth()
    assert [(type(w), w.id) for w in warnings] == [(checks.Warning, "bumail_queue.W002")]
    assert "BUMAIL_QUEUE['ROUTES['example.org']']" in warnings[0].msg
    assert "TLS_VERIFY is False" in warnings[0].msg
    assert "hunter2-secret" not in warnings[0].msg + warnings[0].hint
    # Verified, without credentials, or without TLS at all (W001's): no W002.
    for changed in ({"TLS_VERIFY": True}, {"USERNAME": None, "PASSWORD": None}, {"TLS": "none"}):
        quiet = {k: v for k, v in {**route, **changed}.items() if v is not None}
        with override_settings(BUMAIL_QUEUE={**HOST, "ROUTE": quiet}):
            assert check_unverified_auth() == []


@needs_db
def test_the_check_command_shows_the_unverified_tls_warning_without_failing():
    route = {
        "TYPE": "smarthost",
        "HOST": "smtp.example.com",
        "TLS": "implicit",
        "TLS_VERIFY": False,
        "USERNAME": "u",
        "PASSWORD": "p",
    }
    err = io.StringIO()
    with override_settings(BUMAIL_QUEUE={**HOST, "ROUTE": route}):
        call_command("check", stdout=io.StringIO(), stderr=err)
    assert "(bumail_queue.W002) BUMAIL_QUEUE['ROUTE'] sends USERNAME and PASSWORD" in err.getvalue()


def test_the_orm_store_refuses_a_database_other_than_postgresql_or_sqlite(monkeypatch):
    monkeypatch.setattr(connections["default"], "vendor", "mysql")
    with override_settings(BUMAIL_QUEUE={**HOST, "STORE": "orm"}):
        errors = check_store(None)
    assert [(type(e), e.id) for e in errors] == [(checks.Error, "bumail_queue.E013")]
    assert "DATABASES['default'] is mysql" in errors[0].msg


@pytest.mark.sqlite
def test_the_orm_store_refuses_an_sqlite_without_returning(monkeypatch):
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.34.1")
    with override_settings(BUMAIL_QUEUE={**HOST, "STORE": "orm"}):
        errors = check_store(None)
    assert [(type(e), e.id) for e in errors] == [(checks.Error, "bumail_queue.E014")]
    assert "3.34.1" in errors[0].msg


ROOT = Path(__file__).resolve().parent.parent
CHECK_ID = re.compile(r"bumail_queue\.[EW]\d{3}")


def check_ids_in(folder):
    return {found for path in (ROOT / folder).rglob("*.py") for found in CHECK_ID.findall(path.read_text())}


def test_every_check_id_of_the_package_is_asserted_by_a_test():
    assert check_ids_in("bumail_queue") - check_ids_in("tests") == set()


@pytest.mark.parametrize(
    ("hostname", "reason"),
    [
        ("mailhost", "a single label"),
        ("localhost", "a single label"),
        ("localhost.localdomain", "a name that only this machine or its local network knows"),
        ("vm.localdomain", "a name that only this machine or its local network knows"),
        ("printer.local", "a name that only this machine or its local network knows"),
        ("web.localhost", "a name that only this machine or its local network knows"),
        ("192.0.2.10", "an IP address"),
    ],
)
def test_a_hostname_that_is_no_fqdn_is_warned_about_as_w004(hostname, reason):
    from bumail_queue.checks import check_hostname_is_fqdn

    with override_settings(BUMAIL_QUEUE={"HOSTNAME": hostname}):
        assert check_settings(None) == []  # E006 still takes it
        warnings = check_hostname_is_fqdn()
    assert [(type(w), w.id) for w in warnings] == [(checks.Warning, "bumail_queue.W004")]
    assert f"BUMAIL_QUEUE['HOSTNAME'] is {hostname!r}: it is {reason}" in warnings[0].msg
    assert "EHLO" in warnings[0].msg


def test_the_default_hostname_is_checked_too(monkeypatch):
    import socket

    from bumail_queue.checks import check_hostname_is_fqdn

    monkeypatch.setattr(socket, "getfqdn", lambda name="": "localhost")
    with override_settings(BUMAIL_QUEUE={}):
        warnings = check_hostname_is_fqdn()
    assert [w.id for w in warnings] == ["bumail_queue.W004"]
    assert "socket.getfqdn(), the default of BUMAIL_QUEUE['HOSTNAME'], is 'localhost'" in warnings[0].msg
    monkeypatch.setattr(socket, "getfqdn", lambda name="": "web1.example.net")
    with override_settings(BUMAIL_QUEUE={}):
        assert check_hostname_is_fqdn() == []


@pytest.mark.parametrize("hostname", ["mta.example.com", "mail.example.com.", "mx1.eu.example.net"])
def test_a_fully_qualified_hostname_gets_no_w004(hostname):
    from bumail_queue.checks import check_hostname_is_fqdn

    with override_settings(BUMAIL_QUEUE={"HOSTNAME": hostname}):
        assert check_hostname_is_fqdn() == []


@needs_db
def test_the_check_command_shows_w004_without_failing():
    err = io.StringIO()
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "localhost.localdomain"}):
        call_command("check", stdout=io.StringIO(), stderr=err)
    assert "(bumail_queue.W004) BUMAIL_QUEUE['HOSTNAME'] is 'localhost.localdomain'" in err.getvalue()


# -- DKIM ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dkim", "expected"),
    [
        ("example.com", "BUMAIL_QUEUE['DKIM'] must be a list of signers"),
        (["example.com"], "BUMAIL_QUEUE['DKIM'][0] must be a dict with DOMAIN, SELECTOR, KEY and ALGORITHM"),
        ([{"DOMAIN": "example.com", "SELECTOR": "s1"}], "BUMAIL_QUEUE['DKIM'][0] needs 'KEY'"),
        (
            [{"DOMAIN": "localhost", "SELECTOR": "s1", "KEY": "k.pem"}],
            "has a DOMAIN that is not a domain name such as 'example.com': 'localhost'",
        ),
        (
            [{"DOMAIN": "192.0.2.1", "SELECTOR": "s1", "KEY": "k.pem"}],
            "has a DOMAIN that is not a domain name",
        ),
        ([{"DOMAIN": "example.com", "SELECTOR": "s 1", "KEY": "k.pem"}], "has a SELECTOR that is not one or more DNS"),
        (
            [{"DOMAIN": "example.com", "SELECTOR": "s1", "KEY": "k.pem", "ALGORITHM": "rsa-sha1"}],
            "has the ALGORITHM 'rsa-sha1'; it must be one of rsa-sha256, ed25519-sha256",
        ),
        ([{"DOMAIN": "example.com", "SELECTOR": "s1", "KEY": "k.pem", "SIGN": 1}], "has the unknown key 'SIGN'"),
        ([{"DOMAIN": "example.com", "SELECTOR": "s1", "KEY": 7}], "has a KEY that is not a PEM"),
    ],
)
def test_a_dkim_setting_of_the_wrong_shape_is_e023(dkim, expected):
    with override_settings(BUMAIL_QUEUE={"DKIM": dkim}):
        errors = check_settings(None)
    assert [e.id for e in errors] == ["bumail_queue.E023"]
    assert expected in errors[0].msg


def test_dkim_unsigned_on_error_must_be_a_boolean_e023():
    with override_settings(BUMAIL_QUEUE={"DKIM_UNSIGNED_ON_ERROR": "yes"}):
        errors = check_settings(None)
    assert [(e.id, "DKIM_UNSIGNED_ON_ERROR" in e.msg) for e in errors] == [("bumail_queue.E023", True)]


@pytest.mark.parametrize(
    ("key_attr", "algorithm", "expected"),
    [
        ("rsa768_pem", "rsa-sha256", "has 768 bits; verifiers refuse keys under 1024"),
        ("ed25519_pem", "rsa-sha256", "is not an RSA key (it is Ed25519)"),
        ("encrypted_pem", "rsa-sha256", "is not an unencrypted PEM private key"),
        (None, "rsa-sha256", "cannot be read: No such file or directory"),
    ],
)
def test_a_dkim_key_that_cannot_sign_is_e024_without_the_key_in_the_message(dkim_keys, key_attr, algorithm, expected):
    from bumail_queue.checks import check_dkim_keys

    key = getattr(dkim_keys, key_attr) if key_attr else "/nonexistent/dkim.pem"
    signer = {"DOMAIN": "example.com", "SELECTOR": "s1", "KEY": key, "ALGORITHM": algorithm}
    with override_settings(BUMAIL_QUEUE={"DKIM": [signer]}):
        assert check_settings(None) == []
        errors = check_dkim_keys()
    assert [(type(e), e.id) for e in errors] == [(checks.Error, "bumail_queue.E024")]
    assert expected in errors[0].msg
    assert "PRIVATE KEY" not in errors[0].msg + (errors[0].hint or "")


def test_a_dkim_key_without_its_pem_lines_is_e024_and_the_key_is_in_no_message():
    from bumail_queue.checks import check_dkim_keys

    key = ed25519_pem_body(with_slash=False)  # taken for a callable's dotted path, once
    signer = {"DOMAIN": "example.com", "SELECTOR": "ed1", "KEY": key, "ALGORITHM": "ed25519-sha256"}
    with override_settings(BUMAIL_QUEUE={"DKIM": [signer]}):
        assert check_settings(None) == []
        errors = check_dkim_keys()
    assert [(type(e), e.id) for e in errors] == [(checks.Error, "bumail_queue.E024")]
    assert "is key data without its PEM lines" in errors[0].msg
    assert not shows_key_text(errors[0].msg + (errors[0].hint or ""), key)


def test_an_rsa_key_under_2048_bits_is_w005_and_good_keys_pass(dkim_keys):
    from bumail_queue.checks import check_dkim_keys

    signers = [
        {"DOMAIN": "example.com", "SELECTOR": "old", "KEY": dkim_keys.rsa1024_pem},
        {"DOMAIN": "example.com", "SELECTOR": "new", "KEY": dkim_keys.rsa_pem},
        {"DOMAIN": "example.com", "SELECTOR": "ed", "KEY": dkim_keys.ed25519_pem, "ALGORITHM": "ed25519-sha256"},
    ]
    with override_settings(BUMAIL_QUEUE={"DKIM": signers}):
        warnings = check_dkim_keys()
    assert [(type(w), w.id) for w in warnings] == [(checks.Warning, "bumail_queue.W005")]
    assert "example.com (selector old, rsa-sha256) with an RSA key of 1024 bits" in warnings[0].msg


# -- development safety ---------------------------------------------------------------------


def test_debug_with_mail_going_straight_to_mx_hosts_is_w006():
    from bumail_queue.checks import check_development_mail_goes_out

    sink = {"TYPE": "smarthost", "HOST": "127.0.0.1", "PORT": 1025, "TLS": "none"}
    with override_settings(DEBUG=True, BUMAIL_QUEUE={}):
        (warning,) = check_development_mail_goes_out()
    assert warning.id == "bumail_queue.W006"
    assert "DEBUG is True and BUMAIL_QUEUE['ROUTE'] delivers straight to the recipients' MX hosts" in warning.msg
    assert "'TLS': 'none'" in warning.hint
    with override_settings(DEBUG=True, BUMAIL_QUEUE={"ROUTE": sink, "ROUTES": {"partner.example": {"TYPE": "mx"}}}):
        (warning,) = check_development_mail_goes_out()
    assert "BUMAIL_QUEUE['ROUTES']['partner.example'] delivers straight" in warning.msg
    with override_settings(DEBUG=True, BUMAIL_QUEUE={"ROUTE": sink}):
        assert check_development_mail_goes_out() == []
    with override_settings(DEBUG=False, BUMAIL_QUEUE={}):
        assert check_development_mail_goes_out() == []
