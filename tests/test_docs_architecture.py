"""The docs' index and architecture page say what the code and the lint contracts say."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from django.dispatch import Signal

from bumail_queue import signals

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def contract(contract_id):
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["id"] == contract_id)


def test_every_page_is_linked_from_the_index():
    index = (DOCS / "index.md").read_text()
    pages = {path.name for path in DOCS.glob("*.md")} - {"index.md"}
    assert {page for page in pages if f"]({page})" not in index} == set()


def test_the_index_names_every_signal():
    row = next(line for line in (DOCS / "index.md").read_text().splitlines() if line.startswith("| [Signals]"))
    names = {name for name, value in vars(signals).items() if isinstance(value, Signal)}
    assert names == set(re.findall(r"`(\w+)`", row))


def test_the_architecture_page_shows_the_layers_lint_imports_checks():
    page = (DOCS / "architecture.md").read_text()
    block = page.split("## The layers", 1)[1].split("```", 2)[1]
    assert block.strip().splitlines() == contract("layers")["layers"]


def test_the_architecture_page_names_every_module_of_the_package():
    page = (DOCS / "architecture.md").read_text()
    package = ROOT / "bumail_queue"
    modules = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    folders = {
        f"{path.name}/" for path in package.iterdir() if (path / "__init__.py").exists() and path.name != "migrations"
    }
    assert {name for name in modules | folders if f"`{name}`" not in page} == set()
