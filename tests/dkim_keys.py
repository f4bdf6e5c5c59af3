"""DKIM keys made for the tests, once per session: no key is kept in the repository."""

from __future__ import annotations

import dataclasses
import random

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

_PLAIN = serialization.NoEncryption()


@dataclasses.dataclass(frozen=True)
class TestKeys:
    __test__ = False  # not a test class, for pytest

    rsa_pem: str  # 2,048 bits, PKCS#1 ("BEGIN RSA PRIVATE KEY")
    rsa_pkcs8_pem: str  # the same key, PKCS#8 ("BEGIN PRIVATE KEY")
    rsa1024_pem: str
    rsa768_pem: str  # too short to sign with; cryptography makes none so short itself
    ed25519_pem: str
    encrypted_pem: str  # the 2,048-bit key under a passphrase

    @classmethod
    def make(cls) -> TestKeys:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return cls(
            rsa_pem=_pem(key, serialization.PrivateFormat.TraditionalOpenSSL),
            rsa_pkcs8_pem=_pem(key, serialization.PrivateFormat.PKCS8),
            rsa1024_pem=_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)),
            rsa768_pem=_pem(_short_rsa_key(768)),
            ed25519_pem=_pem(ed25519.Ed25519PrivateKey.generate()),
            encrypted_pem=key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"passphrase"),
            ).decode(),
        )


def _pem(key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey, form=serialization.PrivateFormat.PKCS8) -> str:
    return key.private_bytes(serialization.Encoding.PEM, form, _PLAIN).decode()


def _short_rsa_key(bits: int) -> rsa.RSAPrivateKey:
    """An RSA key of ``bits`` from two primes found here (Miller-Rabin), as real keys are made."""
    rng = random.Random(bits)
    e = 65537
    while True:
        p, q = _prime(bits // 2, rng), _prime(bits // 2, rng)
        phi = (p - 1) * (q - 1)
        if p != q and phi % e and (p * q).bit_length() == bits:
            break
    d = pow(e, -1, phi)
    public = rsa.RSAPublicNumbers(e, p * q)
    numbers = rsa.RSAPrivateNumbers(p, q, d, d % (p - 1), d % (q - 1), pow(q, -1, p), public)
    return numbers.private_key()


def _prime(bits: int, rng: random.Random) -> int:
    while True:
        candidate = rng.getrandbits(bits) | (1 << (bits - 1)) | (1 << (bits - 2)) | 1
        if _probably_prime(candidate, rng):
            return candidate


def _probably_prime(n: int, rng: random.Random, rounds: int = 32) -> bool:
    if n % 2 == 0 or any(n % p == 0 for p in (3, 5, 7, 11, 13, 17, 19, 23, 29, 31)):
        return n in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31)
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for _ in range(rounds):
        x = pow(rng.randrange(2, n - 1), d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def pem_body(pem: str, *, joined: bool = False) -> str:
    """The base64 between a PEM's ``-----BEGIN`` and ``-----END`` lines: a key written
    without them. ``joined``: on one line, as a secret store or an env var holds it."""
    lines = [line for line in pem.splitlines() if not line.startswith("-----")]
    return "".join(lines) if joined else "\n".join(lines)


def ed25519_pem_body(*, with_slash: bool) -> str:
    """A new Ed25519 key's PEM body with, or without, a '/' in it (about a third have none)."""
    while True:
        body = pem_body(_pem(ed25519.Ed25519PrivateKey.generate()), joined=True)
        if ("/" in body) == with_slash:
            return body


def shows_key_text(text: str, key: str) -> bool:
    """Whether any 12 characters in a row of ``key`` (its spaces aside) appear in ``text``."""
    compact = "".join(key.split())
    return any(compact[i : i + 12] in text for i in range(len(compact) - 11))
