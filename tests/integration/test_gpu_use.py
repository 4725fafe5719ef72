"""GPUs on the lab while a run lives and after it: `status`'s per-task GPU use, preflight waiting
for an earlier attempt of the same run, and `up`'s teardown proof (pids, and memory.used where
pids cannot be matched). Preflight's refusals and `down`'s proof: tests/integration/test_gpus.py.

tests/fakes/nvidia-smi is a HARDWARE STAND-IN (the lab has no GPUs), put in /root/bin of one lab
host; its state file lists compute processes, by pid or by a marker in live processes' command
lines. Everything else is real: sshd, the agent, the tasks and their environments.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.config.model import NetcheckMode
from deployer.config.plan import make_plan
from deployer.core.errors import HostsFailed
from deployer.hosts.fleet import Fleet
from deployer.sources import load_inventory
from deployer.up.preflight import Claim, preflight
from tests.lab import Lab, LabHost
from tests.support.gpus import install, state, uuid

NVIDIA_SMI_PER_HOST = "a different nvidia-smi stand-in on each host, in root's own home"


@pytest.fixture
def fake_nvidia_smi(lab: Lab) -> Iterator[Callable[..., None]]:
    """install(host, state_json): the stand-in on that host (tests/support/gpus.py)."""
    used: list[LabHost] = []

    def put(host: LabHost, state_json: str | None = None) -> None:
        used.append(host)
        install(lab, host, state_json)

    yield put
    for host in used:
        lab.run(host, "rm -rf /root/bin")


def _tfdeploy(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "deployer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.lab
@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
def test_status_shows_each_running_tasks_gpu_memory_and_utilization(
    clean_lab: Lab, lab_inventory: Any, fake_nvidia_smi: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    gpu_host, cpu_host = lab.hosts[0], lab.hosts[1]  # the CPU host has no nvidia-smi at all
    code = tmp_path / "code"
    code.mkdir()
    (code / "gpuhold.py").write_text(
        "import time\nprint('on the GPU', flush=True)\ntime.sleep(600)\n"
    )
    # GPU 1 runs at 40%; the driver lists the task's process there with 500 MiB, and a
    # stranger's process on GPU 0 (no task's) that no task must be charged with.
    apps = [
        {"gpu": 1, "cmdline": "gpuhold.py", "used_memory": 500},
        {"gpu": 0, "pid": 4242, "used_memory": 900},
    ]
    fake_nvidia_smi(gpu_host, state(2, util=[90, 40], apps=apps))
    path = lab_inventory(
        [[{"role": "worker", "gpus": [1]}], [{"role": "worker"}]],
        code=code,
        job={"name": "gpuuse", "command": f"{lab.python} gpuhold.py"},
        per_host={gpu_host.name: {"allow_busy_gpus": True}},
    )
    started = _tfdeploy(tmp_path, "up", "--detach", str(path))
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        table = _tfdeploy(tmp_path, "status", str(path))
        listed = _tfdeploy(tmp_path, "status", "--json", str(path))
    finally:
        stopped = _tfdeploy(tmp_path, "down", str(path))
    assert table.returncode == 0, table.stdout + table.stderr
    header = next(line for line in table.stdout.splitlines() if " task " in line)
    assert " GPU " in header, table.stdout
    rows = {line.split()[1]: line for line in table.stdout.splitlines() if "worker:" in line}
    assert "40% 500 MiB" in rows["worker:0"], table.stdout
    assert "MiB" not in rows["worker:1"], table.stdout
    tasks = {t["name"]: t for r in json.loads(listed.stdout)["runs"] for t in r["tasks"]}
    assert tasks["worker:0"]["gpu"] == {"gpus": [1], "memory_mib": 500, "utilization": 40}
    assert tasks["worker:1"]["gpu"] is None  # a host without nvidia-smi: nothing, no error
    assert listed.returncode == 0 and json.loads(listed.stdout)["unreachable"] == []
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert cpu_host.name in table.stdout


EARLIER = "import time; time.sleep({seconds})  # earlier-attempt"


@pytest.mark.lab
@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
def test_preflight_waits_for_an_earlier_attempts_gpu_process_of_the_same_run(
    clean_lab: Lab, lab_inventory: Any, fake_nvidia_smi: Any, tmp_path: Path
) -> None:
    """A replaced host makes `up` run preflight again under the same run id (recovery.py):
    the previous attempt's process may still be listed on a planned GPU while the driver lets
    go of it. It is waited for (up to gpu_release_s), not refused as another job's, and one
    that never goes is named as the run's."""
    lab = clean_lab
    host = lab.hosts[0]
    fake_nvidia_smi(
        host, state(apps=[{"gpu": 0, "cmdline": "earlier-attempt", "used_memory": 700}])
    )
    code = tmp_path / "code"
    code.mkdir()
    (code / "x.py").write_text("print('never')\n")
    path = lab_inventory(
        [[{"role": "worker", "gpus": [0]}]],
        code=code,
        job={"name": "gpuagain", "command": f"{lab.python} x.py"},
        per_host={host.name: {"gpu_release_s": 15}},
    )
    plan = make_plan(load_inventory(str(path)))
    run_id = "gpuagain-20260101T000000Z-ab12"

    def earlier(seconds: float) -> None:
        """A process of the run's previous attempt (its environment says so), on GPU 0."""
        command = EARLIER.format(seconds=seconds)
        done = lab.run(
            host,
            f"TFDEPLOY_RUN_ID={run_id} TFDEPLOY_TASK=worker:0 setsid nohup {lab.python} -c "
            f"'{command}' >/dev/null 2>&1 < /dev/null &",
        )
        assert done.returncode == 0, done.stderr

    def gone() -> bool:
        return lab.run(host, "pgrep -f 'earlier[-]attempt'").returncode != 0

    with Fleet(plan.hosts) as fleet:
        earlier(3)
        began = time.monotonic()
        preflight(plan, fleet, Claim(run_id, 60), network=NetcheckMode.OFF)
        waited = time.monotonic() - began
        fleet.member(host.name).agent.release(run_id)
    assert gone(), "preflight returned while the earlier attempt still held the GPU"
    assert waited < 15, waited

    path.write_text(re.sub(r"gpu_release_s = 15\b", "gpu_release_s = 2", path.read_text()))
    plan = make_plan(load_inventory(str(path)))
    earlier(600)
    try:
        with Fleet(plan.hosts) as fleet, pytest.raises(HostsFailed) as failed:
            preflight(plan, fleet, Claim(run_id, 60), network=NetcheckMode.OFF)
    finally:
        lab.run(host, "pkill -f 'earlier[-]attempt'")
    said = str(failed.value)
    assert re.search(
        rf"{host.name}: GPU 0 \({uuid(0)}\) still holds pid \d+ \(python3, 700 MiB\) of the run "
        r"after the stop \(waited 2 s",
        said,
    ), said
    assert "already runs compute process" not in said  # not refused as another job's


MODES = {
    # The task's CUDA context, as a container's process: the driver lists a pid this host cannot
    # see (another PID namespace). It lets go before the task exits, or never.
    "foreign-freed": "add(99999999); time.sleep(2); remove(99999999)",
    "foreign-kept": "add(99999999); time.sleep(2)",
    # The task's own pid stays listed with its memory after it is gone (a stuck context).
    "own-kept": "add(os.getpid()); time.sleep(2)",
}
TASK = (
    "import json, os, time\n"
    "state = os.path.expanduser('~/bin/nvidia-smi.json')\n"
    "def change(f):\n"
    "    data = json.load(open(state)); f(data['apps']); json.dump(data, open(state, 'w'))\n"
    "def add(pid):\n"
    "    change(lambda a: a.append({'gpu': 0, 'pid': pid, 'used_memory': 700}))\n"
    "def remove(pid):\n"
    "    change(lambda a: a.remove({'gpu': 0, 'pid': pid, 'used_memory': 700}))\n"
    "{mode}\n"
)


@pytest.mark.lab
@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
@pytest.mark.parametrize("mode", list(MODES))
def test_up_teardown_warns_of_gpu_memory_still_held_after_the_stop(
    mode: str, clean_lab: Lab, lab_inventory: Any, fake_nvidia_smi: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    host = lab.hosts[0]
    fake_nvidia_smi(host, state(used=300, apps=[]))
    code = tmp_path / "code"
    code.mkdir()
    (code / "task.py").write_text(TASK.replace("{mode}", MODES[mode]))
    path = lab_inventory(
        [[{"role": "worker", "gpus": [0]}]],
        code=code,
        job={"name": "gpuleft", "command": f"{lab.python} task.py"},
        per_host={host.name: {"gpu_release_s": 2}},
    )
    done = _tfdeploy(tmp_path, "up", str(path))
    said = done.stdout + done.stderr
    assert done.returncode == 0, said  # the job's own outcome stays the exit status
    warning = re.search(r"warning: .*GPU 0.*\n?.*checks again", said)
    if mode == "foreign-freed":
        assert warning is None, said  # memory.used came back to its 300 MiB: released
    elif mode == "foreign-kept":
        assert re.search(
            rf"warning: {host.name}: GPU 0 \({uuid(0)}\) uses 1000 MiB, 300 MiB before the run; "
            r"processes this host cannot match to the run \(another PID namespace\): "
            r"pid 99999999 \(python3, 700 MiB\) after the stop \(waited 2 s",
            said,
        ), said
    else:
        assert re.search(
            rf"warning: {host.name}: GPU 0 \({uuid(0)}\) still holds pid \d+ \(python3, 700 MiB\) "
            r"of the run after the stop \(waited 2 s for the driver to free it\); `tfdeploy down "
            r"gpuleft-\S+` checks again",
            said,
        ), said
