"""Opening a session: the connection, the greeting, EHLO/HELO, STARTTLS and AUTH."""

from __future__ import annotations

import logging
import smtplib
import ssl
from collections.abc import Callable

from bumail_queue.conf import Route
from bumail_queue.delivery.envelope import Host, TLSSession
from bumail_queue.delivery.tlsrpt import certificate_failure
from bumail_queue.items import Reply
from bumail_queue.sts import STSMode, TLSResult

from .connection import _Connection, _Steps
from .failures import _connect_failure, _DeadlineError, _lost, _refused, _RouteRefusedError, _StepError, _timed_out
from .pool import _Key, _Session
from .replies import _own, _raw, reply_from
from .tls import _TLS, _Contexts, _Policy

# The package's logger: the name docs/delivery.md and docs/worker.md give.
logger = logging.getLogger(__package__)


class _Opener:
    """Opens sessions up to AUTH, saying ``hostname`` in EHLO/HELO."""

    def __init__(self, *, hostname: str, steps: _Steps, contexts: _Contexts, clock: Callable[[], float]) -> None:
        self._hostname = hostname
        self._clock = clock
        self._steps = steps
        self._contexts = contexts

    def open(
        self,
        host: Host,
        key: _Key,
        route: Route,
        item_id: str,
        deadline: float,
        *,
        starttls: bool,
        verify: bool | None = None,
        sessions: list[TLSSession] | None = None,
    ) -> _Session:
        """Open a session with ``host`` up to AUTH; raise ``_StepError`` to try the next host.

        ``starttls`` is ``False`` when an opportunistic handshake failed: the same host
        again, in plain text. ``verify`` is ``False`` when a certificate checked under
        an MTA-STS policy in ``testing`` failed: the same host again, TLS unverified
        (``None``: as the policy says). How the TLS of a session held to an MTA-STS
        policy ended is added to ``sessions``.
        """
        policy = key.policy
        verify = policy.verify if verify is None else verify
        conn = _Connection(
            local_hostname=self._hostname,
            host=host,
            clock=self._clock,
            on_connected=lambda: self._steps.arm(conn, "greeting", deadline, "waiting for the greeting"),
            implicit_tls=self._contexts.get(verify=policy.verify) if policy.tls is _TLS.IMPLICIT else None,
        )
        self._steps.arm(conn, "connect", deadline, "connecting")
        try:
            return self._open(
                conn, host, key, route, item_id, deadline, starttls=starttls, verify=verify, sessions=sessions
            )
        except _StepError as failure:
            failure.greeted, failure.tls = failure.greeted or conn.heard, conn.tls
            # A host that began its greeting is there, whatever ran out after that.
            failure.unreachable = failure.unreachable and not conn.heard
            raise

    def _open(
        self,
        conn: _Connection,
        host: Host,
        key: _Key,
        route: Route,
        item_id: str,
        deadline: float,
        *,
        starttls: bool,
        verify: bool,
        sessions: list[TLSSession] | None,
    ) -> _Session:
        policy = key.policy
        try:
            try:
                code, raw = conn.connect(host.name, host.port)
            except ssl.SSLError as error:
                raise _connect_failure(error, host) from None
            except (ValueError, OverflowError) as error:
                raise _refused(f"smtplib cannot connect to {host}: {error}", item_id) from None
            except OSError as error:
                raise _connect_failure(error, host) from None
            logger.debug("%s %s: greeting -> %s", item_id, host, code)
            if not 200 <= code < 300:
                self._steps.quit(conn)
                raise _StepError.of_reply(code, raw, when="as the greeting")
            self._hello(conn, host, item_id, deadline)
            tls_wanted = policy.tls in (_TLS.STARTTLS, _TLS.OPPORTUNISTIC) and starttls
            context = self._contexts.get(verify=verify) if tls_wanted else None
            reported = sessions if verify and policy.sts is not None else None
            if context is not None and not self._starttls(
                conn, host, route, policy, context, item_id, deadline, reported=reported
            ):
                conn.close()
                if verify and policy.sts is STSMode.TESTING:  # as without a policy: TLS, unverified
                    return self.open(host, key, route, item_id, deadline, starttls=True, verify=False)
                # an opportunistic handshake failed: again, without STARTTLS
                return self.open(host, key, route, item_id, deadline, starttls=False, verify=False)
            if policy.username is not None:
                self._login(conn, host, policy.username, route.password or "", item_id, deadline)
        except _StepError:
            conn.close()
            raise
        except _RouteRefusedError:
            self._steps.quit(conn)
            raise
        except smtplib.SMTPServerDisconnected as error:
            conn.close()
            raise _lost(error, host, "before MAIL") from None
        except smtplib.SMTPResponseException as error:
            conn.close()
            raise _StepError.protocol(-1, _raw(error), when="before MAIL") from None
        except OSError as error:
            conn.close()
            raise _lost(error, host, "before MAIL") from None
        except BaseException:
            conn.close()
            raise
        return _Session(conn=conn, host=host, key=key, opened=self._clock(), clean=True)

    def _hello(self, conn: _Connection, host: Host, item_id: str, deadline: float) -> None:
        """EHLO, or HELO when EHLO gets a 5xx reply."""
        self._steps.arm(conn, "greeting", deadline, "waiting for the reply to EHLO")
        try:
            code, raw = conn.ehlo(self._hostname)
        except ValueError as error:
            raise _refused(f"smtplib refused the EHLO host name {self._hostname!r}: {error}", item_id) from None
        logger.debug("%s %s: EHLO -> %s", item_id, host, code)
        if code == 250:
            return
        if not 500 <= code < 600:
            self._steps.quit(conn)
            raise _StepError.of_reply(code, raw, when="to EHLO")
        self._steps.arm(conn, "greeting", deadline, "waiting for the reply to HELO")
        code, raw = conn.helo(self._hostname)
        logger.debug("%s %s: HELO -> %s", item_id, host, code)
        if not 200 <= code < 300:
            self._steps.quit(conn)
            raise _StepError.of_reply(code, raw, when="to HELO")

    def _starttls(
        self,
        conn: _Connection,
        host: Host,
        route: Route,
        policy: _Policy,
        context: ssl.SSLContext,
        item_id: str,
        deadline: float,
        *,
        reported: list[TLSSession] | None = None,
    ) -> bool:
        """Upgrade to TLS when offered or required; return ``False`` when a handshake failed
        that may be tried again otherwise (opportunistic, or checked under MTA-STS ``testing``).

        Under an MTA-STS policy, ``reported`` gets how the TLS ended (RFC 8460), and
        ``enforce`` defers ``4.7.5`` for anything but STARTTLS with a valid certificate.
        """
        required = policy.tls is _TLS.STARTTLS
        if not conn.has_extn("starttls"):
            self._sts_failure(
                conn, host, policy, reported, TLSResult.STARTTLS_NOT_SUPPORTED, f"{host.name} does not offer STARTTLS"
            )
            if required:
                self._steps.quit(conn)
                text = f"TLS is required but {host} does not offer STARTTLS. {_tls_setting(route)}"
                raise _StepError(_own("4.7.0", text), answered=True)
            return True
        self._steps.arm(conn, "greeting", deadline, "waiting for the reply to STARTTLS")
        try:
            code, raw = conn.starttls(context=context)
        except (smtplib.SMTPServerDisconnected, _DeadlineError):
            raise
        except smtplib.SMTPResponseException as error:  # smtplib raises for any reply but 220
            code, raw = error.smtp_code, _raw(error)
        except (OSError, ValueError) as error:  # after the 220: the handshake
            logger.debug("%s %s: TLS handshake failed: %s", item_id, host, error)
            if not _timed_out(error):  # a timeout says nothing of the TLS the host offers
                result, why = _handshake_failure(error, host)
                self._sts_failure(conn, host, policy, reported, result, why, send_quit=False)
            if not required or policy.sts is STSMode.TESTING:
                return False
            if _timed_out(error):
                raise _StepError(_own("4.4.2", f"Timed out in the TLS handshake with {host}")) from None
            raise _StepError(_own("4.7.5", f"TLS handshake with {host} failed: {error}"), answered=True) from None
        logger.debug("%s %s: STARTTLS -> %s", item_id, host, code)
        conn.tls = code == 220
        if code != 220:
            refusal = reply_from(code, raw)
            self._sts_failure(
                conn,
                host,
                policy,
                reported,
                TLSResult.STARTTLS_NOT_SUPPORTED,
                f"{host.name} refused STARTTLS: {code} {refusal.text}",
            )
            if required:
                self._steps.quit(conn)
                text = f"TLS is required but {host} refused STARTTLS: {code} {refusal.text}. {_tls_setting(route)}"
                raise _StepError(_own("4.7.0", text), answered=True)
            return True  # opportunistic: go on in plain text
        if reported is not None:
            reported.append(TLSSession(host=host.name, address=host.address))
        self._steps.arm(conn, "greeting", deadline, "waiting for the reply to EHLO")
        code, raw = conn.ehlo(self._hostname)
        logger.debug("%s %s: EHLO -> %s", item_id, host, code)
        if code != 250:
            self._steps.quit(conn)
            raise _StepError.of_reply(code, raw, when="to EHLO after STARTTLS")
        return True

    def _sts_failure(
        self,
        conn: _Connection,
        host: Host,
        policy: _Policy,
        reported: list[TLSSession] | None,
        result: TLSResult,
        why: str,
        *,
        send_quit: bool = True,
    ) -> None:
        """Report a session's TLS that an MTA-STS policy would refuse; under ``enforce``,
        end the session: its recipients are deferred ``4.7.5`` (RFC 8461 §4.2)."""
        if reported is None:
            return
        reported.append(TLSSession(host=host.name, address=host.address, failure=result, reason=why))
        if policy.sts is not STSMode.ENFORCE:
            return
        if send_quit:  # not after a failed handshake: the connection is unusable
            self._steps.quit(conn)
        text = (
            f"Not delivered to {host}: {why}, and the recipient domain's MTA-STS policy (mode enforce) "
            f"requires TLS with a certificate valid for {host.name} ({result.value}, RFC 8461 §4.2)."
        )
        raise _StepError(_own("4.7.5", text), answered=True)

    def _login(
        self, conn: _Connection, host: Host, username: str, password: str, item_id: str, deadline: float
    ) -> None:
        self._steps.arm(conn, "greeting", deadline, "waiting for the reply to AUTH")
        # A server may echo what AUTH sent in its replies; none of it may be kept.
        conn.redact(username, password)
        try:
            code, _ = conn.login(username, password)
        except smtplib.SMTPAuthenticationError as error:
            logger.debug("%s %s: AUTH -> %s", item_id, host, error.smtp_code)
            self._steps.quit(conn)
            reply = reply_from(error.smtp_code, error.smtp_error)
            if 500 <= error.smtp_code < 600:
                # Wrong credentials: a configuration to fix, not a reason to lose mail.
                raise _StepError(Reply(code=reply.code, status="4.7.8", text=reply.text), answered=True) from None
            raise _StepError.of_reply(error.smtp_code, _raw(error), when="to AUTH") from None
        except smtplib.SMTPNotSupportedError:
            raise _refused(f"The route has a USERNAME but {host} does not offer AUTH here.", item_id) from None
        except (smtplib.SMTPServerDisconnected, smtplib.SMTPResponseException):
            raise
        except smtplib.SMTPException:
            raise _refused(
                f"{host} offers no AUTH mechanism smtplib can use (it knows CRAM-MD5, PLAIN, LOGIN).", item_id
            ) from None
        except ValueError:
            # Never the exception's text: it could quote a character of the password.
            raise _refused("smtplib cannot send the route's USERNAME or PASSWORD (not ASCII).", item_id) from None
        finally:
            conn.user = conn.password = ""  # smtplib keeps them on the object otherwise
        logger.debug("%s %s: AUTH -> %s", item_id, host, code)


def _handshake_failure(error: BaseException, host: Host) -> tuple[TLSResult, str]:
    """Return the RFC 8460 result type of a failed TLS handshake, and what failed."""
    certificate = certificate_failure(error)
    if certificate is not None:
        result, why = certificate
        return result, f"the certificate of {host.name} is not valid: {why}"
    return TLSResult.VALIDATION_FAILURE, f"the TLS handshake with {host.name} failed: {error}"


def _tls_setting(route: Route) -> str:
    """Say which setting asks for the TLS a server did not give, and what would change it."""
    if route.type == "smarthost":
        # The default "starttls" against a plain server (a local sink) is the usual mistake.
        return (
            "The route says 'TLS': 'starttls' (the default); a server that speaks TLS from the first "
            "byte needs 'TLS': 'implicit', and a local server without TLS (a development sink) 'TLS': 'none'."
        )
    return "The route says 'TLS_REQUIRED': True; without it, mail goes in plain text where STARTTLS is not offered."
