"""The one-command demo's smoke test: ``example_project/demo.py --check`` passes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

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
