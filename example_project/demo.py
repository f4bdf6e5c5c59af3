"""Run the bumail_queue example in one command: ``python3 example_project/demo.py``.

From a fresh clone, with only Python (3.11+) and pip, it:

1. creates a virtualenv at ``.venv-demo`` in the repository root (once) and runs
   itself again inside it;
2. installs the repository (editable) with dj-database-url and aiosmtpd, only when
   they are not installed yet (or ``pyproject.toml`` changed since);
3. applies the migrations and creates the local demo account ``demo`` / ``demo``;
4. starts a local SMTP sink on 127.0.0.1 that prints one line per message received;
5. starts ``manage.py runserver`` on 127.0.0.1 and prints the pages to open;
6. starts ``manage.py queue_worker`` too, once the project has one.

Ctrl-C, SIGTERM or closing its terminal (SIGHUP) stops what it started and exits 0.
If the demo itself is killed (SIGKILL), its children stop too on Linux, where each
asks the kernel for SIGTERM when the demo dies (PR_SET_PDEATHSIG); elsewhere only the
SMTP sink notices, and ``kill -- -PGID`` stops the rest. A demo notes its pid and its
children's in ``demo-port-PORT.pid`` beside the SQLite file, so that a second demo
says "a previous demo (pid N) still holds port 1025" rather than "set DEMO_SMTP_PORT".

``--check`` is a smoke test for CI: steps 1 to 4, then one mail sent through the
compose page with Django's test client, a check that it was queued, a cancel
through the queue page, and a clean stop. It exits 0 when all of that worked.

Environment:

- ``DEMO_HTTP_PORT`` (8000), ``DEMO_SMTP_PORT`` (1025): ports on 127.0.0.1;
- ``DEMO_DB_PATH``: the SQLite file (``example_project/demo.sqlite3`` by default);
- ``DATABASE_URL``, ``REDIS_URL``: another database, a Redis cache (see settings.py);
- ``DEMO_NO_VENV=1``: use the running interpreter as it is; install nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import venv
from collections.abc import Callable
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent
REPO_DIR = PROJECT_DIR.parent
VENV_DIR = REPO_DIR / ".venv-demo"
MANAGE = PROJECT_DIR / "manage.py"
# Written into the virtualenv after a successful install: what was installed, for what.
INSTALL_STAMP = VENV_DIR / "demo-install.stamp"

HOST = "127.0.0.1"
DEMO_USER = "demo"
DEMO_PASSWORD = "demo"  # a local demo account, said so wherever it is shown
CHECK_RECIPIENT = "someone@example.org"

# Modules the demo needs, and the pip requirement that brings each.
REQUIRED = {"django": "-e .", "bumail_queue": "-e .", "dj_database_url": "dj-database-url", "aiosmtpd": "aiosmtpd"}


# What stops the demo: Ctrl-C, kill, and the terminal closing (SIGHUP; not on Windows).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def say(message: str) -> None:
    # The terminal may be gone (SIGHUP): stopping the children matters more than this line.
    with contextlib.suppress(OSError):
        print(f"demo: {message}", flush=True)


class DemoError(Exception):
    """Something the user can fix; the message says what."""


# -- the virtualenv and the install -----------------------------------------------------------


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _venv_python() -> Path:
    if os.name == "nt":
        return VENV_DIR / "Scripts" / "python.exe"
    return VENV_DIR / "bin" / "python"


def _in_demo_venv() -> bool:
    try:
        return Path(sys.prefix).resolve() == VENV_DIR.resolve()
    except OSError:
        return False


def _reexec(python: Path) -> None:
    """Run this script again under ``python`` with the same arguments; never returns."""
    args = [str(python), str(Path(__file__).resolve()), *sys.argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt":  # no exec there that keeps the console's Ctrl-C semantics
        sys.exit(subprocess.call(args))
    os.execv(args[0], args)


def ensure_venv() -> None:
    """Make sure this process runs in ``.venv-demo``, creating it when missing."""
    if _in_demo_venv():
        return
    if os.environ.get("DEMO_REEXECUTED") == "1":
        raise DemoError(f"Re-running inside {VENV_DIR} did not work: its interpreter is not the one running.")
    python = _venv_python()
    if not python.exists():
        say(f"creating a virtualenv in {VENV_DIR.name}/ (once)")
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(VENV_DIR)
        except (OSError, subprocess.CalledProcessError) as error:
            shutil.rmtree(VENV_DIR, ignore_errors=True)  # half made: start afresh next time
            raise DemoError(
                f"Could not create the virtualenv {VENV_DIR}: {error}. On Debian and Ubuntu, "
                "install the python3-venv package first, then run this again."
            ) from error
    os.environ["DEMO_REEXECUTED"] = "1"
    _reexec(python)


def _extras() -> list[str]:
    """The optional dependencies the environment asks for: PostgreSQL, Redis."""
    extras = []
    if os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://", "pgsql://")):
        extras.append("postgres")
    if os.environ.get("REDIS_URL"):
        extras.append("redis")
    return extras


def _install_fingerprint(extras: list[str]) -> str:
    pyproject = (REPO_DIR / "pyproject.toml").read_bytes()
    requirements = sorted(set(REQUIRED.values())) + extras
    return hashlib.sha256(pyproject + repr(requirements).encode()).hexdigest()


def _missing_modules(extras: list[str], *, checkout: bool) -> list[str]:
    """Return the modules that cannot be imported; with ``checkout``, also a
    bumail_queue that is not this checkout's (the virtualenv installs it editable)."""
    wanted = list(REQUIRED)
    if "postgres" in extras:
        wanted.append("psycopg")
    if "redis" in extras:
        wanted.append("django_redis")
    missing = [name for name in wanted if importlib.util.find_spec(name) is None]
    spec = importlib.util.find_spec("bumail_queue")
    if checkout and spec is not None and spec.origin and not Path(spec.origin).resolve().is_relative_to(REPO_DIR):
        missing.append("bumail_queue (this checkout)")
    return missing


def ensure_installed() -> None:
    """Install the repository and the demo's packages into the virtualenv when needed."""
    extras = _extras()
    fingerprint = _install_fingerprint(extras)
    stamp = INSTALL_STAMP.read_text().strip() if INSTALL_STAMP.exists() else ""
    missing = _missing_modules(extras, checkout=True)
    if stamp == fingerprint and not missing:
        return
    if os.environ.get("DEMO_INSTALLED") == "1":
        raise DemoError(f"These are still missing after the install: {', '.join(missing)}.")
    target = "." + (f"[{','.join(extras)}]" if extras else "")
    say(f"installing this checkout (pip install -e {target}) with dj-database-url and aiosmtpd into {VENV_DIR.name}/")
    command = [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
        "-e", target, "dj-database-url", "aiosmtpd",
    ]  # fmt: skip
    if subprocess.call(command, cwd=REPO_DIR) != 0:
        raise DemoError("pip could not install the demo's packages; see its output above.")
    INSTALL_STAMP.write_text(fingerprint + "\n")
    # An editable install takes effect through a .pth file, which only a new
    # interpreter reads: start again.
    os.environ["DEMO_INSTALLED"] = "1"
    _reexec(Path(sys.executable))


def check_current_interpreter() -> None:
    """``DEMO_NO_VENV``: install nothing, but say plainly what is missing."""
    missing = _missing_modules(_extras(), checkout=False)
    if missing:
        raise DemoError(
            f"DEMO_NO_VENV is set and this Python ({sys.executable}) lacks: {', '.join(missing)}. "
            "Install them (pip install -e . dj-database-url aiosmtpd) or unset DEMO_NO_VENV."
        )


# -- Django -----------------------------------------------------------------------------------


def setup_django() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    if str(PROJECT_DIR) not in sys.path:
        sys.path.insert(0, str(PROJECT_DIR))
    import django

    django.setup()


def migrate() -> None:
    from django.conf import settings
    from django.core.management import call_command

    database = settings.DATABASES["default"]
    where = database["NAME"] if database["ENGINE"].endswith("sqlite3") else f"{database['ENGINE']} {database['NAME']}"
    say(f"applying migrations to {where}")
    call_command("migrate", interactive=False, verbosity=0)
    say("migrations applied")


def ensure_demo_user() -> None:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    if user_model.objects.filter(username=DEMO_USER).exists():
        say(f"the local demo account {DEMO_USER!r} exists (password {DEMO_PASSWORD!r}; for this local demo only)")
        return
    user_model.objects.create_superuser(DEMO_USER, "demo@example.com", DEMO_PASSWORD)
    say(
        f"created the superuser {DEMO_USER!r} with password {DEMO_PASSWORD!r}: a local demo account, "
        "for this demo's own database only"
    )


def worker_command_exists() -> bool:
    from django.core.management import get_commands

    return "queue_worker" in get_commands()


# -- child processes --------------------------------------------------------------------------


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if os.name != "nt":
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _port_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise DemoError(f"{name} must be a port number from 1 to 65535; got {raw!r}.")
    return port


class Children:
    """The processes the demo started; each in a process group of its own.

    A child's group id is its pid, so stopping a child signals exactly that group: the
    child and whatever it started itself (runserver's autoreloader runs the server in
    a second process), and nothing else.
    """

    def __init__(self) -> None:
        self.running: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.pid_files: list[Path] = []
        self._die_with_demo = _parent_death_signal()

    def start(self, name: str, args: list[str], port: int | None = None) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if os.name == "nt":
            process = subprocess.Popen(
                args, cwd=PROJECT_DIR, env=env, creationflags=subprocess.CREATE_NEW_PROCESS_GROUP
            )
        else:
            process = subprocess.Popen(
                args, cwd=PROJECT_DIR, env=env, start_new_session=True, preexec_fn=self._die_with_demo
            )
        self.running.append((name, process))
        if port is not None:
            self._note_port(port, process)
        return process

    def _note_port(self, port: int, process: subprocess.Popen[bytes]) -> None:
        """Write who holds ``port`` (this demo, the child's group) for the next demo's message."""
        path = _pid_file(port)
        try:
            path.write_text(f"{os.getpid()} {process.pid}\n")
        except OSError:  # only that message depends on it
            return
        self.pid_files.append(path)

    def exited(self) -> tuple[str, int] | None:
        """Return the name and exit code of a child that stopped by itself, if any."""
        for name, process in self.running:
            code = process.poll()
            if code is not None:
                return name, code
        return None

    def _signal(self, process: subprocess.Popen[bytes], sig: int) -> None:
        if process.poll() is not None and os.name == "nt":
            return
        try:
            if os.name == "nt":
                process.terminate()
            else:
                os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop_all(self) -> None:
        """Stop every child, newest first: SIGTERM, then SIGKILL after 10 seconds."""
        for name, process in reversed(self.running):
            if process.poll() is None:
                say(f"stopping {name} (pid {process.pid})")
            # Signal the group even when the leader has exited: a grandchild may remain.
            self._signal(process, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name, process in reversed(self.running):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"{name} (pid {process.pid}) did not stop; killing it")
                self._signal(process, getattr(signal, "SIGKILL", signal.SIGTERM))
                process.wait()
        self.running.clear()
        for path in self.pid_files:
            path.unlink(missing_ok=True)
        self.pid_files.clear()


def _parent_death_signal() -> Callable[[], None] | None:
    """On Linux, a ``preexec_fn`` that has the kernel send the child SIGTERM when the demo
    dies, even by SIGKILL, which no handler sees; None elsewhere (no such call there).

    SIGTERM, not SIGKILL: the sink then closes its port, and runserver's autoreloader
    kills the server process it runs (that grandchild does not inherit the setting).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    # Looked up here, in the demo: between fork and exec the child should only make the call.
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    demo = os.getpid()

    def die_with_demo() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != demo:  # the demo died before the call took effect
            os._exit(1)

    return die_with_demo


def _smtp_answers(port: int) -> bool:
    """Return whether an SMTP server on the port completes a greeting, NOOP and QUIT."""
    import smtplib

    try:
        with smtplib.SMTP(HOST, port, timeout=2) as smtp:
            return smtp.noop()[0] == 250
    except (OSError, smtplib.SMTPException):
        return False


def _wait_until_listening(
    process: subprocess.Popen[bytes], name: str, port: int, timeout: float, probe: Callable[[int], bool] = _port_answers
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DemoError(f"{name} exited with code {process.returncode} before listening on {HOST}:{port}.")
        if probe(port):
            return
        time.sleep(0.1)
    raise DemoError(f"{name} did not start listening on {HOST}:{port} within {timeout:.0f} seconds.")


def _pid_file(port: int) -> Path:
    # Beside the SQLite file: the demo's own data directory, the same for the next run.
    database = Path(os.environ.get("DEMO_DB_PATH") or PROJECT_DIR / "demo.sqlite3")
    return database.resolve().parent / f"demo-port-{port}.pid"


def _exists(check: Callable[[], None]) -> bool:
    try:
        check()
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _previous_demo(port: int) -> str | None:
    """Say who holds ``port`` when a pid file shows it is a previous demo, or its children."""
    if os.name == "nt":  # os.kill(pid, 0) would end the process there, not probe it
        return None
    try:
        demo, group = (int(field) for field in _pid_file(port).read_text().split())
    except (OSError, ValueError):
        return None
    if demo != os.getpid() and _exists(lambda: os.kill(demo, 0)):
        return f"A previous demo (pid {demo}) still holds port {port} on {HOST}: stop it with `kill {demo}`."
    if _exists(lambda: os.killpg(group, 0)):  # the demo died and left them running
        return (
            f"Processes a previous demo started (process group {group}) still hold port {port} on {HOST}: "
            f"stop them with `kill -- -{group}`."
        )
    return None


def require_free_port(port: int, variable: str) -> None:
    if _port_is_free(port):
        return
    # Another port would only start a second demo beside the first: say how to stop it.
    previous = _previous_demo(port)
    if previous is not None:
        raise DemoError(previous)
    raise DemoError(f"Port {port} on {HOST} is in use; set {variable} to a free port.")


def start_sink(children: Children, port: int) -> None:
    require_free_port(port, "DEMO_SMTP_PORT")
    process = children.start(
        "the SMTP sink", [sys.executable, str(Path(__file__).resolve()), "--smtp-sink", str(port)], port=port
    )
    _wait_until_listening(process, "The SMTP sink", port, timeout=20, probe=_smtp_answers)


# -- the SMTP sink (runs in its own process) --------------------------------------------------


def run_sink(port: int) -> int:
    """Accept every message on 127.0.0.1:port and print one line for each; deliver nothing."""
    import email
    import email.policy

    from aiosmtpd.controller import Controller

    class PrintingHandler:
        async def handle_DATA(self, server: object, session: object, envelope: object) -> str:  # noqa: N802 - aiosmtpd's name
            raw = envelope.original_content or envelope.content  # type: ignore[attr-defined]
            if isinstance(raw, str):
                raw = raw.encode("utf-8", "surrogateescape")
            try:
                subject = str(email.message_from_bytes(raw, policy=email.policy.default).get("Subject", ""))
            except Exception:  # a summary line must never fail the delivery
                subject = "(unreadable subject)"
            recipients = ", ".join(f"<{address}>" for address in envelope.rcpt_tos)  # type: ignore[attr-defined]
            print(
                f"smtp-sink: received from <{envelope.mail_from}> to {recipients}, subject {subject!r}",  # type: ignore[attr-defined]
                flush=True,
            )
            return "250 2.0.0 OK: accepted by the demo's SMTP sink"

    demo = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    controller = Controller(
        PrintingHandler(), hostname=HOST, port=port, server_hostname="localhost", enable_SMTPUTF8=True
    )
    try:
        controller.start()
    except Exception as error:  # said plainly, then a non-zero exit
        print(f"smtp-sink: could not listen on {HOST}:{port}: {error}", file=sys.stderr, flush=True)
        return 1
    print(f"smtp-sink: listening on {HOST}:{port}; it prints one line per message and delivers none", flush=True)
    try:
        while not stop.wait(0.5):
            # The demo died without stopping the sink (SIGKILL where no parent-death
            # signal exists): free the port rather than hold it for nobody.
            if os.getppid() != demo:
                break
    finally:
        controller.stop()
    return 0


# -- the two modes ----------------------------------------------------------------------------


def _on_signal(signum: int, frame: object) -> None:
    # SIGTERM and SIGHUP stop the demo the way Ctrl-C does. Only the first one: a closing
    # terminal sends SIGHUP from the kernel and again from the shell, and a second
    # KeyboardInterrupt could cut short the stopping of the children.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def run_check() -> None:
    """Send one mail through the compose page and verify the queue holds it."""
    from django.test import Client

    from bumail_queue import queue

    port = _port_from_env("DEMO_SMTP_PORT", 1025)
    if not _smtp_answers(port):
        raise DemoError(f"The SMTP sink on {HOST}:{port} does not answer NOOP with 250.")
    say(f"check: the SMTP sink answers on {HOST}:{port}")

    client = Client(enforce_csrf_checks=True, HTTP_HOST="localhost")
    page = client.get("/")
    if page.status_code != 200 or "csrftoken" not in client.cookies:
        raise DemoError(f"The compose page answered {page.status_code} without a CSRF cookie.")
    before = queue.count()
    response = client.post(
        "/",
        {
            "to": CHECK_RECIPIENT,
            "subject": "Demo check",
            "body": "Sent by demo.py --check.",
            "csrfmiddlewaretoken": client.cookies["csrftoken"].value,
        },
    )
    if response.status_code != 302 or response["Location"] != "/queue/":
        raise DemoError(f"Sending through the compose page answered {response.status_code}, not a redirect to /queue/.")
    count = queue.count()
    if count < 1 or count <= before:
        raise DemoError(f"The mail was not queued: queue.count() is {count} (it was {before}).")
    mine = [item for item in queue.list(limit=1000) if any(r.address == CHECK_RECIPIENT for r in item.recipients)]
    if not mine:
        raise DemoError(f"No queued item is addressed to {CHECK_RECIPIENT}.")
    item = mine[-1]
    say(f"check: the mail was queued: item {item.id} to {CHECK_RECIPIENT} (queue.count() = {count})")

    listing = client.get("/queue/")
    if listing.status_code != 200 or item.id not in listing.content.decode():
        raise DemoError("The queue page does not list the queued item.")
    cancel = client.post(f"/queue/{item.id}/cancel/", {"csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    if cancel.status_code != 302 or queue.get(item.id) is not None:
        raise DemoError(f"Cancelling through the queue page answered {cancel.status_code} and left the item queued.")
    say(f"check: the queue page listed item {item.id}, and its cancel button removed it")

    # End to end: a second mail, delivered by the worker's own code to the SMTP sink.
    client.post(
        "/",
        {
            "to": CHECK_RECIPIENT,
            "subject": "Demo check, delivered",
            "body": "Delivered by demo.py --check.",
            "csrfmiddlewaretoken": client.cookies["csrftoken"].value,
        },
    )
    stats = queue.deliver_due()
    if stats.delivered < 1 or queue.count() != before:
        raise DemoError(f"The worker did not deliver the mail to the SMTP sink: {stats}.")
    say(f"check: the worker delivered {stats.delivered} mail to the SMTP sink on {HOST}:{port}")


def run_demo(children: Children, http_port: int) -> None:
    require_free_port(http_port, "DEMO_HTTP_PORT")
    server = children.start(
        "the web server", [sys.executable, str(MANAGE), "runserver", f"{HOST}:{http_port}"], port=http_port
    )
    _wait_until_listening(server, "The web server", http_port, timeout=60)
    base = f"http://{HOST}:{http_port}"
    say("open these pages:")
    say(f"  {base}/         write a mail (it goes through Django's send_mail into the queue)")
    say(f"  {base}/queue/   the queue, with a cancel button per item")
    say(f"  {base}/admin/   the admin (local demo account: {DEMO_USER} / {DEMO_PASSWORD})")
    if worker_command_exists():
        children.start("the queue worker", [sys.executable, str(MANAGE), "queue_worker"])
        say("started manage.py queue_worker: queued mail is delivered to the SMTP sink, which prints a line for each")
    else:
        say("no manage.py queue_worker yet: mail is kept in the queue, and delivery starts once a worker runs")
    say("press Ctrl-C to stop")
    while True:
        ended = children.exited()
        if ended is not None:
            name, code = ended
            raise DemoError(f"{name} stopped by itself (exit code {code}).")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the bumail_queue example project locally.")
    parser.add_argument("--check", action="store_true", help="smoke test: queue one mail, verify it, stop, exit 0")
    parser.add_argument("--smtp-sink", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smtp_sink is not None:
        return run_sink(args.smtp_sink)
    if sys.version_info < (3, 11):  # noqa: UP036 - run by whatever python3 comes first on PATH
        print("demo: bumail_queue needs Python 3.11 or newer; run this with a newer python3.", file=sys.stderr)
        return 2

    children = Children()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    try:
        if _env_flag("DEMO_NO_VENV"):
            check_current_interpreter()
        else:
            ensure_venv()
            ensure_installed()
        http_port = _port_from_env("DEMO_HTTP_PORT", 8000)
        smtp_port = _port_from_env("DEMO_SMTP_PORT", 1025)
        # Said before any work, then checked again as each child starts.
        require_free_port(smtp_port, "DEMO_SMTP_PORT")
        if not args.check:
            require_free_port(http_port, "DEMO_HTTP_PORT")
        setup_django()
        migrate()
        ensure_demo_user()
        from django.db import connections

        connections.close_all()  # the children open their own
        start_sink(children, smtp_port)
        if args.check:
            run_check()
            connections.close_all()
            say("check: OK")
        else:
            run_demo(children, http_port)
    except KeyboardInterrupt:
        if args.check:
            say("check: interrupted before it finished")
            return 1
        say("stopping")
    except DemoError as error:
        print(f"demo: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        # Whatever happened, the children go too; a second Ctrl-C must not cut this short.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        children.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
