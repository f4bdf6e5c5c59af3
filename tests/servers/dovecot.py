"""A real Dovecot (IMAP and POP3) on loopback, configured and started by the test.

``dovecot_server`` is a fixture: a :class:`DovecotServer` with a configuration of its own
in a directory of its own (its ``base_dir``, its log, a Maildir per user, a
``passwd-file`` of users), listening on 127.0.0.1 on free ports: IMAP with STARTTLS
(``imap_port``), IMAP over TLS (``imaps_port``), POP3 with STLS (``pop3_port``) and POP3
over TLS (``pop3s_port``). ``ssl = required``: nobody logs in without TLS. Its
certificate, for ``127.0.0.1`` and ``localhost``, comes from a CA made for the test
(``ca_file``). The process (``dovecot -F``) is stopped by its pid after the test.

Debian: ``apt-get install dovecot-imapd dovecot-pop3d`` (CI's ``ensure_dovecot``). Without
it the tests that need it fail under ``CI`` and are skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import grp
import imaplib
import os
import pwd
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.redis import free_port

DOVECOT = "/usr/sbin/dovecot"
USER = "bounces"
# Made at each run: the tests and the server they start share it, and nothing keeps it.
PASSWORD = secrets.token_urlsafe(18)

_CONFIG = """\
base_dir = {dir}/run
state_dir = {dir}/state
log_path = {dir}/dovecot.log
protocols = imap pop3
listen = 127.0.0.1
ssl = required
ssl_cert = <{dir}/cert.pem
ssl_key = <{dir}/key.pem
disable_plaintext_auth = yes
auth_mechanisms = plain
default_login_user = {login_user}
default_internal_user = {internal_user}
default_internal_group = {internal_group}
first_valid_uid = {uid}
first_valid_gid = {gid}
mail_location = maildir:{dir}/mail/%u
pop3_uidl_format = %08Xu%08Xv
passdb {{
  driver = passwd-file
  args = scheme=PLAIN {dir}/users
}}
userdb {{
  driver = passwd-file
  args = {dir}/users
}}
namespace inbox {{
  inbox = yes
  separator = /
}}
service imap-login {{
  inet_listener imap {{
    port = {imap_port}
  }}
  inet_listener imaps {{
    port = {imaps_port}
    ssl = yes
  }}
{chroot}}}
service pop3-login {{
  inet_listener pop3 {{
    port = {pop3_port}
  }}
  inet_listener pop3s {{
    port = {pop3s_port}
    ssl = yes
  }}
{chroot}}}
service anvil {{
{chroot}}}
"""


class DovecotServer:
    """A ``dovecot -F`` of the test's own; see the module's doc."""

    def __init__(self, directory: Path, ca: object) -> None:
        self.directory = directory
        self.ca_file = str(directory / "ca.pem")
        self.imap_port, self.imaps_port, self.pop3_port, self.pop3s_port = (free_port() for _ in range(4))
        self.process: subprocess.Popen[bytes] | None = None
        certificate = ca.issue_cert("127.0.0.1", "localhost")  # type: ignore[attr-defined]
        ca.cert_pem.write_to_path(self.ca_file)  # type: ignore[attr-defined]
        certificate.cert_chain_pems[0].write_to_path(str(directory / "cert.pem"))
        certificate.private_key_pem.write_to_path(str(directory / "key.pem"))

    def url(self, scheme: str, folder: str = "") -> str:
        port = {"imap": self.imap_port, "imaps": self.imaps_port, "pop3": self.pop3_port, "pop3s": self.pop3s_port}
        return f"{scheme}://{USER}@127.0.0.1:{port[scheme]}" + (f"/{folder}" if folder else "")

    def start(self) -> DovecotServer:
        if os.getuid() == 0:  # the master stays root; logins and mail run as Dovecot's own users
            mail = pwd.getpwnam("dovecot")
            uid, gid = mail.pw_uid, mail.pw_gid
            login_user, internal_user, internal_group, chroot = "dovenull", "dovecot", "dovecot", ""
        else:  # everything as this user, who may not chroot
            uid, gid = os.getuid(), os.getgid()
            login_user = internal_user = pwd.getpwuid(uid).pw_name
            internal_group = grp.getgrgid(gid).gr_name
            chroot = "  chroot =\n"
        (self.directory / "mail").mkdir()
        os.chown(self.directory / "mail", uid, gid)
        (self.directory / "users").write_text(
            f"{USER}:{{PLAIN}}{PASSWORD}:{uid}:{gid}::{self.directory}/mail/{USER}::\n"
        )
        (self.directory / "dovecot.conf").write_text(
            _CONFIG.format(
                dir=self.directory, uid=uid, gid=gid, login_user=login_user, internal_user=internal_user,
                internal_group=internal_group,
                chroot=chroot, imap_port=self.imap_port, imaps_port=self.imaps_port, pop3_port=self.pop3_port,
                pop3s_port=self.pop3s_port,
            )
        )  # fmt: skip
        self.process = subprocess.Popen(
            [DOVECOT, "-F", "-c", str(self.directory / "dovecot.conf")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dovecot did not start: {self._errors()}")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.pop3s_port), timeout=2):
                pass
            with socket.create_connection(("127.0.0.1", self.imaps_port), timeout=2):
                return True
        except OSError:
            return False

    def _errors(self) -> str:
        log = self.directory / "dovecot.log"
        stderr = self.process.stderr.read().decode(errors="replace") if self.process and self.process.stderr else ""
        return stderr + (log.read_text(errors="replace") if log.exists() else "")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()

    # -- what a test does with the mailbox, as a mail client would --------------------------

    @contextlib.contextmanager
    def imap(self) -> Iterator[imaplib.IMAP4_SSL]:
        """A logged-in IMAP client on the user's mailboxes."""
        context = ssl.create_default_context(cafile=self.ca_file)
        client = imaplib.IMAP4_SSL("127.0.0.1", self.imaps_port, ssl_context=context, timeout=30)
        client.login(USER, PASSWORD)
        try:
            yield client
        finally:
            client.logout()

    def append(self, *messages: bytes, folder: str = "INBOX") -> None:
        """Put ``messages`` in ``folder``, as delivery to the mailbox would."""
        with self.imap() as client:
            for raw in messages:
                kind, data = client.append(folder, "", imaplib.Time2Internaldate(time.time()), raw)
                assert kind == "OK", data

    def messages(self, folder: str = "INBOX") -> list[bytes]:
        """Every message in ``folder``, in order (an empty list for a folder that does not exist)."""
        with self.imap() as client:
            kind, _ = client.select(f'"{folder}"', readonly=True)
            if kind != "OK":
                return []
            kind, data = client.uid("SEARCH", "ALL")
            found = []
            for uid in data[0].split():
                _, parts = client.uid("FETCH", uid, "(BODY.PEEK[])")
                found.extend(part[1] for part in parts if isinstance(part, tuple))
            return found


@pytest.fixture
def dovecot_server() -> Iterator[DovecotServer]:
    """A Dovecot of this test's own, with an empty mailbox; stopped after the test."""
    if not os.path.exists(DOVECOT):
        message = "dovecot is not installed (Debian: apt-get install dovecot-imapd dovecot-pop3d)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    import trustme

    # Not under pytest's tmp_path: Dovecot's own users must reach the mail directory.
    directory = Path(tempfile.mkdtemp(prefix="bumail-dovecot-"))
    directory.chmod(0o755)
    server = DovecotServer(directory, trustme.CA())
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
