"""The tests mirror the house: tests/unit/ runs in-process, every test in tests/integration/ needs
the lab (it is marked `lab`), tests/meta/ holds the checks of the house itself (its layout, its
layers, its protocol words, its docs), which scripts/test.sh runs with the lint before the suite,
and no file of tests imports a test file; what several test files share lives in tests/support/
(helpers) and the conftests (fixtures).

The tier check runs inside every pytest session, on the items it collected, after the conftests
marked them (tests/conftest.py): a misplaced test fails itself, saying where it belongs. It used
to be a test that collected the whole of tests/ again in a subprocess (~6 s of CPU per run);
the whole suite (scripts/test.sh, CI) collects every test anyway, so nothing is checked less.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
MISPLACED = pytest.StashKey[str]()
TIERS = ("unit", "integration", "meta")


def is_test_module(name: str) -> bool:
    """tests.test_x, or anything in the tiers' packages (tests.unit.test_x, tests.integration.*)."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "tests":
        return False
    return parts[1].startswith("test_") or parts[1] in TIERS


def imports_of_tests(path: Path, source: str) -> list[str]:
    """`file:line: module` for each import of a test module in `source` (the file at `path`), in
    line order, wherever it is (module level or inside a function), absolute or relative."""
    package = path.relative_to(ROOT).parent.parts
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else ()
            base = ".".join([*anchor, node.module] if node.module else anchor)
            names = [base] if is_test_module(base) else [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if is_test_module(n)]
    return [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in sorted(found)]


def tier_problem(nodeid: str, lab: bool) -> str | None:
    """What is wrong with where a test is, from its node id and whether it is marked lab."""
    if nodeid.startswith("tests/unit/") and lab:
        return (
            f"{nodeid}: needs the lab (marked or asks for a lab fixture): move it "
            "to tests/integration/"
        )
    if nodeid.startswith("tests/integration/") and not lab:
        return f"{nodeid}: in tests/integration/ but not marked lab"
    if nodeid.startswith("tests/meta/") and lab:
        return f"{nodeid}: a check of the house needs no lab: move it to tests/integration/"
    if not nodeid.startswith(tuple(f"tests/{tier}/" for tier in TIERS)):
        return f"{nodeid}: belongs in tests/unit/, tests/integration/ or tests/meta/"
    return None


def tier_problems(items: list[tuple[str, bool]]) -> list[str]:
    """What is in the wrong place, from (node id, marked lab) pairs of a collection of tests/."""
    return [p for nodeid, lab in items if (p := tier_problem(nodeid, lab)) is not None]


def mark_misplaced(items: list[pytest.Item]) -> None:
    """Stashes the problem on each misplaced item; the `_in_its_tier` fixture fails it."""
    for item in items:
        problem = tier_problem(item.nodeid, item.get_closest_marker("lab") is not None)
        if problem is not None:
            item.stash[MISPLACED] = problem
