"""MTA-STS through the worker, with real servers on loopback: a DNS server, an HTTPS
server of policies whose certificate comes from a CA made in the test (``TLS_CA_FILE``),
and SMTP servers with and without a valid certificate; the policies kept in the store
for every worker, and the day's TLS report from ``manage.py queue_tlsrpt``."""

from __future__ import annotations

import json
from datetime import UTC, date, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.mail import EmailMessage
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.items import RecipientStatus
from bumail_queue.stores import get_store
from tests.servers.dns import LOOPBACK_NETWORKS, DNSZone
from tests.servers.https import PolicyResponse, PolicyServer, TestPKI, policy_text
from tests.servers.smtp import SMTPTestServer

pytestmark = pytest.mark.django_db(transaction=True)

DOMAIN = "sts.test"
POLICY_HOST = "mta-sts.sts.test"
RECIPIENT = "ann@sts.test"


@pytest.fixture
def policy_server(https_servers, test_pki: TestPKI) -> PolicyServer:
    return https_servers(test_pki.server_context(POLICY_HOST))


class World:
    """The DNS, the policy server and the MX servers of one test, and the settings that use them."""

    def __init__(self, dns_server, policy_server: PolicyServer, test_pki: TestPKI, smtp_servers) -> None:
        self.dns = dns_server
        self.policies = policy_server
        self.pki = test_pki
        self._smtp_servers = smtp_servers
        self.mx: list[SMTPTestServer] = []
        self.records: dict[str, Any] = {POLICY_HOST: {"A": ["127.0.0.1"]}}

    def mx_host(self, name: str, *, tls: str | None = "valid") -> SMTPTestServer:
        """Start an MX server named ``name`` (on 127.0.0.N, all on one port): ``tls`` is
        ``"valid"``, ``"untrusted"``, ``"wrong_name"``, ``"expired"`` or ``None`` (no STARTTLS)."""
        contexts = {
            "valid": lambda: self.pki.server_context(name),
            "untrusted": lambda: self.pki.other_ca_context(name),
            "wrong_name": lambda: self.pki.server_context("elsewhere.test"),
            "expired": lambda: self.pki.expired_context(name),
        }
        options: dict[str, Any] = {"host": f"127.0.0.{len(self.mx) + 1}"}
        if self.mx:
            options["port"] = self.mx[0].port
        server = self._smtp_servers(tls=None if tls is None else contexts[tls](), **options)
        self.mx.append(server)
        self.records[name] = {"A": [server.host]}
        mx = self.records.setdefault(DOMAIN, {}).setdefault("MX", [])
        mx.append((10 * len(self.mx), name))
        return server

    def publish(self, mode: str | None, *mx: str, policy_id: str = "20260301", max_age: int = 86400) -> None:
        """Announce a policy (``None``: no TXT record) and serve it."""
        if mode is None:
            self.records.get(f"_mta-sts.{DOMAIN}", {}).pop("TXT", None)
        else:
            self.records[f"_mta-sts.{DOMAIN}"] = {"TXT": [f"v=STSv1; id={policy_id};"]}
            self.policies.responses[POLICY_HOST] = PolicyResponse(policy_text(mode, *mx, max_age=max_age))
        self.dns.zone = DNSZone(self.records)

    def settings(self, **more: Any) -> dict[str, Any]:
        return {
            "HOSTNAME": "mta.example.com",
            "MX_PORT": self.mx[0].port,
            "DNS_NAMESERVERS": [self.dns.setting],
            "ALLOWED_PRIVATE_NETWORKS": LOOPBACK_NETWORKS,
            "MTA_STS_HTTPS_PORT": self.policies.port,
            "TLS_CA_FILE": self.pki.ca_file,
            # A deferral's DSN would go to the sender's domain, which this test's DNS lacks.
            "DELAY_WARNING": timedelta(days=4),
            **more,
        }


@pytest.fixture
def world(dns_server, policy_server, test_pki, smtp_servers) -> World:
    return World(dns_server, policy_server, test_pki, smtp_servers)


def send(settings: dict[str, Any], *, now=None) -> Any:
    """Queue one message to ann@sts.test and run the worker once; return the item as it stands."""
    with override_settings(BUMAIL_QUEUE=settings):
        item = queue.enqueue(EmailMessage("Hi", "Body", "me@sender.test", [RECIPIENT]))
        queue.deliver_due(now=now)
        return queue.get(item.id)


def report(settings: dict[str, Any], day: date | None = None) -> list[dict[str, Any]]:
    """Return what ``queue_tlsrpt`` prints for ``day`` (today, UTC), parsed."""
    out = StringIO()
    with override_settings(BUMAIL_QUEUE=settings):
        day = day or timezone.now().astimezone(UTC).date()
        call_command("queue_tlsrpt", "--date", day.isoformat(), stdout=out)
    return json.loads(out.getvalue())


def reply_of(item) -> tuple[RecipientStatus, str, str]:
    [recipient] = item.recipients
    return recipient.status, recipient.reply.status, recipient.reply.text


# -- enforce --------------------------------------------------------------------------------


def test_enforce_delivers_over_verified_tls_and_the_report_counts_the_session(world):
    server = world.mx_host("mx.sts.test")
    world.publish("enforce", "mx.sts.test")
    settings = world.settings()
    assert send(settings) is None  # delivered: the item left the queue
    [message] = server.messages
    assert message.rcpt_tos == [RECIPIENT]
    assert "STARTTLS" in server.verbs()

    [made] = report(settings)
    day = timezone.now().astimezone(UTC).date().isoformat()
    assert made == {
        "organization-name": "mta.example.com",
        "date-range": {"start-datetime": f"{day}T00:00:00Z", "end-datetime": f"{day}T23:59:59Z"},
        "contact-info": "postmaster@mta.example.com",
        "report-id": f"{day}T00:00:00Z_sts.test_mta.example.com",
        "policies": [
            {
                "policy": {
                    "policy-type": "sts",
                    "policy-domain": "sts.test",
                    "policy-string": ["version: STSv1", "mode: enforce", "mx: mx.sts.test", "max_age: 86400"],
                    "mx-host": ["mx.sts.test"],
                },
                "summary": {"total-successful-session-count": 1, "total-failure-session-count": 0},
                "failure-details": [],
            }
        ],
    }


def test_enforce_defers_475_when_no_mx_host_matches_the_policy(world):
    server = world.mx_host("mx.sts.test")
    world.publish("enforce", "mx.elsewhere.test", "*.mail.sts.test")
    settings = world.settings()
    status, code, text = reply_of(send(settings))
    assert (status, code) == (RecipientStatus.DEFERRED, "4.7.5")
    assert text.startswith("No MX host of sts.test (mx.sts.test) matches its MTA-STS policy (mode enforce")
    assert "mx: mx.elsewhere.test, *.mail.sts.test" in text
    assert server.connections == 0

    [made] = report(settings)
    [policy] = made["policies"]
    assert policy["summary"] == {"total-successful-session-count": 0, "total-failure-session-count": 1}
    assert policy["failure-details"] == [
        {
            "result-type": "validation-failure",
            "failed-session-count": 1,
            "failure-reason-code": "no MX host matches the policy's mx patterns: mx.sts.test",
        }
    ]


def test_enforce_defers_475_when_the_mx_host_offers_no_starttls(world):
    server = world.mx_host("mx.sts.test", tls=None)
    world.publish("enforce", "mx.sts.test")
    settings = world.settings()
    status, code, text = reply_of(send(settings))
    assert (status, code) == (RecipientStatus.DEFERRED, "4.7.5")
    assert "mx.sts.test does not offer STARTTLS" in text
    assert "MTA-STS policy (mode enforce) requires TLS with a certificate valid for mx.sts.test" in text
    assert server.messages == [] and "MAIL" not in server.verbs()

    [made] = report(settings)
    assert made["policies"][0]["failure-details"] == [
        {
            "result-type": "starttls-not-supported",
            "receiving-mx-hostname": "mx.sts.test",
            "receiving-ip": "127.0.0.1",
            "failed-session-count": 1,
            "failure-reason-code": "mx.sts.test does not offer STARTTLS",
        }
    ]


@pytest.mark.parametrize(
    ("tls", "result", "words"),
    [
        ("untrusted", "certificate-not-trusted", "unable to get local issuer certificate"),
        ("wrong_name", "certificate-host-mismatch", "Hostname mismatch"),
        ("expired", "certificate-expired", "certificate has expired"),
    ],
)
def test_enforce_defers_475_naming_what_is_wrong_with_the_certificate(world, tls, result, words):
    server = world.mx_host("mx.sts.test", tls=tls)
    world.publish("enforce", "mx.sts.test")
    settings = world.settings()
    status, code, text = reply_of(send(settings))
    assert (status, code) == (RecipientStatus.DEFERRED, "4.7.5")
    assert "the certificate of mx.sts.test is not valid" in text
    assert words in text
    assert f"({result}, RFC 8461 §4.2)" in text
    assert server.messages == []

    [detail] = report(settings)[0]["policies"][0]["failure-details"]
    assert (detail["result-type"], detail["receiving-mx-hostname"], detail["failed-session-count"]) == (
        result,
        "mx.sts.test",
        1,
    )


def test_enforce_passes_an_mx_host_with_a_bad_certificate_for_the_next_one(world):
    bad = world.mx_host("mx1.sts.test", tls="untrusted")
    good = world.mx_host("mx2.sts.test")
    world.publish("enforce", "*.sts.test")
    settings = world.settings()
    assert send(settings) is None
    assert (len(bad.messages), len(good.messages)) == (0, 1)
    [policy] = report(settings)[0]["policies"]
    assert policy["summary"] == {"total-successful-session-count": 1, "total-failure-session-count": 1}
    assert [d["receiving-mx-hostname"] for d in policy["failure-details"]] == ["mx1.sts.test"]


def test_a_follower_keeps_to_the_mx_hosts_and_the_tls_an_enforce_policy_allows(world):
    # The first MX host, which the policy does not name, is never used: neither by the
    # items that follow one another on mx2's connection (PIPELINING) nor by the one
    # whose primed session ended with a 421, which takes a new connection to mx2.
    excluded = world.mx_host("mx1.sts.test", tls=None)
    allowed = world.mx_host("mx2.sts.test")
    allowed.message_reply = ["250 2.0.0 Queued", "421 4.3.2 Shutting down", "250 2.0.0 Queued"]
    world.publish("enforce", "mx2.sts.test")
    settings = world.settings(DOMAIN_CONCURRENCY=1)
    with override_settings(BUMAIL_QUEUE=settings):
        items = [queue.enqueue(EmailMessage(f"Hi {n}", "Body", "me@sender.test", [RECIPIENT])) for n in range(4)]
        queue.deliver_due()
        left = [item for item in map(queue.get, [item.id for item in items]) if item is not None]

    assert excluded.connections == 0
    assert len(allowed.messages) == 3
    assert [item.recipients[0].reply.status for item in left] == ["4.3.2"]  # deferred by the 421
    assert allowed.connections == 2
    assert allowed.verbs().count("STARTTLS") == 2
    dots = {(m.connection, m.read) for m in allowed.messages}
    mails = [(c.connection, c.read) for c in allowed.commands if c.verb == "MAIL"]
    assert [mail in dots for mail in mails] == [False, True, False, False, True]  # the third: after the 421
    assert world.dns.queries.count((DOMAIN, "MX")) == 1  # the first item's: the others went on its hosts
    # Each verified session counted once, however many messages it carried.
    [policy] = report(settings)[0]["policies"]
    assert policy["summary"] == {"total-successful-session-count": 2, "total-failure-session-count": 0}


# -- testing and none -----------------------------------------------------------------------


def test_testing_delivers_despite_a_bad_certificate_and_reports_it(world):
    server = world.mx_host("mx.sts.test", tls="untrusted")
    world.publish("testing", "mx.sts.test")
    settings = world.settings()
    assert send(settings) is None
    assert len(server.messages) == 1
    [policy] = report(settings)[0]["policies"]
    assert policy["policy"]["policy-string"][1] == "mode: testing"
    assert policy["summary"] == {"total-successful-session-count": 0, "total-failure-session-count": 1}
    assert policy["failure-details"][0]["result-type"] == "certificate-not-trusted"


def test_testing_delivers_to_an_mx_host_the_policy_does_not_name_and_reports_it(world):
    server = world.mx_host("mx.sts.test", tls=None)
    world.publish("testing", "mx.elsewhere.test")
    settings = world.settings()
    assert send(settings) is None
    assert len(server.messages) == 1
    [detail] = report(settings)[0]["policies"][0]["failure-details"]
    assert (detail["result-type"], detail["failure-reason-code"]) == (
        "validation-failure",
        "mx.sts.test matches none of the policy's mx patterns",
    )


def test_none_is_no_policy_and_nothing_is_reported(world):
    server = world.mx_host("mx.sts.test", tls=None)
    world.publish("none")
    settings = world.settings()
    assert send(settings) is None
    assert len(server.messages) == 1
    assert report(settings) == []


def test_with_mta_sts_off_no_policy_is_looked_up(world):
    server = world.mx_host("mx.sts.test", tls=None)
    world.publish("enforce", "mx.elsewhere.test")
    settings = world.settings(MTA_STS=False)
    assert send(settings) is None
    assert len(server.messages) == 1
    assert ("_mta-sts.sts.test", "TXT") not in world.dns.queries
    assert world.policies.requests == []


def test_a_policy_that_cannot_be_fetched_is_reported_and_the_mail_goes(world):
    server = world.mx_host("mx.sts.test", tls=None)
    world.publish("enforce", "mx.sts.test")
    world.policies.responses[POLICY_HOST] = PolicyResponse(b"<html>", content_type="text/html")
    settings = world.settings()
    assert send(settings) is None
    assert len(server.messages) == 1
    [policy] = report(settings)[0]["policies"]
    assert policy["policy"] == {"policy-type": "no-policy-found", "policy-domain": "sts.test"}
    [detail] = policy["failure-details"]
    assert detail["result-type"] == "sts-policy-invalid"
    assert "is served as 'text/html', not 'text/plain'" in detail["failure-reason-code"]


# -- the policies kept for every worker ------------------------------------------------------


@pytest.fixture(params=["orm", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request) -> dict[str, Any]:
    """The ``BUMAIL_QUEUE`` keys of the store under test."""
    return {} if request.param == "orm" else request.getfixturevalue("redis_settings")


def test_a_second_worker_applies_the_kept_policy_without_fetching_it(world, store_settings):
    server = world.mx_host("mx.sts.test")
    world.publish("enforce", "mx.sts.test")
    settings = world.settings(**store_settings)
    assert send(settings) is None  # the first worker fetches
    assert send(settings) is None  # a worker of its own, with nothing in memory
    assert world.policies.count(POLICY_HOST) == 1
    assert len(server.messages) == 2
    with override_settings(BUMAIL_QUEUE=settings):
        kept = get_store().get_sts_policy(DOMAIN)
    assert (kept.id, kept.mode.value, kept.mx) == ("20260301", "enforce", ("mx.sts.test",))
    [policy] = report(settings)[0]["policies"]
    assert policy["summary"]["total-successful-session-count"] == 2


def test_a_policy_host_that_fails_is_asked_once_however_many_passes_run(world, store_settings):
    # Each pass (a delivery task, a cron run) is a worker of its own: the store keeps
    # the failed fetch for them all, for five minutes.
    server = world.mx_host("mx.sts.test", tls=None)
    world.publish("enforce", "mx.sts.test")
    world.policies.responses[POLICY_HOST] = PolicyResponse(b"down", status=503)
    settings = world.settings(**store_settings)
    for _ in range(5):
        assert send(settings) is None  # no policy could be had: the mail goes as without one
    assert world.policies.count(POLICY_HOST) == 1
    assert len(server.messages) == 5
    with override_settings(BUMAIL_QUEUE=settings):
        later = timezone.now() + timedelta(minutes=6)
        assert get_store().get_sts_failure(DOMAIN, "20260301", now=later) is None  # lapsed by then
        assert get_store().purge_sts(now=later) == 1


def test_a_changed_id_makes_the_next_worker_fetch_the_new_policy(world, store_settings):
    server = world.mx_host("mx.sts.test", tls=None)
    world.publish("testing", "mx.sts.test", policy_id="one")
    settings = world.settings(**store_settings)
    assert send(settings) is None
    world.publish("enforce", "mx.sts.test", policy_id="two")
    status, code, _ = reply_of(send(settings))
    assert (status, code) == (RecipientStatus.DEFERRED, "4.7.5")
    assert world.policies.count(POLICY_HOST) == 2
    assert len(server.messages) == 1


def test_an_enforce_policy_kept_outlives_its_txt_record_until_it_expires(world, store_settings):
    server = world.mx_host("mx.sts.test", tls=None)
    world.publish("enforce", "*.mail.sts.test", max_age=3600)
    settings = world.settings(**store_settings)
    start = timezone.now() + timedelta(seconds=1)  # after the enqueue: the item is due
    item = send(settings, now=start)
    assert reply_of(item)[:2] == (RecipientStatus.DEFERRED, "4.7.5")
    world.publish(None)  # the TXT record is gone
    with override_settings(BUMAIL_QUEUE=settings):
        queue.deliver_due(now=start + timedelta(minutes=59))  # a new worker: the store's policy holds
        assert reply_of(queue.get(item.id))[:2] == (RecipientStatus.DEFERRED, "4.7.5")
        assert server.messages == []
        queue.deliver_due(now=start + timedelta(hours=3))  # expired: no policy any more
        assert queue.get(item.id) is None
    assert len(server.messages) == 1
    assert world.policies.count(POLICY_HOST) == 1


def test_a_policy_host_that_dribbles_holds_no_delivery_thread_past_the_fetch_deadline(world, smtp_servers):
    # Two delivery threads, both needing sts.test's policy, whose host sends its answer
    # one byte every half second (a minute and more in all): the fetch ends at its
    # deadline, the thread waiting for it too, and the healthy domain's mail goes.
    import threading

    from django.db import connections

    from bumail_queue.conf import get_settings
    from bumail_queue.delivery.mta_sts import STSPolicies
    from bumail_queue.worker import Worker
    from tests.helpers import wait_until

    hostile_mx = world.mx_host("mx.sts.test", tls=None)
    world.publish("enforce", "mx.sts.test")
    world.policies.responses[POLICY_HOST] = PolicyResponse(policy_text("enforce", "mx.sts.test"), dribble=0.5)
    healthy = smtp_servers(host="127.0.0.9", port=hostile_mx.port)
    world.records["ok.test"] = {"MX": [(10, "mx.ok.test")]}
    world.records["mx.ok.test"] = {"A": [healthy.host]}
    world.dns.zone = DNSZone(world.records)

    with override_settings(BUMAIL_QUEUE=world.settings(CONCURRENCY=2, DOMAIN_CONCURRENCY=2)):
        for n in range(2):
            queue.enqueue(EmailMessage("Hi", "Body", "me@sender.test", [f"user{n}@sts.test"]))
        for n in range(3):
            queue.enqueue(EmailMessage("Hi", "Body", "me@sender.test", [f"user{n}@ok.test"]))
        settings = get_settings()
        policies = STSPolicies(
            cache=get_store(),
            nameservers=settings.dns_nameservers,
            https_port=settings.mta_sts_https_port,
            ca_file=settings.tls_ca_file,
            allowed_networks=settings.allowed_private_networks,
            clock=timezone.now,
            fetch_seconds=2.0,
        )
        worker = Worker(mta_sts=policies)

        def run() -> None:
            try:
                worker.run()
            finally:
                connections.close_all()  # this thread's own, as a worker process would at exit

        thread = threading.Thread(target=run)
        thread.start()
        try:
            assert wait_until(lambda: len(healthy.messages) == 3)
            # The policy could not be had: its domain's mail went as with no policy.
            assert wait_until(lambda: len(hostile_mx.messages) == 2)
        finally:
            worker.stop()
            thread.join(30)
        assert not thread.is_alive()  # stopped within its sessions' time, not the dribble's
    assert world.policies.count(POLICY_HOST) == 1
