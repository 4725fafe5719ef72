"""The host side stays stdlib-only: hosts have a bare interpreter, nothing pip-installed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REMOTE = Path(__file__).resolve().parent.parent / "remote"
# tfserver.py imports TensorFlow on purpose (inside its main), and only it may.
MODULES = sorted(p for p in REMOTE.glob("*.py") if p.name != "tfserver.py")
SIBLINGS = {p.stem for p in REMOTE.glob("*.py")}


def imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import; hosts run these as scripts"
            names.add((node.module or "").split(".")[0])
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_imports_only_the_stdlib_and_siblings(path: Path) -> None:
    foreign = imported_names(path) - set(sys.stdlib_module_names) - SIBLINGS - {"__future__"}
    assert not foreign, f"{path.name} imports non-stdlib modules: {sorted(foreign)}"


def test_modules_import_as_top_level_scripts_do_on_hosts() -> None:
    # -I: no site-packages, no PYTHON* env, no cwd on sys.path: just the agent's directory.
    names = ", ".join(p.stem for p in MODULES if p.stem != "__init__")
    code = f"import sys; sys.path.insert(0, {str(REMOTE)!r}); import {names}"
    subprocess.run([sys.executable, "-I", "-c", code], check=True, timeout=30)
