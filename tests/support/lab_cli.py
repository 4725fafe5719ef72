"""The real CLI as a subprocess, as a user runs it, and what lab tests read from its output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "digits"
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def tfdeploy(
    *args: str, state: Path, timeout: float = 300, check_rc: int | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs the CLI the way a user does, with its own local state directory."""
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "deployer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check_rc is not None:
        assert result.returncode == check_rc, (
            f"exit {result.returncode}, expected {check_rc}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
    return result


def accuracies(output: str) -> dict[str, float]:
    """test_accuracy per task label from the prefixed log lines."""
    found = re.findall(r"^(\S+@\S+)\s+\| test_accuracy=([0-9.]+)$", output, re.M)
    return {label: float(value) for label, value in found}
