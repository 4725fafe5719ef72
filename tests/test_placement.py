"""CPU placement: `threads = N` sizes TF and OpenMP thread pools, `cpus` pins the task process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deployer.config.inventory import load_inventory
from deployer.config.plan import make_plan, thread_env
from tests.lab import Lab

THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def _plan(tmp_path: Path, tasks: str, job_env: str = "{}") -> Any:
    (tmp_path / "code").mkdir(exist_ok=True)
    inventory = tmp_path / "inv.toml"
    inventory.write_text(
        f'[job]\nname = "p"\ncode = "code"\ncommand = "python3 t.py"\nenv = {job_env}\n\n'
        f'[[hosts]]\naddress = "10.0.0.1"\ntasks = {tasks}\n'
    )
    return make_plan(load_inventory(inventory))


def test_threads_set_tf_and_openmp_pools(tmp_path: Path) -> None:
    plan = _plan(tmp_path, '[{ role = "worker", threads = 4, cpus = "0-3" }]')
    (task,) = plan.tasks
    assert [task.env[v] for v in THREAD_VARS] == ["4", "4", "4"]
    assert task.cpus == "0-3"


def test_one_thread_keeps_two_inter_op_threads() -> None:
    # TF_NUM_INTEROP_THREADS=1 deadlocks ParameterServerStrategy servers (TF 2.21).
    assert thread_env(1) == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "2",
        "OMP_NUM_THREADS": "1",
    }


def test_no_threads_no_cpus_leave_tf_defaults(tmp_path: Path) -> None:
    (task,) = _plan(tmp_path, '[{ role = "worker" }]').tasks
    assert not set(THREAD_VARS) & set(task.env)
    assert task.cpus is None


def test_explicit_env_wins_over_threads(tmp_path: Path) -> None:
    plan = _plan(tmp_path, '[{ role = "worker", threads = 3 }]', '{ OMP_NUM_THREADS = "1" }')
    (task,) = plan.tasks
    assert task.env["OMP_NUM_THREADS"] == "1"
    assert task.env["TF_NUM_INTRAOP_THREADS"] == "3"


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
        spec_path = f"/root/.tfdeploy/hosts/*/runs/{run_id.group(1)}/tasks/worker-0/spec.json"
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


def test_pinned_tasks_keep_two_inter_op_threads(tmp_path: Path) -> None:
    # TF sizes its inter-op pool from the affinity mask: one CPU would make it 1 and hang PSS.
    one, four = _plan(
        tmp_path, '[{ role = "worker", cpus = "1" }, { role = "ps", cpus = "0-1,4-5" }]'
    ).tasks
    assert one.env["TF_NUM_INTEROP_THREADS"] == "2"
    assert four.env["TF_NUM_INTEROP_THREADS"] == "4"
    assert "TF_NUM_INTRAOP_THREADS" not in one.env
