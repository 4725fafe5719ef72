"""CPU placement on the lab: `cpus` pins the real task process, and CPUs a host lacks fail the
start with the reason (what the plan sets: tests/unit/test_placement.py).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab


def _tfdeploy(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "deployer", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _task_pid(lab: Lab, host: str, marker: str) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for p in lab.processes(host):
            if p.cmdline.startswith(f"sleep {marker}"):
                return p.pid
        time.sleep(0.05)
    raise AssertionError(f"no 'sleep {marker}' on {host}")


@pytest.mark.lab
def test_cpus_pin_the_real_task_process(clean_lab: Lab, lab_inventory: Any, tmp_path: Path) -> None:
    lab = clean_lab
    host = lab.hosts[0]
    usable = os.sched_getaffinity(0)
    cpu = max(usable)  # the last CPU: differs from the default (all) on any multi-core machine
    inventory = lab_inventory(
        [[{"role": "worker", "threads": 3, "cpus": str(cpu), "command": "sleep 97.5"}]],
        code=tmp_path,
    )
    up = _tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        pid = _task_pid(lab, host.name, "97.5")
        status = lab.run(host, f"cat /proc/{pid}/status").stdout
        allowed = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        assert allowed.split(":")[1].strip() == str(cpu)
        environ = lab.run(host, f"cat /proc/{pid}/environ").stdout.split("\0")
        assert "TF_NUM_INTRAOP_THREADS=3" in environ
        assert "TF_NUM_INTEROP_THREADS=3" in environ
        assert "OMP_NUM_THREADS=3" in environ
        # The supervisor recorded the pinning it applied, for anyone reading the run later.
        run_id = re.search(r"run (\S+) is running detached", up.stdout)
        assert run_id, up.stdout
        home = pwd.getpwnam(lab.user).pw_dir  # /root in the namespace lab
        spec_path = f"{home}/.tfdeploy/hosts/*/runs/{run_id.group(1)}/tasks/worker-0/spec.json"
        spec = lab.run(host, f"cat {spec_path}").stdout
        assert json.loads(spec)["cpus"] == [cpu]
    finally:
        down = _tfdeploy("down", str(inventory), state=tmp_path / "state")
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.lab
def test_cpus_the_host_lacks_fail_the_start_with_the_reason(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    inventory = lab_inventory(
        [[{"role": "worker", "cpus": "0-4095", "command": "sleep 97.6"}]], code=tmp_path
    )
    up = _tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state")
    assert up.returncode != 0
    assert "are not all on this host" in up.stderr
