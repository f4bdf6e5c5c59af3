"""A real browser against the example project: Debian's Chromium, driven by Playwright.

These tests are marked ``browser`` and run only when asked for (``-m browser``, as
``tox -e browser`` does): anything else deselects them here. Once asked for, a browser
that cannot start fails them; it never skips them.

The example project runs in its own process (``manage.py runserver``) on a SQLite file
of its own, filled by ``manage.py seed_queue``. ``BUMAIL_SCREENSHOTS=1`` makes the
tests refresh the screenshots that ``docs/admin.md`` shows, in ``docs/images/``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_project"
IMAGES = ROOT / "docs" / "images"
CHROMIUM = os.environ.get("BUMAIL_CHROMIUM", "/usr/bin/chromium")
USERNAME, PASSWORD = "operator", "browser-test-only-password"
#: The viewport of every test and screenshot: a common laptop screen, with the admin's
#: navigation sidebar open (its default), the narrowest room the list is made for.
VIEWPORT = {"width": 1280, "height": 800}

#: Mail as long as real mail gets, added after ``seed_queue``: a long subject, long
#: addresses, several recipients, long replies (with an unbreakable URL) and a long
#: remote host, in the list and in the delivery log. Its addresses are at
#: ``long.example.edu`` only, so the other tests' searches never find it.
LONG_MAIL = """
from datetime import timedelta
from django.core.mail import EmailMessage
from django.utils import timezone
from bumail_queue import delivery_log
from bumail_queue.items import Reply
from bumail_queue.service import queue

now = timezone.now()
to = [
    "accounts-payable.department.northern-region@long.example.edu",
    "Christopher.Montgomery-Fitzwilliam@long.example.edu",
    "procurement-notifications-archive@long.example.edu",
    "helpdesk@long.example.edu",
]
item = queue.enqueue(EmailMessage(
    "Your monthly statement for account 4417-2231-0098 is ready: 14 transactions, 2 pending refunds,"
    " and a change to our terms of service from 1 March",
    "A long sample message.", "billing-notifications.no-reply@statements.long.example.edu", to,
))
reply = Reply(
    code=550, status="5.7.1",
    text="The user or domain that you are sending to (or from) has a policy that prohibited the mail that you"
    " sent. Please contact your domain administrator for further details. For more information, visit"
    " https://support.long.example.edu/mail/answer/7606?hl=en&p=NotAuthorizedError&ref=smtp-reply-5.7.1",
)
later = Reply(code=451, status="4.3.0", text="Temporary local problem while checking recipient policy"
              " (mailbox-policy-service-cluster-07 timed out after 30 seconds); please try again later")
for address in to:
    delivery_log.record(
        item_id=item.id, recipient=address, status="deferred" if address.startswith("help") else "failed",
        reply=later if address.startswith("help") else reply, envelope_sender=item.sender,
        remote_host="mx-inbound-relay-cluster-04.eu-west-3.mail-protection.long.example.edu",
        at=now - timedelta(minutes=3), tls=True,
        next_attempt_at=now + timedelta(minutes=20) if address.startswith("help") else None,
    )
"""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "browser" in (config.option.markexpr or ""):
        return
    browser_tests = [item for item in items if item.get_closest_marker("browser")]
    if browser_tests:
        config.hook.pytest_deselected(items=browser_tests)
        items[:] = [item for item in items if not item.get_closest_marker("browser")]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args], cwd=EXAMPLE, env=env, check=True, capture_output=True, timeout=120
    )


@pytest.fixture(scope="session")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example project on 127.0.0.1, seeded; its base URL."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "BUMAIL_"))},
        "DEMO_DB_PATH": str(tmp_path_factory.mktemp("example") / "example.sqlite3"),
        "DEMO_SMTP_PORT": str(_free_port()),  # nothing listens: no worker runs, nothing is sent
        "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
        "PYTHONUNBUFFERED": "1",
    }
    _manage(env, "migrate", "--no-input", "-v0")
    _manage(env, "createsuperuser", "--no-input", "--username", USERNAME, "--email", "operator@example.com")
    _manage(env, "seed_queue")
    _manage(env, "shell", "-c", LONG_MAIL)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=EXAMPLE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"The example project's server did not start (exit code {server.poll()}).")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # its own process group: the server and nothing else
        server.wait(timeout=10)


@pytest.fixture(scope="session")
def chromium() -> Iterator[object]:
    """Debian's Chromium, headless. Failing to start it fails the test, never skips it."""
    from playwright.sync_api import Error, sync_playwright

    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.fail(f"No Chromium at {CHROMIUM}: apt-get install chromium (or set BUMAIL_CHROMIUM).")
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        except Error as error:
            pytest.fail(f"Chromium at {CHROMIUM} could not start: {error}")
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, example_site):
    """A logged-in admin tab (a fresh browser context per test)."""
    context = chromium.new_context(viewport=VIEWPORT, base_url=example_site)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))

    # A Content-Security-Policy violation (a blocked script or style) is a console error.
    def on_console(message):
        where = message.location.get("url", "")
        if message.type == "error" and not where.endswith("/favicon.ico"):  # the example has none
            errors.append(f"{message.text} {where}")

    tab.on("console", on_console)
    tab.goto("/admin/login/?next=/admin/")
    tab.fill("#id_username", USERNAME)
    tab.fill("#id_password", PASSWORD)
    tab.click("input[type=submit]")
    tab.wait_for_url("**/admin/")
    tab.js_errors = errors
    yield tab
    context.close()
    assert errors == [], f"JavaScript or CSP errors on the admin pages: {errors}"


@pytest.fixture
def screenshot():
    """Save a screenshot for the docs when BUMAIL_SCREENSHOTS is set; else do nothing."""

    def take(tab, name: str, *, full_page: bool = False) -> None:
        if os.environ.get("BUMAIL_SCREENSHOTS"):
            IMAGES.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(IMAGES / name), full_page=full_page)

    return take
