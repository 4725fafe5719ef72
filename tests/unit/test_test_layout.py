"""The tests mirror the house: tests/unit/ runs in-process, every test in tests/integration/ needs
the lab (it is marked `lab`), and no file of tests imports a test file; what several test files
share lives in tests/support/ (helpers) and the conftests (fixtures).

Markers are read from pytest's own collection of the whole of tests/ (in a subprocess: this run
may have selected one tier only), after the conftests marked what they mark.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def is_test_module(name: str) -> bool:
    """tests.test_x, or anything in the tiers' packages (tests.unit.test_x, tests.integration.*)."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "tests":
        return False
    return parts[1].startswith("test_") or parts[1] in ("unit", "integration")


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


def tier_problems(items: list[tuple[str, bool]]) -> list[str]:
    """What is in the wrong place, from (node id, marked lab) pairs of a collection of tests/."""
    problems = []
    for nodeid, lab in items:
        if nodeid.startswith("tests/unit/") and lab:
            problems.append(
                f"{nodeid}: needs the lab (marked or asks for a lab fixture): move it "
                "to tests/integration/"
            )
        elif nodeid.startswith("tests/integration/") and not lab:
            problems.append(f"{nodeid}: in tests/integration/ but not marked lab")
        elif not nodeid.startswith(("tests/unit/", "tests/integration/")):
            problems.append(f"{nodeid}: belongs in tests/unit/ or tests/integration/")
    return problems


# Collects tests/ as `pytest --collect-only` does and writes (node id, marked lab) of every test.
COLLECT = textwrap.dedent(
    """
    import json, sys
    import pytest

    class Record:
        items = []

        @pytest.hookimpl(trylast=True)  # after the conftests' own marking
        def pytest_collection_modifyitems(self, items):
            Record.items = [(i.nodeid, i.get_closest_marker("lab") is not None) for i in items]

    code = pytest.main(
        # --assert=plain: markers need no assertion rewriting, which is most of collecting's CPU
        ["--collect-only", "-q", "--assert=plain", "-p", "no:xdist", "-p", "no:cacheprovider",
         sys.argv[1]],
        plugins=[Record()],
    )
    with open(sys.argv[2], "w") as f:
        json.dump({"code": int(code), "items": Record.items}, f)
    """
)


def test_the_import_check_finds_imports_of_test_files() -> None:
    source = textwrap.dedent(
        """
        import tests.lab
        from tests.support.agent import call
        from tests.test_agent import workdir
        from tests.unit.test_agent import call as other
        from tests import test_agent
        from tests.integration import conftest
        from .test_deployment import Harness
        from ..integration.test_faults import Up
        def later():
            import tests.integration.test_lab
        """
    )
    found = imports_of_tests(TESTS / "unit" / "test_x.py", source)
    assert [line.split(": ", 1)[1] for line in found] == [
        "tests.test_agent",
        "tests.unit.test_agent",
        "tests.test_agent",
        "tests.integration",
        "tests.unit.test_deployment",
        "tests.integration.test_faults",
        "tests.integration.test_lab",
    ]
    assert found[0] == "tests/unit/test_x.py:4: tests.test_agent"


def test_the_tier_check_finds_misplaced_tests() -> None:
    items = [
        ("tests/unit/test_a.py::test_fine", False),
        ("tests/unit/test_a.py::test_on_the_lab", True),
        ("tests/integration/test_b.py::test_fine", True),
        ("tests/integration/test_b.py::test_in_process", False),
        ("tests/test_c.py::test_anywhere", False),
    ]
    assert [p.split(": ")[0] for p in tier_problems(items)] == [
        "tests/unit/test_a.py::test_on_the_lab",
        "tests/integration/test_b.py::test_in_process",
        "tests/test_c.py::test_anywhere",
    ]


def test_no_file_of_tests_imports_a_test_file() -> None:
    paths = sorted(TESTS.rglob("*.py"))
    found = [hit for path in paths for hit in imports_of_tests(path, path.read_text())]
    assert not found, "move what is shared to tests/support/ (or a conftest):\n" + "\n".join(found)


def test_unit_is_in_process_and_integration_is_the_lab(tmp_path: Path) -> None:
    out = tmp_path / "collected.json"
    done = subprocess.run(
        [sys.executable, "-c", COLLECT, str(TESTS), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.exists(), done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["code"] == 0, "collecting tests/ failed:\n" + done.stdout[-3000:]
    items = [(nodeid, lab) for nodeid, lab in result["items"]]
    assert any(n.startswith("tests/unit/") for n, _ in items), items[:5]
    assert any(n.startswith("tests/integration/") for n, _ in items), items[:5]
    problems = tier_problems(items)
    assert not problems, "\n".join(problems)
