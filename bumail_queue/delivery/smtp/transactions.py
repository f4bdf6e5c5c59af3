"""The mail transactions of an open session: MAIL, RCPT, DATA and the message, pipelined
when the server offers it (RFC 2920), until every recipient has an outcome."""

from __future__ import annotations

import dataclasses
import logging
import re
import smtplib
from collections.abc import Callable
from typing import TypeVar

from bumail_queue.addresses import envelope_form, needs_smtputf8
from bumail_queue.delivery.dkim import DKIMError, Signatures
from bumail_queue.delivery.envelope import Envelope, Host
from bumail_queue.delivery.transfer_encoding import UnconvertibleError, needs_conversion, seven_bit_safe
from bumail_queue.items import Outcome, RecipientStatus, Reply

from .connection import _Steps
from .failures import _lost, _OutOfStepError, _StaleConnectionError, _StepError
from .pool import _Session
from .replies import _outcome, _own, _status_of

# The package's logger: the name docs/delivery.md and docs/worker.md give.
logger = logging.getLogger(__package__)

#: RFC 3461 §4.4: an ENVID of at most 100 characters.
_ENVID_LIMIT = 100

#: How much of the message is sent under one ``data_block`` timeout.
BLOCK_SIZE = 64 * 1024

_LINE_END = re.compile(rb"\r\n|\r|\n")
# The end of the header block (RFC 5322 §2.1): the first empty line.
_HEADER_END = re.compile(rb"\r?\n\r?\n|\r\r")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, slots=True)
class _Message:
    """The message as it goes on the wire after DATA, and what MAIL says about it."""

    data: bytes  # CRLF lines, dot-stuffed, ending with CRLF "." CRLF
    text: bytes = dataclasses.field(repr=False)  # the CRLF lines before stuffing: the stored bytes, most often
    size: int  # RFC 1870: CRLF lines, before dot-stuffing
    eight_bit: bool
    utf8_headers: bool  # RFC 6532 header fields: they travel only with SMTPUTF8
    long_lines: bool  # a line over 998 octets, which must be re-encoded for any server

    @classmethod
    def of(cls, message: bytes) -> _Message:
        text = _crlf(message)
        # A stored message is nearly always CRLF already, with no line starting with
        # "."; counting is far cheaper than the substitution, so it runs only when needed.
        stuffed = _LEADING_DOT.sub(b"..", text) if text.startswith(b".") or b"\n." in text else text
        eight_bit = not message.isascii()
        return cls(
            data=stuffed + b".\r\n",
            text=text,
            size=len(text),
            eight_bit=eight_bit,
            utf8_headers=eight_bit and _utf8_headers(message),
            long_lines=needs_conversion(text, eight_bit=True),
        )

    def text_for(self, *, eight_bit: bool, utf8_headers: bool) -> bytes:
        """Return the text re-encoded for a server that does or does not take 8-bit
        content (8BITMIME) and UTF-8 header fields (SMTPUTF8); ``self.text`` when it fits.

        Raises ``UnconvertibleError`` when a header field stands in the way.
        """
        if not self.long_lines and (eight_bit or not self.eight_bit):
            return self.text
        return seven_bit_safe(self.text, eight_bit=eight_bit, utf8_headers=utf8_headers)

    def with_text(self, text: bytes) -> _Message:
        """Return the message that sends ``text`` instead: itself when ``text`` is its own."""
        return self if text is self.text else _Message.of(text)


def _crlf(message: bytes) -> bytes:
    """Return ``message`` with every line ending in CRLF, the last one included."""
    crlf = message.count(b"\r\n")
    text = message if message.count(b"\r") == message.count(b"\n") == crlf else _LINE_END.sub(b"\r\n", message)
    if text and not text.endswith(b"\r\n"):
        text += b"\r\n"
    return text


def _utf8_headers(message: bytes) -> bool:
    """Return whether the header block of ``message`` holds 8-bit octets (RFC 6532 §3).

    An 8-bit body is 8BITMIME's business (RFC 6152), not SMTPUTF8's.
    """
    end = _HEADER_END.search(message)
    return not message[: end.start() if end else len(message)].isascii()


def _failed(reply: Reply) -> Outcome:
    return Outcome(status=RecipientStatus.FAILED, reply=reply)


def _size_refusal(session: _Session, message: _Message) -> Reply | None:
    """Return why ``message`` is larger than the server's SIZE (RFC 1870), if it is."""
    limit = session.conn.esmtp_features.get("size", "").strip()
    if limit.isdigit() and 0 < int(limit) < message.size:
        return _own(
            "5.3.4", f"The message ({message.size} bytes) is larger than {session.host} takes ({int(limit)} bytes)"
        )
    return None


def _path(address: str) -> str:
    """Return the reverse- or forward-path of ``address``: its domain as A-labels."""
    return f"<{envelope_form(address)}>"


@dataclasses.dataclass(frozen=True, slots=True)
class _Arguments:
    """What MAIL says, and what each RCPT says, in one envelope's transactions."""

    mail: str  # "FROM:<sender> SIZE=... ..."
    dsn: bool  # the server offers DSN (RFC 3461)
    null_sender: bool

    def rcpt(self, recipient: str) -> str:
        """Return RCPT's argument for ``recipient``: its path, and RFC 3461's parameters where offered."""
        path = _path(recipient)
        if not self.dsn:
            return f"TO:{path}"
        # The worker reports failures and delays itself; a server further on should
        # too, and never about a report (RFC 3461 §5.2 / RFC 3464 §2: no DSN of a DSN).
        notify = "NEVER" if self.null_sender else "FAILURE,DELAY"
        original = path[1:-1]
        # ORCPT's rfc822 type is ASCII only (RFC 3461 §4.2); RFC 6533's UTF-8 form
        # is for SMTPUTF8 transactions, and a missing ORCPT is no error.
        orcpt = f" ORCPT=rfc822;{_xtext(original)}" if original.isascii() else ""
        return f"TO:{path} NOTIFY={notify}{orcpt}"


def _dsn_mail_parameters(item_id: str) -> list[str]:
    """Return MAIL's RFC 3461 parameters: headers only in a bounce, and the item's id.

    ``ENVID`` comes back in every DSN a server further on sends (RFC 3464
    ``Original-Envelope-Id``), so a bounce can be matched to its item; ``RET=HDRS``
    because the sender needs the headers to match a bounce, not the whole message back.
    """
    envid = _xtext(item_id)
    return ["RET=HDRS", f"ENVID={envid}"] if len(envid) <= _ENVID_LIMIT else ["RET=HDRS"]


def _xtext(text: str) -> str:
    """Return ``text`` as RFC 3461 §4 xtext: "+", "=" and what is not printable ASCII as "+XX"."""
    return "".join(c if "!" <= c <= "~" and c not in "+=" else "".join(f"+{b:02X}" for b in c.encode()) for c in text)


@dataclasses.dataclass(slots=True)
class _Plan:
    """One envelope's transactions on one session, worked out before any command goes.

    ``outcomes`` holds what is decided, before a command (a refused SMTPUTF8 or SIZE)
    and as the replies come; ``todo`` the recipients the first transaction names.
    """

    item_id: str
    message: _Message  # as this server is to get it: re-encoded, signed
    args: _Arguments
    smtputf8: bool
    todo: list[str]
    outcomes: dict[str, Outcome]

    @property
    def encoding(self) -> str:
        """How the commands are written: UTF-8 only in an SMTPUTF8 transaction."""
        return "utf-8" if self.smtputf8 else "ascii"


@dataclasses.dataclass(frozen=True, slots=True)
class _Opening:
    """The commands that open a pipelined transaction: ``[RSET] MAIL RCPT... DATA``,
    and the recipients whose ``RCPT`` is among them, in order."""

    data: bytes
    sent: list[str]
    reset: bool


#: Called as the final dot of a session's last transaction is about to go: the commands
#: to send with it (the next transaction's, RFC 2920 §3.1), or ``None``.
_Follow = Callable[[], bytes | None]


class _Transactions:
    """Runs the transactions of an envelope on an open session, each step armed by ``steps``."""

    def __init__(self, steps: _Steps, signatures: Signatures | None = None) -> None:
        self._steps = steps
        self._signatures = signatures if signatures else None

    def plan(
        self, session: _Session, envelope: Envelope, message: _Message, pending: list[str], outcomes: dict[str, Outcome]
    ) -> _Plan:
        """Work out ``envelope``'s transactions for ``session``'s server, deciding in
        ``outcomes`` what cannot go to it: nothing is sent."""
        conn = session.conn
        utf8 = conn.has_extn("smtputf8")
        if not utf8:
            self._refuse_utf8(session.host, envelope, message, pending, outcomes)
        todo = [r for r in pending if r not in outcomes]
        if todo:
            message, refusal = self._fit(session, envelope.item_id, message, utf8=utf8)
            if refusal is not None:
                outcomes.update((r, refusal) for r in todo)
                todo = []
        options = []
        if conn.has_extn("size"):
            options.append(f"SIZE={message.size}")
        if message.eight_bit and conn.has_extn("8bitmime"):
            options.append("BODY=8BITMIME")
        # RFC 6531 §3.4: SMTPUTF8 when a local part or a header field is UTF-8.
        smtputf8 = utf8 and (message.utf8_headers or needs_smtputf8(envelope.sender) or any(map(needs_smtputf8, todo)))
        if smtputf8:
            options.append("SMTPUTF8")
        dsn = conn.has_extn("dsn")
        if dsn:
            options += _dsn_mail_parameters(envelope.item_id)
        args = _Arguments(
            mail=f"FROM:{_path(envelope.sender)}" + "".join(f" {o}" for o in options),
            dsn=dsn,
            null_sender=not envelope.sender,
        )
        return _Plan(
            item_id=envelope.item_id, message=message, args=args, smtputf8=smtputf8, todo=todo, outcomes=outcomes
        )

    def run(
        self,
        session: _Session,
        plan: _Plan,
        deadline: float,
        *,
        follow: _Follow | None = None,
        opened: _Opening | None = None,
    ) -> None:
        """Run ``plan``'s transactions until every recipient has an outcome.

        ``follow`` gives the commands to send with the last transaction's final dot
        (pipelining servers only). ``opened``: the first transaction's commands went
        already, with the previous delivery's final dot; its replies are read first.
        """
        if session.pipelining:
            todo = plan.todo
            while todo:
                todo = self._pipelined(session, plan, todo, deadline, follow=follow, opened=opened)
                opened = None
            return
        conn, item_id, todo = session.conn, plan.item_id, plan.todo
        while todo:
            if not session.clean:
                self._rset(session, item_id, deadline)
            # smtplib writes commands in ASCII unless told; no RSET need come between two
            # transactions now, so each one says which it is.
            conn.command_encoding = plan.encoding
            session.clean = False
            try:
                code, raw = self._first_reply(
                    session, lambda: self._command(session, item_id, "mail", deadline, "MAIL", plan.args.mail)
                )
            except ValueError as error:  # refused by smtplib, nothing was sent
                reply = _own("5.1.7", f"smtplib refused the sender address: {error}")
                plan.outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in todo)
                return
            if not 200 <= code < 300:
                outcome = _outcome(code, raw, names_recipient=False)  # a reply to MAIL FROM
                plan.outcomes.update((r, outcome) for r in todo)
                return
            todo = self._recipients(session, plan, todo, deadline)

    def opening(self, plan: _Plan, todo: list[str], *, reset: bool) -> _Opening | None:
        """Return the commands that open a pipelined transaction for ``todo``, deciding in
        ``plan.outcomes`` the addresses that cannot be written; ``None`` when no ``RCPT`` is left."""
        try:
            group = [f"MAIL {plan.args.mail}\r\n".encode(plan.encoding)]
        except UnicodeEncodeError as error:
            reply = _own("5.1.7", f"smtplib refused the sender address: {error}")
            plan.outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in todo)
            return None
        sent: list[str] = []
        for recipient in todo:
            try:
                group.append(f"RCPT {plan.args.rcpt(recipient)}\r\n".encode(plan.encoding))
            except UnicodeEncodeError as error:
                reply = _own("5.1.3", f"smtplib refused the recipient address: {error}")
                plan.outcomes[recipient] = Outcome(status=RecipientStatus.FAILED, reply=reply)
                continue
            sent.append(recipient)
        if not sent:
            return None
        if reset:
            group.insert(0, b"RSET\r\n")
        group.append(b"DATA\r\n")
        return _Opening(data=b"".join(group), sent=sent, reset=reset)

    def _fit(
        self, session: _Session, item_id: str, message: _Message, *, utf8: bool
    ) -> tuple[_Message, Outcome | None]:
        """Return the message as ``session``'s server is to get it, signed, or why it cannot go.

        The size is checked before any re-encoding as well as after: a message too
        large as it is stored is refused without the cost of converting it. The DKIM
        signatures go on last, over the octets that are sent.
        """
        conn = session.conn
        eight_bit = conn.has_extn("8bitmime")
        refusal = _size_refusal(session, message)
        if refusal is not None:
            return message, _failed(refusal)
        try:
            text = message.text_for(eight_bit=eight_bit, utf8_headers=utf8)
        except UnconvertibleError as error:
            why = " (it does not offer 8BITMIME)" if message.eight_bit and not eight_bit else ""
            return message, _failed(
                _own("5.6.3", f"The message cannot be re-encoded for {session.host}{why}: {error}.")
            )
        if self._signatures is not None:
            try:
                text = self._signatures.sign(text)
            except DKIMError as error:
                if not self._signatures.unsigned_on_error:
                    logger.error("%s: DKIM signing failed, the message waits: %s", item_id, error)
                    reply = _own("4.3.5", f"DKIM signing failed: {error}. The message waits; it is not sent unsigned.")
                    return message, Outcome(status=RecipientStatus.DEFERRED, reply=reply)
                logger.warning("%s: DKIM signing failed, sent unsigned (DKIM_UNSIGNED_ON_ERROR): %s", item_id, error)
        # Stuffed once, whatever re-encoding and signing did to the text.
        fitted = message.with_text(text)
        refusal = None if fitted is message else _size_refusal(session, fitted)
        return fitted, None if refusal is None else _failed(refusal)

    @staticmethod
    def _refuse_utf8(
        host: Host, envelope: Envelope, message: _Message, pending: list[str], outcomes: dict[str, Outcome]
    ) -> None:
        """Fail what cannot go to ``host``, which does not offer SMTPUTF8 (RFC 6531 §3.2):
        everything when the header fields or the sender's local part are UTF-8, else
        the recipients whose local part is."""
        if message.utf8_headers:
            why = f"The message's header fields are UTF-8 and the server does not offer SMTPUTF8 ({host})"
            unsendable = pending
        else:
            why = f"{host} does not offer SMTPUTF8, which this address's non-ASCII local part needs"
            unsendable = pending if needs_smtputf8(envelope.sender) else [r for r in pending if needs_smtputf8(r)]
        reply = _own("5.6.7", why)
        outcomes.update((r, Outcome(status=RecipientStatus.FAILED, reply=reply)) for r in unsendable)

    @staticmethod
    def _first_reply(session: _Session, read: Callable[[], _T]) -> _T:
        """Read the first reply of a session's transaction: on a session taken from the
        pool or handed on, one that does not come (the server closed the connection,
        said 421 or nothing) means the server had gone before anything was decided."""
        try:
            reply = read()
        except (OSError, smtplib.SMTPException, _StepError) as error:
            if session.reused:
                raise _StaleConnectionError from error
            raise
        session.reused = False
        return reply

    def _command(
        self, session: _Session, item_id: str, step: str, deadline: float, verb: str, args: str = ""
    ) -> tuple[int, bytes]:
        """Send ``verb`` and read its reply, the two within one step."""
        self._in_step(session, f"a reply came before {verb} was sent")
        self._steps.arm(session.conn, step, deadline, f"waiting for the reply to {verb}")
        session.conn.putcmd(verb, args)
        return self._reply(session, item_id, step, deadline, verb, args, armed=True)

    def _reply(
        self,
        session: _Session,
        item_id: str,
        step: str,
        deadline: float,
        verb: str,
        args: str = "",
        *,
        armed: bool = False,
    ) -> tuple[int, bytes]:
        """Read the reply to ``verb``, sent already; a 421 or a malformed reply raises."""
        if not armed:
            self._steps.arm(session.conn, step, deadline, f"waiting for the reply to {verb}")
        code, raw = session.conn.getreply()
        logger.debug("%s %s: %s -> %s", item_id, session.host, f"{verb} {args}".rstrip(), code)
        if code == 421:
            raise _StepError.of_reply(code, raw, when=f"to {verb}")
        if _status_of(code) is None and not (verb == "DATA" and code == 354):
            raise _StepError.protocol(code, raw, when=f"to {verb}")
        return code, raw

    @staticmethod
    def _in_step(session: _Session, what: str) -> None:
        """Check that nothing was said while no reply is outstanding: a reply then came
        before what it answers was sent, or is one reply too many (RFC 2920 §3.1)."""
        if session.conn.unread():
            raise _OutOfStepError(session.host, what)

    def _rset_reply(self, session: _Session, item_id: str, deadline: float) -> None:
        """Read the reply to an ``RSET`` sent already; anything but 2xx raises."""
        code, raw = self._reply(session, item_id, "mail", deadline, "RSET")
        if not 200 <= code < 300:
            raise _StepError.of_reply(code, raw, when="to RSET")
        session.clean = True

    def _pipelined(
        self,
        session: _Session,
        plan: _Plan,
        todo: list[str],
        deadline: float,
        *,
        follow: _Follow | None,
        opened: _Opening | None,
    ) -> list[str]:
        """One transaction with RFC 2920 pipelining: ``[RSET] MAIL RCPT... DATA`` in one
        write (or sent already: ``opened``), their replies read in order, then the
        message; return the recipients left for another transaction (after a 452)."""
        conn, item_id = session.conn, plan.item_id
        if opened is None:
            opened = self.opening(plan, todo, reset=not session.clean)
            if opened is None:
                return []
            self._in_step(session, "a reply came before MAIL was sent")
            self._steps.arm(conn, "mail", deadline, "sending MAIL")
            try:
                conn.send(opened.data)
            except (OSError, smtplib.SMTPException) as error:
                if session.reused:
                    raise _StaleConnectionError from error
                raise
            session.clean = False
        if opened.reset:
            self._first_reply(session, lambda: self._rset_reply(session, item_id, deadline))
            session.clean = False  # MAIL went with it
        mail_code, mail_raw = self._first_reply(
            session, lambda: self._reply(session, item_id, "mail", deadline, "MAIL", plan.args.mail)
        )
        mail_taken = 200 <= mail_code < 300
        accepted: list[str] = []
        left: list[str] = []
        refused: dict[str, Outcome] = {}
        too_many: Outcome | None = None
        for recipient in opened.sent:
            code, raw = self._reply(session, item_id, "rcpt", deadline, "RCPT", plan.args.rcpt(recipient))
            if not mail_taken:
                # Refused after a refused MAIL: the MAIL reply decides. Accepted, it
                # answers another command: the replies are one place off.
                if 200 <= code < 300:
                    raise _OutOfStepError(session.host, f"{code} to RCPT after {mail_code} to MAIL")
                continue
            if code == 452:
                too_many = _outcome(code, raw)
                left.append(recipient)
            elif 200 <= code < 300:
                accepted.append(recipient)
            else:
                refused[recipient] = _outcome(code, raw)
        code, raw = self._reply(session, item_id, "data", deadline, "DATA")
        self._check_data_reply(session, code)
        # Every reply of the group came in its place: now they decide.
        plan.outcomes.update(refused)
        if not mail_taken:
            outcome = _outcome(mail_code, mail_raw, names_recipient=False)  # a reply to MAIL FROM
            plan.outcomes.update((r, outcome) for r in opened.sent)
            left = []
        elif too_many is not None and left == opened.sent:
            # Not one recipient was decided: another transaction would get the same.
            plan.outcomes.update((r, too_many) for r in left)
            left = []
        # Only the last transaction's dot may carry the next delivery's commands.
        self._after_data(session, plan, code, raw, accepted, deadline, follow=None if left else follow)
        return left

    def _after_data(
        self,
        session: _Session,
        plan: _Plan,
        code: int,
        raw: bytes,
        accepted: list[str],
        deadline: float,
        *,
        follow: _Follow | None = None,
    ) -> None:
        """Act on the reply to DATA: send the message after a 354, else it decides ``accepted``."""
        self._check_data_reply(session, code)
        if code == 354:
            if accepted:
                self._send_message(session, plan, accepted, deadline, follow=follow)
            else:
                self._end_empty_data(session, plan.item_id, deadline)
        else:
            outcome = _outcome(code, raw, names_recipient=len(accepted) == 1)
            plan.outcomes.update((r, outcome) for r in accepted)

    @staticmethod
    def _check_data_reply(session: _Session, code: int) -> None:
        """A 2xx cannot answer DATA: it is the reply to another command, one place off."""
        if 200 <= code < 300:
            raise _OutOfStepError(session.host, f"{code} to DATA")

    def _end_empty_data(self, session: _Session, item_id: str, deadline: float) -> None:
        # DATA went with the recipients, every one was refused, and yet the server
        # said 354: end the message at once; no recipient takes it (RFC 2920 §3.1).
        self._in_step(session, "a reply came before the message was ended")
        self._steps.arm(session.conn, "data_block", deadline, "ending an empty message")
        session.conn.send(b".\r\n")
        self._reply(session, item_id, "data_end", deadline, "DATA (empty)")
        session.clean = True

    def _recipients(self, session: _Session, plan: _Plan, todo: list[str], deadline: float) -> list[str]:
        """RCPT each of ``todo`` then DATA, in the open transaction; return the recipients left for another."""
        item_id = plan.item_id
        accepted: list[str] = []
        left: list[str] = []
        too_many: Outcome | None = None
        for index, recipient in enumerate(todo):
            try:
                code, raw = self._command(session, item_id, "rcpt", deadline, "RCPT", plan.args.rcpt(recipient))
            except ValueError as error:  # refused by smtplib, nothing was sent
                reply = _own("5.1.3", f"smtplib refused the recipient address: {error}")
                plan.outcomes[recipient] = Outcome(status=RecipientStatus.FAILED, reply=reply)
                continue
            if code == 452:
                too_many = _outcome(code, raw)
                left = todo[index:]
                break
            if 200 <= code < 300:
                accepted.append(recipient)
            else:
                plan.outcomes[recipient] = _outcome(code, raw)
        if too_many is not None and left == todo:
            # Not one recipient was decided: another transaction would get the same.
            plan.outcomes.update((r, too_many) for r in left)
            left = []
        if accepted:
            code, raw = self._command(session, item_id, "data", deadline, "DATA")
            self._after_data(session, plan, code, raw, accepted, deadline)
        elif not left:
            self._rset(session, item_id, deadline)  # no DATA: close the transaction at once
        return left

    def _rset(self, session: _Session, item_id: str, deadline: float) -> None:
        self._in_step(session, "a reply came before RSET was sent")
        self._steps.arm(session.conn, "mail", deadline, "waiting for the reply to RSET")
        session.conn.putcmd("RSET")
        self._rset_reply(session, item_id, deadline)

    def _send_message(
        self, session: _Session, plan: _Plan, accepted: list[str], deadline: float, *, follow: _Follow | None
    ) -> None:
        """Send the message after a 354; its reply decides every accepted recipient.

        With ``follow``, what it gives goes in the same write as the final dot: the
        next transaction's commands (RFC 2920 §3.1 lets the message open a group).
        """
        conn, item_id, message = session.conn, plan.item_id, plan.message
        view = memoryview(message.data)
        followed = False
        for start in range(0, len(view), BLOCK_SIZE):
            block: bytes | memoryview = view[start : start + BLOCK_SIZE]
            last = start + BLOCK_SIZE >= len(view)
            if start == 0 or last:
                # No reply is outstanding until the final dot: one now is early, such as
                # a 250 sent before the message it would accept.
                self._in_step(session, "a reply came before the message was sent")
            if follow is not None and last and (commands := follow()) is not None:
                block, followed = bytes(block) + commands, True
            self._steps.arm(conn, "data_block", deadline, "sending the message")
            try:
                conn.send(block)
            except smtplib.SMTPServerDisconnected as error:
                raise _lost(error, session.host, "while sending the message") from None
        self._steps.arm(conn, "data_end", deadline, "waiting for the reply to the message")
        try:
            code, raw = conn.getreply()
        except smtplib.SMTPServerDisconnected as error:
            raise _lost(error, session.host, "waiting for the reply to the message") from None
        logger.debug("%s %s: message of %s bytes -> %s", item_id, session.host, message.size, code)
        if _status_of(code) is None:
            raise _StepError.protocol(code, raw, when="to the message")
        # One reply for every accepted recipient: about one of them only if there is one.
        outcome = _outcome(code, raw, names_recipient=len(accepted) == 1)
        plan.outcomes.update((r, outcome) for r in accepted)
        if code == 421:
            raise _StepError.of_reply(code, raw, when="to the message")
        # The dot ended this transaction; the follower's MAIL, sent with it, began the next.
        session.clean = not followed
