"""The control side's import graph: no circles, and planning never loads an SSH stack."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runtime_imports(path: Path) -> set[str]:
    """deployer modules `path` imports when loaded (imports under TYPE_CHECKING don't count)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:  # module level only: a function-level import is deliberate laziness
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and sub.module:
                if sub.module == "deployer":
                    found.update(f"deployer.{a.name}" for a in sub.names)
                elif sub.module.startswith("deployer."):
                    found.add(sub.module)
            elif isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names if a.name.startswith("deployer."))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for p in (ROOT / "deployer").glob("**/*.py")
    }
    return {name: _runtime_imports(path) & modules.keys() for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_deployer_has_no_import_circles() -> None:
    graph = import_graph()
    assert "deployer.hosts.transport" in graph and graph["deployer.cli.main"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


@pytest.mark.parametrize(
    "module",
    [
        "deployer.config.plan",
        "deployer.api.render",
        "deployer.config.inventory",
        "deployer.hosts.transport",
        "deployer.cli.main",
    ],
)
def test_planning_and_rendering_load_no_ssh_stack(module: str) -> None:
    probe = f"import sys, {module}; print([m for m in ('paramiko', 'fabric') if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", f"{module} loads {out.stdout.strip()}"
