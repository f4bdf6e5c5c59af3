"""The TLS policy of a route, and the SSL contexts that carry it out."""

from __future__ import annotations

import dataclasses
import enum
import ssl
import threading

from bumail_queue.conf import Route
from bumail_queue.sts import STSMode

from .failures import RouteOptionError


class _TLS(enum.Enum):
    NONE = "none"
    OPPORTUNISTIC = "opportunistic"
    STARTTLS = "starttls"
    IMPLICIT = "implicit"


@dataclasses.dataclass(frozen=True, slots=True)
class _Policy:
    """How to talk to a host: TLS, whether its certificate is verified, who logs in,
    and the MTA-STS mode the TLS is held to (its sessions are reported, RFC 8460)."""

    tls: _TLS
    verify: bool
    username: str | None
    sts: STSMode | None = None


def _policy_of(route: Route, item_id: str) -> _Policy:
    if route.type == "mx":
        if route.mta_sts is STSMode.ENFORCE:
            # RFC 8461 §4.2: STARTTLS, and a certificate valid for the MX host's name.
            return _Policy(_TLS.STARTTLS, verify=True, username=None, sts=STSMode.ENFORCE)
        tls = _TLS.STARTTLS if route.tls_required else _TLS.OPPORTUNISTIC
        if route.mta_sts is STSMode.TESTING:
            # Checked as under enforce; what fails is reported and the session goes on as without.
            return _Policy(tls, verify=True, username=None, sts=STSMode.TESTING)
        # Between MTAs: STARTTLS whenever offered, the certificate unchecked (RFC 7435).
        return _Policy(tls, verify=False, username=None)
    if route.type != "smarthost":
        raise RouteOptionError(f"The route's type {route.type!r} is not 'mx' or 'smarthost'.", item_id=item_id)
    modes = {"starttls": _TLS.STARTTLS, "implicit": _TLS.IMPLICIT, "none": _TLS.NONE}
    if route.tls not in modes:
        raise RouteOptionError(
            f"The route's TLS {route.tls!r} is not 'starttls', 'implicit' or 'none'.", item_id=item_id
        )
    if (route.username is None) != (route.password is None):
        raise RouteOptionError("The route needs both a USERNAME and a PASSWORD for AUTH, or neither.", item_id=item_id)
    return _Policy(modes[route.tls], verify=route.tls_verify, username=route.username)


def _unverified_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class _Contexts:
    """The SSL contexts of a transport: one that verifies certificates, one that does not.

    The verifying one trusts ``ca_file`` (``TLS_CA_FILE``), or the system's trusted
    certificates when it is ``None``. Each is made when a session first needs it:
    loading CA certificates is costly, and a worker relaying in plain text never
    needs them.
    """

    def __init__(self, verifying: ssl.SSLContext | None, *, ca_file: str | None = None) -> None:
        self._contexts: dict[bool, ssl.SSLContext] = {} if verifying is None else {True: verifying}
        self._ca_file = ca_file
        self._lock = threading.Lock()

    def get(self, *, verify: bool) -> ssl.SSLContext:
        with self._lock:
            context = self._contexts.get(verify)
            if context is None:
                context = self._contexts[verify] = (
                    ssl.create_default_context(cafile=self._ca_file) if verify else _unverified_context()
                )
            return context
