"""The house keeps its shape: every module is on the code map, every package in the layer table, and
the import-linter contracts are kept (run here too, so `pytest` alone catches a broken layer)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"


def _has_code(path: Path) -> bool:
    """A package marker with only a docstring needs no line; one with code does."""
    body = ast.parse(path.read_text()).body
    return len(body) > 1 or (bool(body) and not isinstance(body[0], ast.Expr))


def _modules() -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for p in (ROOT / "deployer").rglob("*.py")
        if p.name != "__init__.py" or _has_code(p)
    }


def _mapped() -> set[str]:
    return set(re.findall(r"^- `(deployer/[\w/]+\.py)`:", MAP.read_text(), re.M))


def test_every_module_has_one_line_on_the_code_map_and_every_line_a_module() -> None:
    modules, mapped = _modules(), _mapped()
    assert "deployer/up/deployment.py" in modules and "deployer/up/deployment.py" in mapped
    assert not modules - mapped, (
        f"modules without a line in docs/architecture.md: {modules - mapped}"
    )
    assert not mapped - modules, f"lines naming no module: {mapped - modules}"


def test_every_package_has_a_row_in_the_layer_table() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", MAP.read_text(), re.M)
    packages = {p.parent.name for p in (ROOT / "deployer").glob("*/__init__.py")}
    assert {"cli", "up", "config", "core"} <= packages
    assert sorted(rows) == sorted(packages), (
        f"docs/architecture.md's layer table and deployer/'s packages differ: {rows} {packages}"
    )


def test_the_layer_contract_names_every_package_once() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    packages = {f"deployer.{p.parent.name}" for p in (ROOT / "deployer").glob("*/__init__.py")}
    assert sorted(layers) == sorted(packages), "a new package needs its place in the layers"


@pytest.mark.skipif(
    shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
    reason="import-linter is not installed (pip install -e '.[dev]')",
)
def test_the_import_contracts_are_kept() -> None:
    tool = str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run(
        [tool, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    kept = re.findall(r"^(.*) KEPT$", result.stdout, re.M)
    assert result.returncode == 0, result.stdout[-3000:]
    assert len(kept) >= 4, result.stdout[-3000:]


def test_the_roles_table_and_the_host_side_agree_on_the_cluster_roles() -> None:
    """remote/tfserver.py serves exactly the roles the plan lists in every cluster dict."""
    from deployer.config.roles import CLUSTER_ROLES
    from remote import protocol

    assert CLUSTER_ROLES == protocol.CLUSTER_ROLES == ("chief", "worker", "ps")


def test_every_module_a_docstring_or_comment_names_exists() -> None:
    """A `name.py` in deployer/'s text is a pointer for the reader: it must lead somewhere (a
    renamed or split module leaves stale ones behind). A path is looked up from the root or
    from deployer/; a bare name anywhere in the repository's code."""
    files = [
        p
        for top in ("deployer", "remote", "tests", "examples", "bench", "scripts")
        for p in (ROOT / top).rglob("*.py")
    ]
    names = {p.name for p in files}
    stale = []
    for path in sorted((ROOT / "deployer").rglob("*.py")):
        for named in set(re.findall(r"[A-Za-z_][\w./-]*\.py\b", path.read_text())):
            if "/" in named:
                found = (ROOT / named).is_file() or (ROOT / "deployer" / named).is_file()
            else:
                found = named in names
            if not found:
                stale.append(f"{path.relative_to(ROOT)}: {named}")
    assert not stale, f"modules named that do not exist: {stale}"
