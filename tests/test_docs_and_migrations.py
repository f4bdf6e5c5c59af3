"""The docs list what the code has, and the migrations match the models."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from bumail_queue.conf import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent


def test_settings_page_lists_exactly_the_settings():
    documented = re.findall(r"^### `([A-Z_]+)`$", (ROOT / "docs" / "settings.md").read_text(), flags=re.M)
    assert sorted(documented) == sorted(DEFAULTS)


def test_checks_page_lists_exactly_the_check_ids_in_the_code():
    in_code = set()
    for path in (ROOT / "bumail_queue").rglob("*.py"):
        in_code |= set(re.findall(r"bumail_queue\.[EW]\d{3}", path.read_text()))
    documented = set(
        re.findall(r"^### `(bumail_queue\.[EW]\d{3})`$", (ROOT / "docs" / "checks.md").read_text(), flags=re.M)
    )
    assert documented == in_code


@pytest.mark.django_db
def test_the_migrations_match_the_models():
    out = StringIO()
    call_command("makemigrations", "bumail_queue", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_every_test_the_security_page_names_exists():
    page = (ROOT / "docs" / "security.md").read_text()
    named, current = [], None
    for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`", page):
        current = path or current
        named.append((current, name))
    assert len(named) > 30
    missing = [(path, name) for path, name in named if f"def {name}(" not in (ROOT / path).read_text()]
    assert missing == []
