"""stdout closed (`>&-`) or on a full disk (`>/dev/full`): tfdeploy runs as with `>/dev/null`,
never a traceback; a full stdout is one warning on stderr naming it (issue 39)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tfdeploy(shell_redirect: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m deployer ARGS` started by a shell with `shell_redirect` applied."""
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {shell_redirect}', "sh", sys.executable, "-m", "deployer", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize("args", [["--help"], ["plan", "nonexistent.toml"]], ids=["help", "error"])
def test_a_closed_stdout_runs_as_with_dev_null(args: list[str]) -> None:
    closed = tfdeploy(">&-", *args)
    null = tfdeploy(">/dev/null", *args)
    assert "Traceback" not in closed.stderr, closed.stderr
    assert (closed.returncode, closed.stderr) == (null.returncode, null.stderr)


def test_a_full_stdout_is_one_warning_naming_it() -> None:
    full = tfdeploy(">/dev/full", "--help")
    assert full.returncode == 0, full.stderr
    assert "Traceback" not in full.stderr
    assert full.stderr.splitlines() == [
        "tfdeploy: warning: cannot write to stdout (/dev/full): No space left on device; its "
        "output is dropped, the work goes on"
    ]
