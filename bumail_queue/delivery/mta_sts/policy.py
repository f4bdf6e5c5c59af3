"""MTA-STS policies as values: the TXT record's id and the policy's text parsed
(RFC 8461 §3.1, §3.2), why a policy could not be had, and what one does to a delivery."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from datetime import date, datetime

from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import Host, TLSSession
from bumail_queue.items import Outcome, RecipientStatus, Reply
from bumail_queue.sts import MAX_AGE_LIMIT, MAX_MX_PATTERNS, STSMode, STSPolicy, TLSResult, TLSSessionCount

# RFC 8461 §3.1: "v=STSv1; id=<1 to 32 letters or digits>;", extensions allowed.
_TXT_ID = re.compile(r"[A-Za-z0-9]{1,32}")
_TXT_FIELD = re.compile(r"([A-Za-z0-9_.-]{1,32})=([\x21-\x3a\x3c\x3e-\x7e]+)")
# RFC 8461 §3.2: a policy field is "name: value", the name letters, digits, "_", "-", ".".
_POLICY_FIELD = re.compile(r"([A-Za-z0-9_.-]{1,32})[ \t]*:[ \t]*(.*?)[ \t]*")
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_MX_PATTERN = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})+")
_MAX_AGE = re.compile(r"[0-9]{1,10}")


class PolicyError(Exception):
    """A policy could not be had: ``result`` is its RFC 8460 result type, the text why."""

    def __init__(self, result: TLSResult, text: str) -> None:
        super().__init__(text)
        self.result = result
        self.text = text


def parse_txt(texts: Sequence[str]) -> str | None:
    """Return the policy id that ``_mta-sts`` TXT records announce, or ``None`` for none.

    RFC 8461 §3.1: records not starting ``v=STSv1`` are set aside; exactly one must
    remain, and it must be valid, or the domain announces no policy.
    """
    records = [text for text in texts if text.startswith("v=STSv1")]
    if len(records) != 1:
        return None
    fields = [field.strip(" \t") for field in records[0].split(";")]
    if fields and not fields[-1]:
        fields.pop()  # the optional ";" at the end
    if not fields or fields[0] != "v=STSv1":
        return None
    policy_id = None
    for field in fields[1:]:
        match = _TXT_FIELD.fullmatch(field)
        if match is None:
            return None
        if match[1] == "id":
            if policy_id is not None or not _TXT_ID.fullmatch(match[2]):
                return None
            policy_id = match[2]
    return policy_id


def parse_policy(text: str, *, domain: str, policy_id: str, fetched_at: datetime) -> STSPolicy:
    """Return the policy ``text`` states (RFC 8461 §3.2); raise ``PolicyError`` (``sts-policy-invalid``).

    Lines end in LF or CRLF; fields it does not know are ignored (extensions), as
    RFC 8461 asks; ``version``, ``mode`` and ``max_age`` appear once each, and ``mx``
    at least once unless the mode is ``none``.
    """
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _POLICY_FIELD.fullmatch(line)
        if match is None:
            raise _invalid(f"the line {line[:80]!r} is not 'name: value'")
        fields.setdefault(match[1], []).append(match[2])
    version, mode_text, max_age_text = (_single(fields, name) for name in ("version", "mode", "max_age"))
    if version != "STSv1":
        raise _invalid(f"its version is {version!r}, not 'STSv1'")
    if mode_text not in {m.value for m in STSMode}:
        raise _invalid(f"its mode is {mode_text!r}, not 'enforce', 'testing' or 'none'")
    if not _MAX_AGE.fullmatch(max_age_text) or int(max_age_text) > MAX_AGE_LIMIT:
        raise _invalid(f"its max_age is {max_age_text!r}, not a number of seconds up to {MAX_AGE_LIMIT}")
    mode = STSMode(mode_text)
    patterns = tuple(dict.fromkeys(pattern.lower().rstrip(".") for pattern in fields.get("mx", [])))
    for pattern in patterns:
        if not _MX_PATTERN.fullmatch(pattern):
            raise _invalid(f"the mx {pattern!r} is neither a host name nor '*.' and a domain")
    if len(patterns) > MAX_MX_PATTERNS:
        raise _invalid(f"it has {len(patterns)} mx patterns, more than the {MAX_MX_PATTERNS} a policy may have here")
    if not patterns and mode is not STSMode.NONE:
        raise _invalid(f"it names no mx, which the mode {mode.value!r} needs")
    return STSPolicy(
        domain=domain, id=policy_id, mode=mode, mx=patterns, max_age=int(max_age_text), fetched_at=fetched_at
    )


def _single(fields: dict[str, list[str]], name: str) -> str:
    values = fields.get(name, [])
    if len(values) != 1:
        raise _invalid(f"it has {'no' if not values else len(values)} '{name}' field{'s' if values else ''}")
    return values[0]


def _invalid(why: str) -> PolicyError:
    return PolicyError(TLSResult.STS_POLICY_INVALID, f"The MTA-STS policy is not valid: {why}")


def _fetch_error(why: str) -> PolicyError:
    return PolicyError(TLSResult.STS_POLICY_FETCH_ERROR, why)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AppliedPolicy:
    """What MTA-STS says about delivering to ``domain`` now.

    ``policy`` is the policy in force, if any. When the domain announced a policy
    that could not be had (and none kept applies), ``policy`` is ``None`` and
    ``failure`` says why, with the TXT record's ``txt_id``: the mail goes as without
    a policy, and the report counts the failure.
    """

    domain: str
    policy: STSPolicy | None = None
    txt_id: str = ""
    failure: TLSResult | None = None
    reason: str = ""

    @property
    def mode(self) -> STSMode | None:
        """Return ``enforce`` or ``testing`` when the policy asks something of the delivery."""
        if self.policy is None or self.policy.mode is STSMode.NONE:
            return None
        return self.policy.mode

    def route(self, route: Route) -> Route:
        """Return ``route`` carrying the policy's mode to the transport."""
        mode = self.mode
        return route if mode is None else dataclasses.replace(route, mta_sts=mode)

    def hosts(self, hosts: Sequence[Host]) -> tuple[Host, ...]:
        """Return the MX hosts the policy lets the mail go to, in order: under
        ``enforce``, those its ``mx`` patterns match; otherwise all of them."""
        if self.mode is not STSMode.ENFORCE or self.policy is None:
            return tuple(hosts)
        return tuple(host for host in hosts if self.policy.allows(host.name))

    def refusal(self, hosts: Sequence[Host]) -> Outcome:
        """Return the outcome of recipients whose every MX host the policy excludes (``4.7.5``)."""
        assert self.policy is not None
        names = ", ".join(dict.fromkeys(host.name for host in hosts))
        text = (
            f"No MX host of {self.domain} ({names}) matches its MTA-STS policy (mode enforce, "
            f"mx: {', '.join(self.policy.mx)}, policy id {self.policy.id}): not delivered until one does "
            "or the policy changes (RFC 8461 §4.1)."
        )
        return Outcome(status=RecipientStatus.DEFERRED, reply=Reply(code=None, status="4.7.5", text=text))

    def counts(
        self, day: date, sessions: Sequence[TLSSession], *, excluded: Sequence[Host] = ()
    ) -> list[TLSSessionCount]:
        """Return the TLS report's counts for one delivery: each session opened under
        the policy, or the one failure that kept the policy (or every MX host) from use."""
        if self.failure is not None:
            return [
                TLSSessionCount(
                    day=day,
                    domain=self.domain,
                    policy_id=self.txt_id,
                    policy=(),
                    result=self.failure,
                    reason=self.reason,
                )
            ]
        policy = self.policy
        if policy is None or self.mode is None:
            return []
        base = TLSSessionCount(day=day, domain=self.domain, policy_id=policy.id, policy=policy.lines(), result=None)
        counted = []
        if excluded:
            names = ", ".join(dict.fromkeys(host.name for host in excluded))
            reason = f"no MX host matches the policy's mx patterns: {names}"
            counted.append(dataclasses.replace(base, result=TLSResult.VALIDATION_FAILURE, reason=reason))
        for session in sessions:
            result, reason = session.failure, session.reason
            if not policy.allows(session.host):  # testing: the policy would not have let it be used
                result, reason = (
                    TLSResult.VALIDATION_FAILURE,
                    f"{session.host} matches none of the policy's mx patterns",
                )
            if result is None:
                counted.append(base)
            else:
                counted.append(
                    dataclasses.replace(
                        base, result=result, mx_host=session.host, address=session.address or "", reason=reason
                    )
                )
        return counted
