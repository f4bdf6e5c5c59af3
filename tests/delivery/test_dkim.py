"""DKIM signatures as receivers check them: every message that reaches a loopback SMTP
server is verified by dkimpy's verifier against the key the loopback DNS server
publishes, whatever happened to it on the way (7-bit conversion, dot-stuffing)."""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable, Iterator

import dkim
import dns.resolver
import pytest
from django.core.mail import EmailMessage, send_mail
from django.test import override_settings

from bumail_queue import queue
from bumail_queue.conf import DKIMSigner, Route
from bumail_queue.delivery.dkim import DKIMError, Signatures, load_key, public_key_record
from bumail_queue.delivery.dns import make_resolver
from bumail_queue.delivery.smtp import SMTPTransport
from bumail_queue.items import RecipientStatus
from tests.dkim_keys import TestKeys, ed25519_pem_body, pem_body, shows_key_text
from tests.helpers import as_wire_bytes, envelope, mx, only_reply, smarthost, use_queue_backend
from tests.servers.dns import DNSZone, LoopbackDNSServer
from tests.servers.smtp import SMTPTestServer

DELIVERED, DEFERRED = RecipientStatus.DELIVERED, RecipientStatus.DEFERRED
MX = Route(type="mx")
Servers = Callable[..., SMTPTestServer]

MESSAGE = (
    b"From: News <news@example.com>\r\nTo: ann@example.org\r\nSubject: Hello\r\n"
    b"Date: Tue, 01 Dec 2026 10:00:00 +0000\r\nMessage-ID: <1@example.com>\r\n\r\nHello, Ann.\r\n"
)


def rsa_signer(keys: TestKeys, selector: str = "rsa1", domain: str = "example.com") -> DKIMSigner:
    return DKIMSigner(domain=domain, selector=selector, key=keys.rsa_pem, algorithm="rsa-sha256")


def ed_signer(keys: TestKeys, selector: str = "ed1", domain: str = "example.com") -> DKIMSigner:
    return DKIMSigner(domain=domain, selector=selector, key=keys.ed25519_pem, algorithm="ed25519-sha256")


def retired_signer(keys: TestKeys) -> DKIMSigner:
    """The key a rotation retires: another key, under a selector of its own."""
    return DKIMSigner(domain="example.com", selector="old2025", key=keys.rsa1024_pem, algorithm="rsa-sha256")


@pytest.fixture
def published(dns_server: LoopbackDNSServer, dkim_keys: TestKeys) -> LoopbackDNSServer:
    """The loopback DNS server, publishing the test keys' TXT records."""
    records = {
        f"{signer.selector}._domainkey.{signer.domain}": {"TXT": [public_key_record(load_key(signer))]}
        for signer in (
            rsa_signer(dkim_keys),
            ed_signer(dkim_keys),
            rsa_signer(dkim_keys, "rsa2"),
            retired_signer(dkim_keys),
        )
    }
    dns_server.zone = DNSZone(records)
    return dns_server


def txt_lookup(server: LoopbackDNSServer) -> Callable[..., bytes]:
    """dkimpy's ``dnsfunc``: the TXT record of a name, asked of the loopback server."""
    resolver = make_resolver(server.nameservers)

    def lookup(name: bytes, timeout: float = 5) -> bytes:
        try:
            answer = resolver.resolve(name.decode().rstrip("."), "TXT", lifetime=timeout)
        except dns.exception.DNSException:
            return b""
        return b"".join(b"".join(record.strings) for record in answer)

    return lookup


def signatures_of(data: bytes) -> list[dict[bytes, bytes]]:
    found = []
    for name, value in dkim.rfc822_parse(data)[0]:
        if name.lower() == b"dkim-signature":
            found.append(dkim.parse_tag_value(value))
    return found


def verified(data: bytes, server: LoopbackDNSServer) -> list[bool]:
    """Return, for each DKIM-Signature of ``data`` in order, whether it verifies."""
    lookup = txt_lookup(server)
    return [_verifies(data, index, lookup) for index in range(len(signatures_of(data)))]


def _verifies(data: bytes, index: int, lookup: Callable[..., bytes]) -> bool:
    try:
        return bool(dkim.DKIM(data).verify(idx=index, dnsfunc=lookup))
    except dkim.DKIMException:  # a body hash that does not match, say
        return False


@pytest.fixture
def signing(transports: Callable[..., SMTPTransport]) -> Callable[..., SMTPTransport]:
    def make(*signers: DKIMSigner, unsigned_on_error: bool = False) -> SMTPTransport:
        return transports(dkim=Signatures(signers, unsigned_on_error=unsigned_on_error))

    return make


def deliver(transport: SMTPTransport, server: SMTPTestServer, message: bytes = MESSAGE):
    return transport.deliver(envelope(message=message), route=MX, hosts=[mx(server)])


def received(server: SMTPTestServer) -> bytes:
    assert len(server.messages) == 1
    return server.messages[0].data


# -- signing -------------------------------------------------------------------------------


def test_a_signed_message_verifies_against_the_published_key(smtp_server, published, signing, dkim_keys: TestKeys):
    transport = signing(rsa_signer(dkim_keys))

    assert only_reply(deliver(transport, smtp_server))[0] is DELIVERED

    data = received(smtp_server)
    assert verified(data, published) == [True]
    (tags,) = signatures_of(data)
    assert (tags[b"d"], tags[b"s"], tags[b"a"], tags[b"c"]) == (
        b"example.com",
        b"rsa1",
        b"rsa-sha256",
        b"relaxed/relaxed",
    )
    signed = [name.strip() for name in tags[b"h"].split(b":")]
    assert signed.count(b"from") == 2  # oversigned: an added From breaks it
    assert {b"to", b"subject", b"date", b"message-id"} <= set(signed)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b"Hello, Ann.", b"Hello, Bob."),
        (b"Subject: Hello", b"Subject: Hullo"),
        (b"From: News", b"From: Evil <evil@example.net>\r\nFrom: News"),
    ],
    ids=["body", "subject", "an-added-from"],
)
def test_a_changed_message_fails_verification(smtp_server, published, signing, dkim_keys: TestKeys, before, after):
    deliver(signing(rsa_signer(dkim_keys)), smtp_server)
    data = received(smtp_server)

    assert verified(data.replace(before, after, 1), published) == [False]


def test_two_signers_of_one_domain_dual_sign(smtp_server, published, signing, dkim_keys: TestKeys):
    transport = signing(rsa_signer(dkim_keys), ed_signer(dkim_keys))

    deliver(transport, smtp_server)

    data = received(smtp_server)
    assert sorted(t[b"a"] for t in signatures_of(data)) == [b"ed25519-sha256", b"rsa-sha256"]
    assert verified(data, published) == [True, True]


def test_during_a_key_rotation_both_selectors_sign_and_each_verifies(smtp_server, published, signing, dkim_keys):
    deliver(signing(retired_signer(dkim_keys), rsa_signer(dkim_keys)), smtp_server)

    data = received(smtp_server)
    assert sorted(t[b"s"] for t in signatures_of(data)) == [b"old2025", b"rsa1"]
    assert verified(data, published) == [True, True]


def test_a_message_with_bare_line_feeds_is_signed_as_it_is_sent(smtp_server, published, signing, dkim_keys):
    deliver(signing(rsa_signer(dkim_keys)), smtp_server, MESSAGE.replace(b"\r\n", b"\n"))

    data = received(smtp_server)
    assert b"\r\nSubject: Hello\r\n" in data
    assert verified(data, published) == [True]


def test_signatures_survive_the_7bit_conversion_for_a_server_without_8bitmime(
    smtp_servers: Servers, published, signing, dkim_keys: TestKeys
):
    server = smtp_servers(eightbitmime=False)
    message = EmailMessage(
        "Grüße", "Grüße aus Köln.\n.Ein Punkt am Zeilenanfang.\n", "news@example.com", ["ann@example.org"]
    )
    raw = as_wire_bytes(message.message())
    assert b"Content-Transfer-Encoding: 8bit" in raw

    deliver(signing(rsa_signer(dkim_keys), ed_signer(dkim_keys)), server, raw)

    data = received(server)
    assert data.isascii()
    assert b"quoted-printable" in data
    assert verified(data, published) == [True, True]


def test_a_long_line_and_leading_dots_leave_the_signature_valid(smtp_server, published, signing, dkim_keys: TestKeys):
    message = MESSAGE.replace(b"Hello, Ann.\r\n", b"." * 3 + b"\r\n" + b"y" * 2000 + b"\r\n.\r\n")

    deliver(signing(rsa_signer(dkim_keys)), smtp_server, message)

    assert verified(received(smtp_server), published) == [True]


def test_a_parent_domains_signer_signs_a_subdomain_and_no_other(smtp_servers: Servers, published, signing, dkim_keys):
    transport = signing(rsa_signer(dkim_keys))
    sub, other = smtp_servers(), smtp_servers()

    deliver(transport, sub, MESSAGE.replace(b"news@example.com", b"news@mail.example.com"))
    deliver(transport, other, MESSAGE.replace(b"news@example.com", b"news@notexample.com"))

    assert [t[b"d"] for t in signatures_of(received(sub))] == [b"example.com"]
    assert verified(received(sub), published) == [True]
    assert signatures_of(received(other)) == []


# -- keys ----------------------------------------------------------------------------------


def key_from_a_callable() -> str:
    return CALLABLE_KEY[0]


CALLABLE_KEY: list[str] = []


@pytest.mark.parametrize("form", ["pem", "pkcs8-pem", "path", "callable"])
def test_a_key_is_read_from_a_pem_a_path_or_a_callable(
    form, tmp_path, smtp_server, published, signing, dkim_keys: TestKeys, monkeypatch
):
    if form == "pem":
        key = dkim_keys.rsa_pem
    elif form == "pkcs8-pem":
        key = dkim_keys.rsa_pkcs8_pem
    elif form == "path":
        (tmp_path / "dkim.pem").write_text(dkim_keys.rsa_pem)
        key = str(tmp_path / "dkim.pem")
    else:
        monkeypatch.setattr(f"{__name__}.CALLABLE_KEY", [dkim_keys.rsa_pem])
        key = f"{__name__}.key_from_a_callable"

    deliver(signing(DKIMSigner(domain="example.com", selector="rsa1", key=key)), smtp_server)

    assert verified(received(smtp_server), published) == [True]


def failing_key() -> str:
    raise ConnectionError("the secrets manager is down: token=hunter2")


def test_a_signer_that_fails_defers_the_message_and_sends_nothing(smtp_server, signing, caplog):
    signer = DKIMSigner(domain="example.com", selector="rsa1", key=f"{__name__}.failing_key")

    with caplog.at_level(logging.ERROR, logger="bumail_queue"):
        status, code, enhanced, text = only_reply(deliver(signing(signer), smtp_server))

    assert (status, code, enhanced) == (DEFERRED, None, "4.3.5")
    assert "DKIM signing failed" in text
    assert "raised ConnectionError for the KEY of example.com (selector rsa1, rsa-sha256)" in text
    assert "hunter2" not in text and "hunter2" not in caplog.text
    assert "DATA" not in smtp_server.verbs()
    assert "DKIM signing failed, the message waits" in caplog.text


def test_where_the_setting_says_so_a_failing_signer_sends_unsigned(smtp_server, signing, caplog):
    signer = DKIMSigner(domain="example.com", selector="rsa1", key=f"{__name__}.failing_key")

    with caplog.at_level(logging.WARNING, logger="bumail_queue"):
        delivery = deliver(signing(signer, unsigned_on_error=True), smtp_server)

    assert only_reply(delivery)[0] is DELIVERED
    assert signatures_of(received(smtp_server)) == []
    assert "sent unsigned (DKIM_UNSIGNED_ON_ERROR)" in caplog.text


def test_a_key_that_failed_is_read_again_for_the_next_message(
    smtp_servers: Servers, published, signing, dkim_keys, monkeypatch
):
    monkeypatch.setattr(f"{__name__}.CALLABLE_KEY", ["not a key"])
    transport = signing(DKIMSigner(domain="example.com", selector="rsa1", key=f"{__name__}.key_from_a_callable"))
    first, second = smtp_servers(), smtp_servers()

    assert only_reply(deliver(transport, first))[2] == "4.3.5"
    CALLABLE_KEY[0] = dkim_keys.rsa_pem
    assert only_reply(deliver(transport, second))[0] is DELIVERED

    assert verified(received(second), published) == [True]


@pytest.mark.parametrize(
    ("algorithm", "key_attr", "expected"),
    [
        ("rsa-sha256", "ed25519_pem", "is not an RSA key (it is Ed25519)"),
        ("ed25519-sha256", "rsa_pem", "is not an Ed25519 key (it is RSA)"),
        ("rsa-sha256", "rsa768_pem", "has 768 bits; verifiers refuse keys under 1024"),
        ("rsa-sha256", "encrypted_pem", "is not an unencrypted PEM private key"),
    ],
)
def test_a_key_that_is_not_what_the_algorithm_needs_is_refused(dkim_keys: TestKeys, algorithm, key_attr, expected):
    signer = DKIMSigner(domain="example.com", selector="s", key=getattr(dkim_keys, key_attr), algorithm=algorithm)

    with pytest.raises(DKIMError) as refused:
        load_key(signer)

    assert expected in str(refused.value)
    assert "PRIVATE KEY" not in str(refused.value)


def key_without_pem_lines(dkim_keys: TestKeys, form: str) -> tuple[str, str]:
    """A KEY of base64 key data, and the algorithm it is for."""
    if form == "ed25519, no '/'":
        return ed25519_pem_body(with_slash=False), "ed25519-sha256"
    if form == "ed25519, a '/'":
        return ed25519_pem_body(with_slash=True), "ed25519-sha256"
    if form == "ed25519 seed":
        return base64.b64encode(os.urandom(32)).decode(), "ed25519-sha256"
    if form == "rsa pkcs8, its lines":
        return pem_body(dkim_keys.rsa_pkcs8_pem), "rsa-sha256"
    return pem_body(dkim_keys.rsa_pem, joined=True), "rsa-sha256"


KEY_DATA_FORMS = ["ed25519, no '/'", "ed25519, a '/'", "ed25519 seed", "rsa pkcs8, its lines", "rsa pkcs1, one line"]


@pytest.mark.parametrize("form", KEY_DATA_FORMS)
def test_key_data_without_its_pem_lines_is_named_so_and_never_repeated(dkim_keys: TestKeys, form):
    key, algorithm = key_without_pem_lines(dkim_keys, form)
    signer = DKIMSigner(domain="example.com", selector="s", key=key, algorithm=algorithm)

    with pytest.raises(DKIMError) as refused:
        load_key(signer)

    assert "is key data without its PEM lines" in str(refused.value)
    assert not shows_key_text(str(refused.value), key)


def test_a_key_that_is_nothing_known_is_refused_without_being_repeated():
    signer = DKIMSigner(domain="example.com", selector="s", key="k3y: not-a-pem, not a path!")

    with pytest.raises(DKIMError) as refused:
        load_key(signer)

    assert "is neither a PEM, nor a file path" in str(refused.value)
    assert "k3y" not in str(refused.value)


def test_a_signer_with_key_data_defers_its_mail_and_no_reply_or_log_line_holds_the_key(smtp_server, signing, caplog):
    key = ed25519_pem_body(with_slash=False)
    signer = DKIMSigner(domain="example.com", selector="ed1", key=key, algorithm="ed25519-sha256")

    with caplog.at_level(logging.DEBUG, logger="bumail_queue"):
        status, code, enhanced, text = only_reply(deliver(signing(signer), smtp_server))

    assert (status, code, enhanced) == (DEFERRED, None, "4.3.5")
    assert "without its PEM lines" in text
    # The reply is what the delivery log, the admin and a delay DSN quote.
    assert not shows_key_text(text, key)
    assert not shows_key_text(caplog.text, key)
    assert "DATA" not in smtp_server.verbs()


# -- through the queue ---------------------------------------------------------------------


@pytest.fixture
def dkim_settings(dkim_keys: TestKeys) -> Iterator[list[dict[str, str]]]:
    yield [
        {"DOMAIN": "example.com", "SELECTOR": "rsa1", "KEY": dkim_keys.rsa_pem},
        {"DOMAIN": "example.com", "SELECTOR": "ed1", "KEY": dkim_keys.ed25519_pem, "ALGORITHM": "ed25519-sha256"},
    ]


@pytest.mark.django_db(transaction=True)
def test_send_mail_arrives_signed_by_every_signer_of_its_domain(smtp_server, published, dkim_settings):
    with override_settings(BUMAIL_QUEUE=smarthost(smtp_server, DKIM=dkim_settings)), use_queue_backend():
        send_mail("Hello", "Hello, Ann.", "news@example.com", ["ann@example.org"])
        assert queue.deliver_due().delivered == 1

    assert verified(received(smtp_server), published) == [True, True]


# -- manage.py queue_dkim: is the key published? ------------------------------------------


def run_queue_dkim(*args: str) -> tuple[int, str]:
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = StringIO()
    try:
        call_command("queue_dkim", *args, stdout=out)
    except CommandError as error:
        return error.returncode, out.getvalue() + str(error)
    return 0, out.getvalue()


def test_queue_dkim_says_each_published_key_matches(published, dkim_settings):
    with override_settings(BUMAIL_QUEUE={"DKIM": dkim_settings, "DNS_NAMESERVERS": [published.setting]}):
        status, out = run_queue_dkim()

    assert status == 0
    assert "example.com (selector rsa1, rsa-sha256): ok: rsa1._domainkey.example.com publishes this key." in out
    assert "example.com (selector ed1, ed25519-sha256): ok: ed1._domainkey.example.com publishes this key." in out


def test_queue_dkim_says_what_is_missing_or_different_and_exits_1(published, dkim_keys: TestKeys):
    signers = [
        {"DOMAIN": "example.com", "SELECTOR": "rsa2", "KEY": dkim_keys.rsa1024_pem},  # rsa2 publishes the other key
        {"DOMAIN": "example.com", "SELECTOR": "nokey", "KEY": dkim_keys.rsa_pem},
        {"DOMAIN": "example.com", "SELECTOR": "rsa1", "KEY": dkim_keys.ed25519_pem, "ALGORITHM": "ed25519-sha256"},
    ]
    with override_settings(BUMAIL_QUEUE={"DKIM": signers, "DNS_NAMESERVERS": [published.setting]}):
        status, out = run_queue_dkim()

    assert status == 1
    assert "selector rsa2, rsa-sha256): NOT PUBLISHED: rsa2._domainkey.example.com publishes another key" in out
    assert "nokey._domainkey.example.com has no TXT record; publish: v=DKIM1; k=rsa; p=" in out
    assert "rsa1._domainkey.example.com publishes a rsa key, and the signer signs with ed25519" in out
    assert "3 of 3 DKIM signers would not verify." in out


def test_queue_dkim_records_prints_what_to_publish(dkim_keys: TestKeys):
    signer = {"DOMAIN": "example.com", "SELECTOR": "ed1", "KEY": dkim_keys.ed25519_pem, "ALGORITHM": "ed25519-sha256"}
    with override_settings(BUMAIL_QUEUE={"DKIM": [signer]}):
        status, out = run_queue_dkim("--records")

    key = load_key(ed_signer(dkim_keys))
    assert (status, out.strip()) == (0, f'ed1._domainkey.example.com TXT "v=DKIM1; k=ed25519; p={key.public}"')


def test_queue_dkim_without_signers_says_so():
    with override_settings(BUMAIL_QUEUE={}):
        status, out = run_queue_dkim()
    assert status == 1
    assert "names no signer" in out
