"""The house keeps its shape: every module is on the code map, every package in the README, and
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


def test_every_package_has_a_line_in_the_readme() -> None:
    """In README's architecture table, or docs/architecture.md's layer table (where the README
    links for the layers: a package added while the README is rewritten is listed there)."""
    readme, layers = (ROOT / "README.md").read_text(), MAP.read_text()
    packages = {p.parent.name for p in (ROOT / "deployer").glob("*/__init__.py")}
    assert {"cli", "up", "config", "core"} <= packages
    missing = {
        p for p in packages if f"| `deployer/{p}` |" not in readme and f"| `{p}` |" not in layers
    }
    assert not missing, f"packages without a line in README's architecture table: {missing}"


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
