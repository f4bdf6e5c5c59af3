"""Fail when a module of the package passes its size: the rooms stay near 500 lines.

Run by ``tox -e lint`` (so by CI): ``python tools/module_sizes.py``. The limit, the
folders it covers and the rare module allowed past it are read from
``[tool.module-sizes]`` in ``pyproject.toml``; an exception names the module and,
as its value, the reason. A function's size is ruff's (``PLR0915``, max-statements).
Why the package is cut where it is: docs/architecture.md.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    max_lines: int
    packages: tuple[str, ...]
    exclude: tuple[str, ...]
    exceptions: Mapping[str, str]


def limits_from(pyproject: Mapping[str, Any]) -> Limits:
    """Read ``[tool.module-sizes]``; every key is required, so a typo is not a silent pass."""
    table = pyproject["tool"]["module-sizes"]
    exceptions = table.get("exceptions", {})
    unexplained = sorted(path for path, reason in exceptions.items() if not str(reason).strip())
    if unexplained:
        raise SystemExit(f"module-sizes: an exception needs its reason: {', '.join(unexplained)}")
    return Limits(
        max_lines=int(table["max-lines"]),
        packages=tuple(table["packages"]),
        exclude=tuple(table.get("exclude", ())),
        exceptions=dict(exceptions),
    )


def modules(root: Path, limits: Limits) -> Iterator[Path]:
    """Yield the package's modules, relative to ``root``, leaving the excluded folders out."""
    for package in limits.packages:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if not any(relative.is_relative_to(folder) for folder in limits.exclude):
                yield relative


def too_long(root: Path, limits: Limits) -> list[str]:
    """Return a line for each module over the limit that no exception names."""
    problems = []
    for relative in modules(root, limits):
        lines = len((root / relative).read_bytes().splitlines())
        if lines > limits.max_lines and relative.as_posix() not in limits.exceptions:
            problems.append(
                f"{relative.as_posix()}: {lines} lines, over {limits.max_lines}: cut it by responsibility "
                "(docs/architecture.md), or name it under [tool.module-sizes.exceptions] with the reason"
            )
    problems.extend(
        f"{path}: named under [tool.module-sizes.exceptions], but {why}: take the exception out"
        for path, why in _needless_exceptions(root, limits)
    )
    return problems


def _needless_exceptions(root: Path, limits: Limits) -> Iterator[tuple[str, str]]:
    # An exception outlives its reason once the module is cut or gone; keeping it
    # would let the module grow back unseen.
    for path in sorted(limits.exceptions):
        module = root / path
        if not module.is_file():
            yield path, "there is no such module"
        elif len(module.read_bytes().splitlines()) <= limits.max_lines:
            yield path, f"it is within {limits.max_lines} lines"


def main(root: Path = ROOT) -> int:
    limits = limits_from(tomllib.loads((root / "pyproject.toml").read_text()))
    problems = too_long(root, limits)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"module-sizes: every module of {', '.join(limits.packages)} is within {limits.max_lines} lines")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
