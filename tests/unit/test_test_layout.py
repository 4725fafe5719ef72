"""The tests mirror the house (tests/support/layout.py): tests/unit/ runs in-process, every test in
tests/integration/ needs the lab, and no file of tests imports a test file. The tier check itself
runs in every session (tests/conftest.py fails a misplaced test); here its parts are tested, and
a misplaced test is shown to fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.support.layout import ROOT, TESTS, imports_of_tests, tier_problems


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
        ("tests/meta/test_d.py::test_fine", False),
        ("tests/meta/test_d.py::test_on_the_lab", True),
    ]
    assert [p.split(": ")[0] for p in tier_problems(items)] == [
        "tests/unit/test_a.py::test_on_the_lab",
        "tests/integration/test_b.py::test_in_process",
        "tests/test_c.py::test_anywhere",
        "tests/meta/test_d.py::test_on_the_lab",
    ]


def test_no_file_of_tests_imports_a_test_file() -> None:
    paths = sorted(TESTS.rglob("*.py"))
    found = [hit for path in paths for hit in imports_of_tests(path, path.read_text())]
    assert not found, "move what is shared to tests/support/ (or a conftest):\n" + "\n".join(found)


def test_a_test_in_the_wrong_tier_fails_saying_where_it_belongs() -> None:
    # A test marked `lab` in tests/unit/, where the session's tier check finds it.
    misplaced = TESTS / "unit" / f"test_zz_misplaced_probe_{os.getpid()}.py"
    misplaced.write_text("import pytest\n\n@pytest.mark.lab\ndef test_on_the_lab():\n    pass\n")
    try:
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
        done = subprocess.run(
            [*argv, str(misplaced)], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
    finally:
        misplaced.unlink()
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "1 error" in out, out
    assert "needs the lab (marked or asks for a lab fixture): move it to tests/integration/" in out
