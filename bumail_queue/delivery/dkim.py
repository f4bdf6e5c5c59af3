"""DKIM signatures (RFC 6376; Ed25519, RFC 8463) on the message as it goes on the wire.

A message is signed at delivery, on the very octets the server gets: after any
re-encoding for a server without 8BITMIME or for a long line (``transfer_encoding``),
so nothing after the signature changes what it covers (dot-stuffing is undone by the
server before any verifier sees the message), and a key rotated in the settings signs
the mail already queued. Every signer whose ``DOMAIN`` is the ``From`` address's
domain, or a parent of it, adds its own ``DKIM-Signature``: two signers of one domain
dual-sign (RSA and Ed25519, or two selectors during a rotation).

dkimpy canonicalizes and signs (relaxed/relaxed); ``cryptography`` reads the keys,
whatever PEM form they are in, and says what they are (type and size) before dkimpy
is handed the form it takes. Both are the ``bumail_queue[dkim]`` extra (with PyNaCl,
which dkimpy signs Ed25519 with).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import email.policy
import email.utils
import logging
import re
import threading
from collections.abc import Callable, Sequence
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from bumail_queue.conf import DKIMSigner, normalise_domain

if TYPE_CHECKING:
    # dnspython is imported where a key's publication is checked (manage.py queue_dkim):
    # a worker that sends through a smarthost starts without it.
    import dns.resolver

__all__ = [
    "DKIMError",
    "DKIMKey",
    "Publication",
    "Signatures",
    "check_publication",
    "describe",
    "load_key",
    "public_key_record",
]

logger = logging.getLogger(__name__)

# RFC 6376 §5.4.1's header fields to sign, with the MIME fields that say how to read
# the body; each is signed as many times as it appears (dkimpy signs the instances
# from the bottom), and From once more ("oversigned", RFC 6376 §8.15): an added From
# breaks the signature, as DMARC's alignment rests on it.
SIGNED_FIELDS: tuple[bytes, ...] = (
    b"from", b"reply-to", b"subject", b"date", b"to", b"cc", b"resent-date", b"resent-from",
    b"resent-to", b"resent-cc", b"in-reply-to", b"references", b"list-id", b"list-help",
    b"list-unsubscribe", b"list-unsubscribe-post", b"list-subscribe", b"list-post", b"list-owner",
    b"list-archive", b"message-id", b"mime-version", b"content-type", b"content-transfer-encoding",
)  # fmt: skip
_OVERSIGNED = (b"from",)
# RFC 8301 §3.2: verifiers refuse RSA keys under 1,024 bits; 2,048 is what receivers
# ask of new keys.
MIN_RSA_BITS = 1024
ADVISED_RSA_BITS = 2048
_PEM_MARK = "-----BEGIN"
# What a KEY of base64 key data is written in, and a KEY that names a callable: a key
# holds no dot, so one taken for a dotted path is never echoed in an error.
_BASE64_TEXT = re.compile(r"[A-Za-z0-9+/=\s]+")
_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


class DKIMError(Exception):
    """A signer cannot sign: its key cannot be had, or is not what it must be.

    The text names the signer (domain, selector) and the reason, never the key.
    """


@dataclasses.dataclass(frozen=True, slots=True)
class DKIMKey:
    """A signer's key, read: what dkimpy signs with and what DNS must publish."""

    signer: DKIMSigner
    private: bytes = dataclasses.field(repr=False)  # PKCS#1 PEM (RSA) or the base64 seed (Ed25519)
    public: str  # the TXT record's p= (RFC 6376 §3.6.1, RFC 8463 §4.2)
    bits: int  # RSA's modulus size; 256 for Ed25519


def describe(signer: DKIMSigner) -> str:
    """Name a signer in messages: its ``d=``, ``s=`` and algorithm, never its key."""
    return f"{signer.domain} (selector {signer.selector}, {signer.algorithm})"


def load_key(signer: DKIMSigner) -> DKIMKey:
    """Read ``signer``'s key: a PEM, a PEM file's path, or a callable's dotted path.

    Raises :class:`DKIMError` saying what is wrong.
    """
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
    except ImportError as error:
        raise DKIMError("DKIM signing needs the dkim extra: pip install 'bumail_queue[dkim]'") from error
    pem = _pem_of(signer)
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as error:
        raise DKIMError(f"the KEY of {describe(signer)} is not an unencrypted PEM private key ({error})") from None
    if signer.algorithm == "rsa-sha256":
        if not isinstance(key, rsa.RSAPrivateKey):
            raise DKIMError(f"the KEY of {describe(signer)} is not an RSA key (it is {_kind(key)})")
        if key.key_size < MIN_RSA_BITS:
            raise DKIMError(
                f"the RSA KEY of {describe(signer)} has {key.key_size} bits; verifiers refuse keys under "
                f"{MIN_RSA_BITS} (RFC 8301)"
            )
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
        spki = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return DKIMKey(signer=signer, private=private, public=base64.b64encode(spki).decode(), bits=key.key_size)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise DKIMError(f"the KEY of {describe(signer)} is not an Ed25519 key (it is {_kind(key)})")
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    raw_public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return DKIMKey(
        signer=signer, private=base64.b64encode(seed), public=base64.b64encode(raw_public).decode(), bits=256
    )


def public_key_record(key: DKIMKey) -> str:
    """Return the TXT record to publish at ``<selector>._domainkey.<domain>``."""
    kind = "rsa" if key.signer.algorithm == "rsa-sha256" else "ed25519"
    return f"v=DKIM1; k={kind}; p={key.public}"


@dataclasses.dataclass(frozen=True, slots=True)
class Publication:
    """What the DNS publishes for a signer's selector, beside the key it signs with."""

    key: DKIMKey
    name: str  # <selector>._domainkey.<domain>
    matches: bool
    text: str


def check_publication(key: DKIMKey, resolver: dns.resolver.Resolver, *, timeout: float = 10.0) -> Publication:
    """Look ``key``'s selector up as verifiers do (a TXT record) and say whether it is ``key``."""
    name = f"{key.signer.selector}._domainkey.{key.signer.domain}"
    problem = _publication_problem(key, name, resolver, timeout)
    return Publication(key=key, name=name, matches=problem is None, text=problem or f"{name} publishes this key")


def _publication_problem(key: DKIMKey, name: str, resolver: dns.resolver.Resolver, timeout: float) -> str | None:
    import dns.exception
    import dns.resolver

    try:
        answer = resolver.resolve(name, "TXT", lifetime=timeout, search=False)
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return f"{name} has no TXT record; publish: {public_key_record(key)}"
    except dns.exception.DNSException as error:
        return f"the TXT lookup of {name} failed ({type(error).__name__}); try again"
    records = [_tags(b"".join(record.strings)) for record in answer]
    records = [tags for tags in records if tags.get(b"v", b"DKIM1") == b"DKIM1" and b"p" in tags]
    if len(records) != 1:
        return f"{name} has {len(records)} DKIM key records; verifiers need exactly one"
    published = b"".join(records[0][b"p"].split()).decode("ascii", "replace")
    kind = records[0].get(b"k", b"rsa").decode("ascii", "replace")
    wanted = "rsa" if key.signer.algorithm == "rsa-sha256" else "ed25519"
    if not published:
        return f"{name} says the key is revoked (an empty p=)"
    if kind != wanted:
        return f"{name} publishes a {kind} key, and the signer signs with {wanted}"
    if published != key.public:
        return f"{name} publishes another key than the signer's; publish: {public_key_record(key)}"
    return None


def _tags(text: bytes) -> dict[bytes, bytes]:
    import dkim.util

    try:
        return dict(dkim.util.parse_tag_value(text))
    except dkim.util.InvalidTagValueList:
        return {}


def _pem_of(signer: DKIMSigner) -> bytes:
    # No message below repeats the value: it may be the key itself, written wrongly.
    value = signer.key.strip()
    if value.startswith(_PEM_MARK):
        return value.encode("ascii", "replace")
    if _is_key_data(value):
        raise DKIMError(
            f"the KEY of {describe(signer)} is key data without its PEM lines: give the whole PEM, "
            "from its '-----BEGIN' line to its '-----END' line"
        )
    if "/" in value or "\\" in value or value.endswith((".pem", ".key")):
        try:
            return Path(value).read_bytes()
        except OSError as error:
            raise DKIMError(f"the KEY file of {describe(signer)} cannot be read: {error.strerror}") from None
    if not _DOTTED_PATH.fullmatch(value):
        raise DKIMError(
            f"the KEY of {describe(signer)} is neither a PEM, nor a file path (.pem, .key, or a '/'), "
            "nor the dotted path of a callable"
        )
    return _called(signer, value)


def _is_key_data(value: str) -> bool:
    """Whether ``value`` is the base64 body of a PEM (a DER structure: PKCS#1 or
    PKCS#8) or a raw Ed25519 seed, written without the PEM lines around it."""
    if not _BASE64_TEXT.fullmatch(value):
        return False
    try:
        data = base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(data) == 32 or _is_der_sequence(data)


def _is_der_sequence(data: bytes) -> bool:
    """Whether ``data`` is one whole DER SEQUENCE, as every private key's encoding is."""
    if len(data) < 4 or data[0] != 0x30:
        return False
    if data[1] < 0x80:
        return data[1] == len(data) - 2
    octets = data[1] - 0x80
    return 1 <= octets <= 2 and int.from_bytes(data[2 : 2 + octets], "big") == len(data) - 2 - octets


def _called(signer: DKIMSigner, path: str) -> bytes:
    try:
        source: Callable[[], Any] = import_string(path)
    except ImportError as error:
        raise DKIMError(
            f"the KEY of {describe(signer)} is neither a PEM nor a file path (.pem, .key, or a '/'), "
            f"and no callable {path!r} can be imported: {error}"
        ) from None
    try:
        pem = source()
    except Exception as error:  # a secrets manager's client may raise anything
        raise DKIMError(f"{path}() raised {type(error).__name__} for the KEY of {describe(signer)}") from None
    if isinstance(pem, str):
        return pem.encode("ascii", "replace")
    if isinstance(pem, bytes):
        return pem
    raise DKIMError(f"{path}() returned {type(pem).__name__} for the KEY of {describe(signer)}, not a PEM string")


def _kind(key: object) -> str:
    return type(key).__name__.removeprefix("_").replace("PrivateKey", "") or "unknown"


class Signatures:
    """Signs messages with the signers of their ``From`` domain.

    Keys are read when first needed and kept for the life of the worker; a key that
    could not be read is tried again at the next message, so a fixed file or a
    secrets manager that is back serves without a restart.
    """

    def __init__(self, signers: Sequence[DKIMSigner], *, unsigned_on_error: bool = False) -> None:
        self._signers = tuple(signers)
        self.unsigned_on_error = unsigned_on_error
        self._keys: dict[DKIMSigner, DKIMKey] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._signers)

    def sign(self, text: bytes) -> bytes:
        """Return ``text`` (CRLF lines) with a ``DKIM-Signature`` for each signer of its
        ``From`` domain before its header fields; ``text`` itself when none signs.

        Raises :class:`DKIMError` when a signer that should sign cannot.
        """
        signers = self._signers_of(text)
        if not signers:
            return text
        import dkim

        fields = _fields_to_sign(text)
        signatures: list[bytes] = []
        for signer in signers:
            key = self._key(signer)
            try:
                signatures.append(
                    dkim.DKIM(text, minkey=MIN_RSA_BITS).sign(
                        signer.selector.encode("ascii"),
                        signer.domain.encode("ascii"),
                        key.private,
                        signature_algorithm=signer.algorithm.encode("ascii"),
                        canonicalize=(b"relaxed", b"relaxed"),
                        include_headers=list(fields),
                    )
                )
            except dkim.DKIMException as error:
                raise DKIMError(f"dkimpy could not sign with {describe(signer)}: {error}") from None
        return b"".join(signatures) + text

    def _signers_of(self, text: bytes) -> list[DKIMSigner]:
        domain = _from_domain(text)
        if domain is None:
            return []
        return [s for s in self._signers if domain == s.domain or domain.endswith("." + s.domain)]

    def _key(self, signer: DKIMSigner) -> DKIMKey:
        with self._lock:
            key = self._keys.get(signer)
        if key is None:
            key = load_key(signer)  # outside the lock: a callable may take its time
            with self._lock:
                self._keys[signer] = key
        return key


def _header_block(text: bytes) -> bytes:
    end = text.find(b"\r\n\r\n")
    return text if end == -1 else text[: end + 2]


def _from_domain(text: bytes) -> str | None:
    """Return the domain of the ``From`` header field's first address, as A-labels."""
    head = BytesHeaderParser(policy=email.policy.compat32).parsebytes(_header_block(text))
    found = email.utils.getaddresses([str(value) for value in head.get_all("From", [])])
    address = next((addr for _, addr in found if "@" in addr), None)
    if address is None:
        return None
    return normalise_domain(address.rpartition("@")[2])


def _fields_to_sign(text: bytes) -> list[bytes]:
    names = [
        line.split(b":", 1)[0].strip().lower()
        for line in _header_block(text).split(b"\r\n")
        if line[:1] not in (b" ", b"\t", b"")
    ]
    present = [name for name in names if name in SIGNED_FIELDS]
    return [*present, *_OVERSIGNED]
