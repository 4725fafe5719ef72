"""The suite's budget (tests/support/budget.py): a run over it fails and names its slowest tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *args]
    return subprocess.run(argv, cwd=CHECKOUT, capture_output=True, text=True, timeout=300)


def test_a_run_over_its_budget_fails_listing_its_slowest_tests() -> None:
    done = _pytest("tests/unit/test_rules.py", "--suite-budget=0.01")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "SUITE BUDGET EXCEEDED" in done.stdout and "budget 0.01 s" in done.stdout, done.stdout
    listed = [line for line in done.stdout.splitlines() if " s  tests/unit/test_rules.py::" in line]
    assert len(listed) == 15, done.stdout
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout


def test_the_budget_is_one_setting_in_pyproject() -> None:
    text = (CHECKOUT / "pyproject.toml").read_text()
    assert text.count("suite_budget_s = ") == 1, "one number for the integrator to change"
