"""The one-command demo: ``--check`` passes, and the demo stops its children whatever stops it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import printed, read_all, wait_until

REPO_DIR = Path(__file__).resolve().parent.parent
DEMO = REPO_DIR / "example_project" / "demo.py"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_demo_check_queues_a_mail(tmp_path: Path) -> None:
    database = tmp_path / "demo.sqlite3"
    # The demo's own settings and a throw-away SQLite file, whatever database the suite uses.
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(
        DEMO_NO_VENV="1",  # this interpreter has the packages; no .venv-demo
        DEMO_DB_PATH=str(database),
        DEMO_SMTP_PORT=str(_free_port()),
        PYTHONUNBUFFERED="1",
    )

    result = subprocess.run(
        [sys.executable, str(DEMO), "--check"],
        cwd=REPO_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )

    output = f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 0, output
    assert "demo: check: the mail was queued" in result.stdout, output
    assert "demo: check: the worker delivered 1 mail to the SMTP sink" in result.stdout, output
    assert "demo: check: OK" in result.stdout, output
    assert "smtp-sink: listening on 127.0.0.1:" in result.stdout, output
    assert database.exists()


# -- stopping: the demo's children go when it goes ---------------------------------------

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="SIGHUP and process groups are POSIX")


def _demo_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(
        DEMO_NO_VENV="1",
        DEMO_DB_PATH=str(tmp_path / "demo.sqlite3"),
        DEMO_SMTP_PORT=str(_free_port()),
        DEMO_HTTP_PORT=str(_free_port()),
        PYTHONUNBUFFERED="1",
    )
    return env


def _ports(env: dict[str, str]) -> tuple[int, int]:
    return int(env["DEMO_SMTP_PORT"]), int(env["DEMO_HTTP_PORT"])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _live_processes() -> dict[int, int]:
    """pid -> parent pid of every process that is not a zombie (a zombie holds no port)."""
    listing = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,stat="], capture_output=True, text=True, check=True)
    table = {}
    for line in listing.stdout.splitlines():
        pid, ppid, stat = line.split(None, 2)
        if not stat.startswith("Z"):
            table[int(pid)] = int(ppid)
    return table


def _descendants(pid: int) -> set[int]:
    table = _live_processes()
    found: set[int] = set()
    parents = {pid}
    while parents:
        parents = {child for child, parent in table.items() if parent in parents} - found
        found |= parents
    return found


def _all_gone(pids: set[int]) -> Callable[[], bool]:
    return lambda: not pids & set(_live_processes())


@contextlib.contextmanager
def _cleanup(demo: subprocess.Popen[str] | subprocess.Popen[bytes], children: set[int]) -> Iterator[None]:
    """Whatever the test found, kill what is left of this demo (only its own processes)."""
    try:
        yield
    finally:
        for pid in {demo.pid, *children} & set(_live_processes()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        demo.wait(timeout=20)


def _start_demo(env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    """The demo in a session of its own, as a terminal starts it; and the lines it prints."""
    demo = subprocess.Popen(
        [sys.executable, str(DEMO)], cwd=REPO_DIR, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return demo, read_all(demo)[0]


def _running(lines: list[str]) -> Callable[[], bool]:
    # Printed once the sink, the web server and the worker have all started.
    return printed(lines, "demo: press Ctrl-C to stop")


@dataclasses.dataclass
class _RunningDemo:
    process: subprocess.Popen[str]
    lines: list[str]
    children: set[int]  # every process under it once it runs
    env: dict[str, str]
    smtp_port: int
    http_port: int

    def ports_free(self) -> bool:
        return not _answers(self.smtp_port) and not _answers(self.http_port)


@contextlib.contextmanager
def _running_demo(tmp_path: Path) -> Iterator[_RunningDemo]:
    """A demo started as a terminal starts it, once it runs; whatever is left of it is
    killed at the end."""
    env = _demo_env(tmp_path)
    smtp_port, http_port = _ports(env)
    process, lines = _start_demo(env)
    children: set[int] = set()
    with _cleanup(process, children):
        assert wait_until(_running(lines), 120), "".join(lines)
        children |= _descendants(process.pid)
        yield _RunningDemo(process, lines, children, env, smtp_port, http_port)


@posix_only
@pytest.mark.slow
def test_closing_the_terminal_stops_the_demo_and_its_children(tmp_path: Path) -> None:
    import fcntl  # POSIX only, as the test
    import pty
    import termios

    env = _demo_env(tmp_path)
    smtp_port, http_port = _ports(env)
    master, slave = pty.openpty()
    demo = subprocess.Popen(
        [sys.executable, str(DEMO)], cwd=REPO_DIR, env=env, stdin=slave, stdout=slave, stderr=slave,
        # A session leader whose controlling terminal is the pty: closing it sends the
        # demo SIGHUP from the kernel, and its writes fail from then on, as in a real one.
        start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )  # fmt: skip
    os.close(slave)
    output = bytearray()
    reading = threading.Event()
    reading.set()

    def read() -> None:
        while reading.is_set():
            if select.select([master], [], [], 0.05)[0]:
                with contextlib.suppress(OSError):
                    output.extend(os.read(master, 65536))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    children: set[int] = set()
    with _cleanup(demo, children):
        assert wait_until(lambda: b"demo: press Ctrl-C to stop" in output, 120), output.decode(errors="replace")
        assert _answers(smtp_port) and _answers(http_port)
        children |= _descendants(demo.pid)
        assert len(children) >= 4, children  # the sink, runserver and its server, the worker
        reading.clear()
        reader.join()
        os.close(master)  # the terminal closes

        assert wait_until(lambda: demo.poll() is not None, 60), "the demo did not exit on SIGHUP"
        assert wait_until(_all_gone(children), 30), f"left running: {children & set(_live_processes())}"
        assert wait_until(lambda: not _answers(smtp_port) and not _answers(http_port), 10)
        assert not list(tmp_path.glob("demo-port-*.pid"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal (prctl) is Linux only")
@pytest.mark.slow
def test_killing_the_demo_stops_its_children_on_linux(tmp_path: Path) -> None:
    with _running_demo(tmp_path) as demo:
        assert len(demo.children) >= 4, demo.children

        demo.process.kill()  # SIGKILL: no handler of the demo's runs
        demo.process.wait(timeout=20)

        assert wait_until(_all_gone(demo.children), 30), f"left running: {demo.children & set(_live_processes())}"
        assert wait_until(demo.ports_free, 10)


@posix_only
@pytest.mark.slow
def test_a_second_demo_names_the_first_that_holds_the_ports(tmp_path: Path) -> None:
    with _running_demo(tmp_path) as first:
        second = subprocess.run(
            [sys.executable, str(DEMO)], cwd=REPO_DIR, env=first.env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip

        output = f"--- stdout\n{second.stdout}\n--- stderr\n{second.stderr}"
        assert second.returncode == 1, output
        pid = first.process.pid
        expected = (
            f"A previous demo (pid {pid}) still holds port {first.smtp_port} on 127.0.0.1: stop it with `kill {pid}`"
        )
        assert expected in second.stderr, output
        assert "DEMO_SMTP_PORT" not in output and "DEMO_HTTP_PORT" not in output, output

        first.process.send_signal(signal.SIGTERM)  # as the message says
        assert first.process.wait(timeout=60) == 0, "".join(first.lines)
        assert wait_until(_all_gone(first.children), 30), f"left running: {first.children & set(_live_processes())}"
        assert first.ports_free()
        assert not list(tmp_path.glob("demo-port-*.pid"))


@pytest.mark.slow
def test_a_port_held_by_something_else_still_suggests_another_port(tmp_path: Path) -> None:
    env = _demo_env(tmp_path)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        env["DEMO_SMTP_PORT"] = str(holder.getsockname()[1])
        result = subprocess.run(
            [sys.executable, str(DEMO)], cwd=REPO_DIR, env=env, capture_output=True, text=True, timeout=60, check=False
        )

    assert result.returncode == 1, result.stderr
    assert f"Port {env['DEMO_SMTP_PORT']} on 127.0.0.1 is in use; set DEMO_SMTP_PORT to a free port." in result.stderr
    assert "previous demo" not in result.stderr


@posix_only
@pytest.mark.slow
def test_children_a_dead_demo_left_are_named_by_their_process_group(tmp_path: Path) -> None:
    env = _demo_env(tmp_path)
    port = int(env["DEMO_SMTP_PORT"])
    # What a demo killed where no parent-death signal exists leaves: a listener in a
    # group of its own, and the pid file of a demo that is gone.
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTEN, str(port)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    with _cleanup(listener, set()):
        assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
        dead = subprocess.Popen([sys.executable, "-c", ""])
        dead.wait()  # reaped: a pid no process has now
        (tmp_path / f"demo-port-{port}.pid").write_text(f"{dead.pid} {listener.pid}\n")

        result = subprocess.run(
            [sys.executable, str(DEMO)], cwd=REPO_DIR, env=env, capture_output=True, text=True, timeout=60, check=False
        )

        assert result.returncode == 1, result.stderr
        assert f"(process group {listener.pid}) still hold port {port}" in result.stderr, result.stderr
        assert f"`kill -- -{listener.pid}`" in result.stderr, result.stderr
        assert "DEMO_SMTP_PORT" not in result.stderr, result.stderr


LISTEN = """
import socket, sys
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("listening", flush=True)
server.accept()
"""
