"""A throwaway Postfix on loopback, for the tests of what a real MTA sends back.

``postfix_server(domain, users)`` is a context manager: a :class:`PostfixTestServer`
with a directory of its own (configuration, queue, mailboxes, log), its ``smtpd`` on a
free loopback port. ``start()`` writes ``main.cf`` and ``master.cf``, lets ``postfix
check`` make the queue's directories, and runs Postfix's ``master`` in the foreground
as a process of the test's; it is stopped by its pid at the end and its directory
removed. The system's Postfix, if any, is never touched: nothing of ``/etc/postfix`` is
read but the files the package installs there (``postfix-files``, the scripts).

The instance looks nothing up in DNS, listens on ``127.0.0.1`` only, and logs to its
own file (``log()``). It is the mailbox server of ``domain``: each of ``users`` has a
maildir; any other user of the domain is taken in the session and then bounced with
Postfix's own DSN (``5.1.1``), as a server that checks its users after the session
does. The test adds what else it needs to ``main.cf`` (``start(main_cf=...)``), and
lookup tables (``tables``, built with ``postmap``).

Postfix's daemons run as the ``postfix`` user, so the directory is made under the
system's temporary directory and left readable, not in pytest's (private to its user).
Running ``master`` needs root, as on any server.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

POSTFIX = "/usr/sbin/postfix"

MAIN_CF = """\
# A throwaway instance: everything under {root}, nothing looked up in DNS.
compatibility_level = 3.6
queue_directory = {root}/spool
data_directory = {root}/data
mail_owner = postfix
setgid_group = postdrop
myhostname = mx.postfix.test
mydomain = postfix.test
myorigin = $myhostname
mydestination =
relayhost =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
alias_maps =
alias_database =
smtp_dns_support_level = disabled
smtpd_peername_lookup = no
smtputf8_enable = no
biff = no
maillog_file = {root}/maillog
maillog_file_prefixes = {root}
# Deferred mail is tried again within seconds.
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 2s
# The mailboxes of {domain}: an unknown user is taken, then bounced.
virtual_mailbox_domains = {domain}
virtual_mailbox_maps = inline:{{ {mailboxes} }}
virtual_mailbox_base = {root}/mail
virtual_uid_maps = static:{uid}
virtual_gid_maps = static:{gid}
smtpd_reject_unlisted_recipient = no
"""

# Postfix's services, none of them chrooted (a chroot would need copies of /etc).
MASTER_CF = """\
127.0.0.1:{port} inet n - n - - smtpd
pickup     unix  n - n 60 1 pickup
cleanup    unix  n - n -  0 cleanup
qmgr       unix  n - n 300 1 qmgr
rewrite    unix  - - n -  - trivial-rewrite
bounce     unix  - - n -  0 bounce
defer      unix  - - n -  0 bounce
trace      unix  - - n -  0 bounce
verify     unix  - - n -  1 verify
flush      unix  n - n 1000? 0 flush
proxymap   unix  - - n -  - proxymap
smtp       unix  - - n -  - smtp
relay      unix  - - n -  - smtp
showq      unix  n - n -  - showq
error      unix  - - n -  - error
retry      unix  - - n -  - error
discard    unix  - - n -  - discard
lmtp       unix  - - n -  - lmtp
anvil      unix  - - n -  1 anvil
scache     unix  - - n -  1 scache
postlog    unix-dgram n - n - 1 postlogd
virtual    unix  - n n -  - virtual
"""


def unused_port() -> int:
    """A loopback port nothing listens on, below the kernel's range of ephemeral ports.

    Postfix's ports are written in its configuration before anything listens on them,
    and a test may listen on one seconds later: meanwhile any connection made on this
    machine (a test's client, Postfix's own) may take a free port of that range as its
    source port, and the listener's bind would fail. A port below it is taken only by a
    listener that asks for it.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(10000, max(low, 10001))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def unavailable() -> str | None:
    """Why no Postfix can be started here, or ``None``."""
    if not os.path.exists(POSTFIX):
        return "Postfix is not installed (Debian: apt-get install postfix; .ci/run does)"
    if os.geteuid() != 0:
        return "Postfix's master runs as root"
    return None


class PostfixTestServer:
    """A Postfix of the test's own; ``port`` is its ``smtpd``'s on ``127.0.0.1``."""

    def __init__(self, domain: str, users: Sequence[str]) -> None:
        self.domain = domain
        self.users = tuple(users)
        self.root = Path(tempfile.mkdtemp(prefix="bumail-postfix-"))
        self.root.chmod(0o755)  # Postfix's daemons, as the postfix user, reach into it
        self.config_directory = self.root / "etc"
        self.port = unused_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, main_cf: str = "", tables: Mapping[str, str] | None = None) -> PostfixTestServer:
        """Write the configuration, with ``main_cf`` appended and each of ``tables``
        (file name in the configuration directory -> its text) built with ``postmap``;
        start ``master``; return once ``smtpd`` greets."""
        postfix = pwd.getpwnam("postfix")
        for name in ("etc", "spool", "mail"):
            (self.root / name).mkdir()
        os.chown(self.root / "mail", postfix.pw_uid, postfix.pw_gid)
        mailboxes = ", ".join(f"{user}@{self.domain}={user}/" for user in self.users)
        main = MAIN_CF.format(
            root=self.root, domain=self.domain, mailboxes=mailboxes, uid=postfix.pw_uid, gid=postfix.pw_gid
        )
        (self.config_directory / "main.cf").write_text(main + main_cf)
        (self.config_directory / "master.cf").write_text(MASTER_CF.format(port=self.port))
        for name, text in (tables or {}).items():
            (self.config_directory / name).write_text(text)
            self._run("/usr/sbin/postmap", "-c", str(self.config_directory), f"hash:{self.config_directory / name}")
        self._run(POSTFIX, "-c", str(self.config_directory), "check")  # makes the queue's directories
        daemons = self._run("/usr/sbin/postconf", "-c", str(self.config_directory), "-h", "daemon_directory").strip()
        # In the foreground (-d), leading a process group of its own, so that it and its
        # daemons are stopped by its pid.
        self.process = subprocess.Popen(
            [f"{daemons}/master", "-c", str(self.config_directory), "-d"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not self._greets():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Postfix did not start:\n{self.log()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop ``master`` (SIGTERM: it stops its daemons), then anything left of its group."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the group it led: its daemons
        self.process = None

    def log(self) -> str:
        """What Postfix logged so far."""
        path = self.root / "maillog"
        return path.read_text(errors="replace") if path.exists() else ""

    def mailbox(self, user: str) -> list[bytes]:
        """The messages delivered to ``user``'s maildir."""
        new = self.root / "mail" / user / "new"
        return [path.read_bytes() for path in sorted(new.iterdir())] if new.exists() else []

    def _greets(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                return sock.recv(3) == b"220"
        except OSError:
            return False

    def _run(self, *command: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}\n{self.log()}")
        return done.stdout


@contextlib.contextmanager
def postfix_server(domain: str, users: Sequence[str]) -> Iterator[PostfixTestServer]:
    """A :class:`PostfixTestServer`, not started; stopped and removed at the end.

    Without Postfix (or root) the test is skipped, and under ``CI`` it fails.
    """
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = PostfixTestServer(domain, users)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
