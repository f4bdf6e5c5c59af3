"""Returned mail fetched from a mailbox: ``manage.py queue_inbound --imap URL`` / ``--pop3 URL``.

One pass over a mailbox of ``INBOUND_MAILBOXES``: each message is fetched, processed as
the listener processes what an MTA hands it (``processing.process_returned_mail``), then
deleted, or moved to another folder (IMAP), on the server. TLS always, the server's
certificate verified (``CA_FILE``, else ``TLS_CA_FILE``, else the system's trust store);
the password comes from the settings and is never shown.

Exactly once, across crashes: each message is recorded (``MailboxMessage``, by the
mailbox's URL and the SHA-256 of its octets) as ``started`` before it is processed and
``done`` after; the record is deleted once the server has removed the message.

- a message whose record says ``done`` (the process ended before the server removed it)
  is removed, not processed again;
- one whose record says ``started`` (the process ended while processing it, which may
  have been acted on in part) is not processed again either: it is kept as unread
  returned mail with a note saying so, for a person, then removed;
- processing that fails (the store or the database down) forgets its record and stops
  the pass: the message stays in the mailbox for the next one;
- a message is removed only once its record says ``done``: nothing unprocessed is
  deleted. POP3 removes messages when the session ends (``QUIT``): a pass cut short
  leaves every message in place, and the next pass removes those already done.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import hashlib
import imaplib
import logging
import poplib
import re
import ssl
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Protocol

from django.db import IntegrityError, transaction
from django.utils import timezone

from bumail_queue.conf import QueueSettings
from bumail_queue.conf.mailboxes import InboundMailbox
from bumail_queue.errors import first_line
from bumail_queue.models import MailboxMessage, ReturnedMail

from .inbound import MESSAGE_SIZE_LIMIT
from .processing import KEPT_MESSAGE_LIMIT, Processed

logger = logging.getLogger("bumail_queue.feedback")

TIMEOUT_SECONDS = 60.0
"""How long the server may take over any one reply."""

INTERRUPTED_NOTE = (
    "Fetched from {url}; a pass over that mailbox ended while processing this message (the process "
    "stopped), so it may have been acted on in part. It was not processed again: read it, and act on "
    "it by hand if it needs it."
)
KEPT_NOTE = "Fetched from {url}."

Process = Callable[[bytes, list[str]], Processed]

_IMAP_LISTING = re.compile(rb"UID (\d+) RFC822\.SIZE (\d+)|RFC822\.SIZE (\d+) UID (\d+)")


class MailboxError(Exception):
    """The mailbox could not be read: the server down, TLS that fails, a refused login.
    The message names the mailbox's URL, never its password."""


@dataclasses.dataclass(kw_only=True, slots=True)
class Counts:
    """What one pass over a mailbox did, message by message."""

    processed: int = 0  # read and acted on (a bounce, a complaint, a delay...), then removed
    kept: int = 0  # nobody could read it: kept as unread returned mail, then removed
    skipped: int = 0  # processed by an earlier pass that ended before removing it: removed now
    interrupted: int = 0  # an earlier pass ended while processing it: kept with a note, then removed
    left: int = 0  # larger than the listener takes (10 MiB): left in the mailbox, untouched

    def __str__(self) -> str:
        return (
            f"{self.processed} processed, {self.kept} kept, {self.skipped} skipped, "
            f"{self.interrupted} interrupted, {self.left} left"
        )


class Session(Protocol):
    """A logged-in session on a mailbox, as a pass uses it."""

    removes_at_end: bool  # POP3: DELE takes effect at QUIT

    def listing(self) -> list[tuple[str, int]]: ...  # each message's id and size, in order
    def fetch(self, message_id: str) -> bytes | None: ...  # None: gone meanwhile
    def remove(self, message_id: str) -> None: ...  # delete, or move, as AFTER says
    def finish(self) -> None: ...  # end cleanly: POP3's QUIT makes its removals happen
    def close(self) -> None: ...  # drop the connection (after finish, or after a failure)


def fetch_mailbox(mailbox: InboundMailbox, *, settings: QueueSettings, process: Process) -> Counts:
    """Fetch, process and remove every message of ``mailbox``: one pass."""
    counts = Counts()
    with _session(mailbox, settings) as session:
        removed: list[str] = []
        for message_id, size in session.listing():
            if size > MESSAGE_SIZE_LIMIT:
                counts.left += 1
                continue
            raw = session.fetch(message_id)
            if raw is None:
                continue
            digest = hashlib.sha256(raw).hexdigest()
            outcome = _handle(mailbox, settings, raw, digest, process)
            setattr(counts, outcome, getattr(counts, outcome) + 1)
            session.remove(message_id)
            if session.removes_at_end:
                removed.append(digest)
            else:
                _forget(mailbox, settings, [digest])
        session.finish()
        _forget(mailbox, settings, removed)
    logger.info("mailbox fetched url=%s %s", mailbox.url, counts)
    return counts


# -- exactly once -----------------------------------------------------------------------------


def _handle(mailbox: InboundMailbox, settings: QueueSettings, raw: bytes, digest: str, process: Process) -> str:
    """Process ``raw`` unless a record says an earlier pass did; return the ``Counts`` field."""
    records = MailboxMessage.objects.using(settings.database).filter(mailbox=mailbox.url, digest=digest)
    state = records.values_list("state", flat=True).first()
    if state == MailboxMessage.State.DONE:
        return "skipped"
    recipients = delivered_to(raw)
    if state == MailboxMessage.State.STARTED:
        with transaction.atomic(using=settings.database):  # kept once, whenever this pass ends
            _keep(raw, recipients, settings, note=INTERRUPTED_NOTE.format(url=mailbox.url))
            records.update(state=MailboxMessage.State.DONE)
        logger.warning("mailbox message kept, its processing was interrupted url=%s digest=%s", mailbox.url, digest)
        return "interrupted"
    try:
        MailboxMessage.objects.using(settings.database).create(
            mailbox=mailbox.url, digest=digest, state=MailboxMessage.State.STARTED, fetched_at=timezone.now()
        )
    except IntegrityError as error:  # another pass over this mailbox has it now
        raise MailboxError(f"{mailbox.url}: another pass over this mailbox is running.") from error
    try:
        done = process(raw, recipients)
    except Exception:
        records.delete()  # nothing was written (the signals come last, and never raise): try again later
        raise
    records.update(state=MailboxMessage.State.DONE)
    if done.kept is not None:
        ReturnedMail.objects.using(settings.database).filter(pk=done.kept.pk).update(
            note=KEPT_NOTE.format(url=mailbox.url)
        )
        return "kept"
    return "processed"


def _forget(mailbox: InboundMailbox, settings: QueueSettings, digests: list[str]) -> None:
    if digests:
        MailboxMessage.objects.using(settings.database).filter(mailbox=mailbox.url, digest__in=digests).delete()


def delivered_to(raw: bytes) -> list[str]:
    """The addresses the message was delivered to, as the delivering server wrote them
    (``Delivered-To``, ``X-Original-To``): a ``RETURN_PATH`` address names its item."""
    head = email.message_from_bytes(raw.split(b"\r\n\r\n", 1)[0][:65536], policy=email.policy.compat32)
    found = [str(v).strip().strip("<>") for name in ("Delivered-To", "X-Original-To") for v in head.get_all(name, [])]
    return list(dict.fromkeys(a for a in found if a))


def _keep(raw: bytes, recipients: list[str], settings: QueueSettings, *, note: str) -> None:
    head = email.message_from_bytes(raw[:65536], policy=email.policy.compat32)
    ReturnedMail(
        received_at=timezone.now(),
        recipients=", ".join(recipients),
        sender=" ".join(str(head.get("From", "")).split())[:1000],
        subject=" ".join(str(head.get("Subject", "")).split())[:1000],
        message=raw[:KEPT_MESSAGE_LIMIT],
        note=note,
    ).save(using=settings.database, force_insert=True)


# -- the servers ------------------------------------------------------------------------------


@contextmanager
def _session(mailbox: InboundMailbox, settings: QueueSettings) -> Iterator[Session]:
    context = ssl.create_default_context(cafile=mailbox.ca_file or settings.tls_ca_file)
    where = f"{mailbox.url}: {mailbox.host} port {mailbox.port}"
    session: Session | None = None
    try:
        session = ImapSession(mailbox, context) if mailbox.protocol == "imap" else Pop3Session(mailbox, context)
        yield session
    except ssl.SSLCertVerificationError as error:
        raise MailboxError(f"{where}: TLS failed: its certificate was not verified ({error.verify_message}).") from None
    except ssl.SSLError as error:
        raise MailboxError(f"{where}: TLS failed ({error.reason or first_line(error)}).") from None
    except (imaplib.IMAP4.error, poplib.error_proto) as error:
        raise MailboxError(f"{where}: the server refused: {_text(error)}") from None
    except OSError as error:
        raise MailboxError(f"{where} could not be reached: {error.strerror or first_line(error)}.") from None
    finally:
        if session is not None:
            session.close()


def _text(error: BaseException) -> str:
    text = error.args[0] if error.args else error
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    return " ".join(text.split())[:300]


def _quoted(name: str) -> str:
    return '"' + name + '"'  # the settings refuse names with '"' or '\\'


class ImapSession:
    """IMAP4rev1 by UID: ``UID MOVE`` (else ``COPY``, ``\\Deleted`` and ``EXPUNGE``)."""

    removes_at_end = False

    def __init__(self, mailbox: InboundMailbox, context: ssl.SSLContext) -> None:
        self.mailbox = mailbox
        self.imap: imaplib.IMAP4
        if mailbox.implicit_tls:
            self.imap = imaplib.IMAP4_SSL(mailbox.host, mailbox.port, ssl_context=context, timeout=TIMEOUT_SECONDS)
        else:
            self.imap = imaplib.IMAP4(mailbox.host, mailbox.port, timeout=TIMEOUT_SECONDS)
            self.imap.starttls(ssl_context=context)
        self.imap.login(mailbox.username, mailbox.password)
        self.count = int(self._ok(self.imap.select(_quoted(mailbox.folder)), "SELECT")[0] or 0)
        if mailbox.after == "move" and mailbox.move_to:
            self.imap.create(_quoted(mailbox.move_to))  # NO when it exists already: fine

    def _ok(self, answer: tuple[str, Sequence[object]], command: str) -> list[bytes]:
        kind, data = answer
        if kind != "OK":
            said = b" ".join(d for d in data if isinstance(d, bytes)).decode("utf-8", "replace")
            raise imaplib.IMAP4.error(f"{command} {self.mailbox.folder!r}: {said}")
        return [d if isinstance(d, bytes) else b"" for d in data]

    def listing(self) -> list[tuple[str, int]]:
        if not self.count:
            return []
        found = []
        for line in self._ok(self.imap.uid("FETCH", "1:*", "(UID RFC822.SIZE)"), "FETCH"):
            match = _IMAP_LISTING.search(line)
            if match:
                uid, size = (match[1], match[2]) if match[1] else (match[4], match[3])
                found.append((uid.decode(), int(size)))
        return sorted(found, key=lambda f: int(f[0]))

    def fetch(self, message_id: str) -> bytes | None:
        kind, data = self.imap.uid("FETCH", message_id, "(BODY.PEEK[])")
        if kind != "OK":
            raise imaplib.IMAP4.error(f"FETCH: {data!r}")
        return next((part[1] for part in data if isinstance(part, tuple) and isinstance(part[1], bytes)), None)

    def remove(self, message_id: str) -> None:
        if self.mailbox.after == "move" and self.mailbox.move_to:
            target = _quoted(self.mailbox.move_to)
            if "MOVE" in self.imap.capabilities:
                self._ok(self.imap.uid("MOVE", message_id, target), "MOVE")
                return
            self._ok(self.imap.uid("COPY", message_id, target), "COPY")
        self._ok(self.imap.uid("STORE", message_id, "+FLAGS.SILENT", r"(\Deleted)"), "STORE")
        if "UIDPLUS" in self.imap.capabilities:
            self._ok(self.imap.uid("EXPUNGE", message_id), "EXPUNGE")
        else:
            self._ok(self.imap.expunge(), "EXPUNGE")

    def finish(self) -> None:
        self.imap.close()
        self.imap.logout()

    def close(self) -> None:
        with suppress(OSError):
            self.imap.shutdown()


class Pop3Session:
    """POP3 (RFC 1939): ``RETR``, ``DELE``, and ``QUIT``, which makes the deletions happen."""

    removes_at_end = True

    def __init__(self, mailbox: InboundMailbox, context: ssl.SSLContext) -> None:
        self.pop: poplib.POP3
        if mailbox.implicit_tls:
            self.pop = poplib.POP3_SSL(mailbox.host, mailbox.port, timeout=TIMEOUT_SECONDS, context=context)
        else:
            self.pop = poplib.POP3(mailbox.host, mailbox.port, timeout=TIMEOUT_SECONDS)
            self.pop.stls(context)
        self.pop.user(mailbox.username)
        self.pop.pass_(mailbox.password)

    def listing(self) -> list[tuple[str, int]]:
        _, lines, _ = self.pop.list()
        found = (line.split() for line in lines)
        return [(number.decode(), int(size)) for number, size, *_ in found]

    def fetch(self, message_id: str) -> bytes:
        _, lines, _ = self.pop.retr(int(message_id))
        return b"\r\n".join(lines) + b"\r\n"

    def remove(self, message_id: str) -> None:
        self.pop.dele(int(message_id))

    def finish(self) -> None:
        self.pop.quit()

    def close(self) -> None:
        with suppress(OSError):
            self.pop.close()
