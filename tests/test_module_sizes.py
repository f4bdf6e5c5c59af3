"""tools/module_sizes.py, the lint step that holds each module of the package to its size."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_spec = importlib.util.spec_from_file_location("module_sizes", ROOT / "tools" / "module_sizes.py")
assert _spec and _spec.loader
module_sizes = importlib.util.module_from_spec(_spec)
sys.modules["module_sizes"] = module_sizes
_spec.loader.exec_module(module_sizes)

CONFIG = """
[tool.module-sizes]
max-lines = 5
packages = ["pkg"]
exclude = ["pkg/migrations"]
{exceptions}
"""


def tree(tmp_path, files, exceptions=""):
    (tmp_path / "pyproject.toml").write_text(CONFIG.format(exceptions=exceptions))
    for name, lines in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"x{n} = {n}\n" for n in range(lines)))
    return tmp_path


def test_a_module_at_the_limit_passes(tmp_path, capsys):
    root = tree(tmp_path, {"pkg/__init__.py": 0, "pkg/room.py": 5, "pkg/sub/deep.py": 5})
    assert module_sizes.main(root) == 0
    assert "within 5 lines" in capsys.readouterr().out


def test_a_module_one_line_over_fails_and_names_itself(tmp_path, capsys):
    root = tree(tmp_path, {"pkg/room.py": 5, "pkg/sub/deep.py": 6})
    assert module_sizes.main(root) == 1
    assert capsys.readouterr().err.splitlines() == [
        "pkg/sub/deep.py: 6 lines, over 5: cut it by responsibility (docs/architecture.md), "
        "or name it under [tool.module-sizes.exceptions] with the reason"
    ]


def test_migrations_are_left_out(tmp_path):
    assert module_sizes.main(tree(tmp_path, {"pkg/migrations/0001_initial.py": 50})) == 0


def test_an_exception_with_its_reason_lets_one_module_pass(tmp_path):
    exceptions = '[tool.module-sizes.exceptions]\n"pkg/big.py" = "one generated table"\n'
    root = tree(tmp_path, {"pkg/big.py": 9, "pkg/other.py": 9}, exceptions)
    assert module_sizes.too_long(
        root, module_sizes.limits_from(module_sizes.tomllib.loads((root / "pyproject.toml").read_text()))
    ) == [
        "pkg/other.py: 9 lines, over 5: cut it by responsibility (docs/architecture.md), "
        "or name it under [tool.module-sizes.exceptions] with the reason"
    ]


def test_an_exception_without_a_reason_is_refused(tmp_path):
    root = tree(tmp_path, {"pkg/big.py": 9}, '[tool.module-sizes.exceptions]\n"pkg/big.py" = " "\n')
    with pytest.raises(SystemExit, match=r"an exception needs its reason: pkg/big.py"):
        module_sizes.main(root)


def test_an_exception_that_outlived_its_module_fails(tmp_path, capsys):
    exceptions = '[tool.module-sizes.exceptions]\n"pkg/cut.py" = "was big"\n"pkg/gone.py" = "was big"\n'
    root = tree(tmp_path, {"pkg/cut.py": 3}, exceptions)
    assert module_sizes.main(root) == 1
    assert capsys.readouterr().err.splitlines() == [
        "pkg/cut.py: named under [tool.module-sizes.exceptions], but it is within 5 lines: take the exception out",
        "pkg/gone.py: named under [tool.module-sizes.exceptions], but there is no such module: take the exception out",
    ]


def test_the_project_holds_its_modules_to_the_limit_it_states():
    limits = module_sizes.limits_from(module_sizes.tomllib.loads((ROOT / "pyproject.toml").read_text()))
    assert limits.max_lines == 700
    assert module_sizes.too_long(ROOT, limits) == []
