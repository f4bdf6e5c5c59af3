"""``DKIM`` and ``DKIM_UNSIGNED_ON_ERROR``: who signs, checked in shape (the keys themselves
are read by the system check ``bumail_queue.E024``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from .defaults import DEFAULTS
from .names import HOSTNAME, is_ip, normalise_domain
from .validator import Validator

DKIM_ALGORITHMS: Final = ("rsa-sha256", "ed25519-sha256")
_DKIM_KEYS: Final = frozenset({"DOMAIN", "SELECTOR", "KEY", "ALGORITHM"})


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DKIMSigner:
    """One ``DKIM`` entry: who signs (``d=``, ``s=``), with which key and algorithm.

    ``key`` is as written: a PEM, a path to a PEM file, or the dotted path of a
    callable that returns one; ``delivery.dkim`` reads it. It is never shown.
    """

    domain: str  # lowercase A-labels
    selector: str
    key: str = dataclasses.field(repr=False)
    algorithm: str = "rsa-sha256"


def check_dkim(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check the shape of ``DKIM`` and ``DKIM_UNSIGNED_ON_ERROR``; the keys themselves
    are read by the system check ``bumail_queue.E024``, as reading one may call code."""
    if not isinstance(raw.get("DKIM_UNSIGNED_ON_ERROR", False), bool):
        check.add(
            "bumail_queue.E023",
            "DKIM_UNSIGNED_ON_ERROR",
            f"BUMAIL_QUEUE['DKIM_UNSIGNED_ON_ERROR'] must be True or False; got {raw['DKIM_UNSIGNED_ON_ERROR']!r}.",
        )
    signers = raw.get("DKIM", DEFAULTS["DKIM"])
    if not isinstance(signers, list | tuple):
        check.add("bumail_queue.E023", "DKIM", f"BUMAIL_QUEUE['DKIM'] must be a list of signers; got {signers!r}.")
        return
    for index, signer in enumerate(signers):
        for problem in _dkim_signer_problems(signer):
            check.add("bumail_queue.E023", "DKIM", f"BUMAIL_QUEUE['DKIM'][{index}] {problem}.")


def _dkim_signer_problems(signer: Any) -> list[str]:
    if not isinstance(signer, Mapping):
        return [f"must be a dict with DOMAIN, SELECTOR, KEY and ALGORITHM; got {type(signer).__name__}"]
    problems = [f"has the unknown key {key!r}" for key in sorted(set(signer) - _DKIM_KEYS, key=repr)]
    problems += [f"needs {key!r}" for key in ("DOMAIN", "SELECTOR", "KEY") if key not in signer]
    domain, selector = signer.get("DOMAIN"), signer.get("SELECTOR")
    if "DOMAIN" in signer and not (isinstance(domain, str) and is_dkim_domain(domain)):
        problems.append(f"has a DOMAIN that is not a domain name such as 'example.com': {domain!r}")
    if "SELECTOR" in signer and not (
        isinstance(selector, str) and not selector.endswith(".") and HOSTNAME.fullmatch(selector)
    ):
        problems.append(f"has a SELECTOR that is not one or more DNS labels such as 's2026': {selector!r}")
    if "KEY" in signer and not (isinstance(signer["KEY"], str) and signer["KEY"].strip()):
        # Never the value: it may be the private key itself.
        problems.append("has a KEY that is not a PEM, a path to a PEM file or the dotted path of a callable")
    if signer.get("ALGORITHM", "rsa-sha256") not in DKIM_ALGORITHMS:
        problems.append(
            f"has the ALGORITHM {signer.get('ALGORITHM')!r}; it must be one of {', '.join(DKIM_ALGORITHMS)}"
        )
    return problems


def is_dkim_domain(domain: str) -> bool:
    name = normalise_domain(domain)
    return bool(HOSTNAME.fullmatch(name)) and "." in name.strip(".") and not is_ip(name)


def dkim_from(raw: Mapping[str, Any]) -> DKIMSigner:
    return DKIMSigner(
        domain=normalise_domain(raw["DOMAIN"]),
        selector=raw["SELECTOR"].lower(),
        key=raw["KEY"],
        algorithm=raw.get("ALGORITHM", "rsa-sha256"),
    )
