"""`tfdeploy exec`: one command on every host in parallel, output prefixed by host."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab

pytestmark = pytest.mark.lab


def _exec(inventory: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deployer", "exec", str(inventory), "--", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"TFDEPLOY_STATE_DIR": "/nonexistent-state"},
    )


def test_exec_runs_on_every_host_and_prefixes_output(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    hosts = clean_lab.hosts[:3]
    inventory = lab_inventory([[{"role": "worker"}]] * 3, job={"name": "ex"})
    result = _exec(inventory, "echo $(hostname) 'a  b' \"$HOME\"")
    assert result.returncode == 0, result.stderr
    lines = sorted(result.stdout.splitlines())
    # Each host answers with its own hostname: the command really ran on every host.
    home = pwd.getpwnam(clean_lab.user).pw_dir  # /root in the namespace lab
    assert lines == sorted(f"{h.name} | {h.hostname} a  b {home}" for h in hosts)


def test_exec_keeps_an_argv_verbatim_and_reports_failures(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    inventory = lab_inventory([[{"role": "worker"}]] * 2, job={"name": "ex"})
    marker = f"/root/exec-marker-{os.getpid()}"
    result = _exec(inventory, "printf", "%s|", f"$(touch {marker})", "x y")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(f"| $(touch {marker})|x y|") == 2
    for host in clean_lab.hosts[:2]:  # the substitution was printed, never run, on each host
        assert clean_lab.run(host, ["test", "-e", marker]).returncode == 1
    failing = _exec(inventory, "exit 3")
    assert failing.returncode == 1
    assert failing.stdout.count("exit code 3") == 2
