"""GPUs on the lab: `up` with gpus = "auto" and preflight's GPU errors (the pure checks, the
agent's op and the view: tests/unit/test_gpus.py).

The lab has no GPUs. tests/fakes/nvidia-smi is a HARDWARE STAND-IN: a shell script printing
canned CSV in nvidia-smi's format, put in /root/bin of one lab host (each host has a private
/root; the agent looks in ~/bin after PATH, see remote/gpuinfo.py). Everything else is real: sshd,
the agent, the tasks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from deployer.config.inventory import parse_inventory
from deployer.config.plan import make_plan
from deployer.hosts.fleet import Fleet
from deployer.up.deployment import Deployment, UpOptions
from deployer.watch.view import TaskRow
from tests.lab import Lab, LabHost
from tests.support.gpus import install as install_fake
from tests.support.gpus import state, uuid

# -- on the lab, with the stand-in on one host ---------------------------------------------------

# Each host gets a stand-in nvidia-smi of its own in root's home (one with GPUs, one failing, one
# without): loopback hosts share one home, so they cannot differ.
NVIDIA_SMI_PER_HOST = "a different nvidia-smi stand-in on each host, in root's own home"


@pytest.fixture
def fake_nvidia_smi(lab: Lab) -> Iterator[Callable[..., None]]:
    """install(host, state_json): the stand-in in that host's /root/bin, reading that state
    (tests/support/gpus.py `state`); again on the same host: the new state only."""
    used: list[LabHost] = []

    def install(host: LabHost, state_json: str | None = None) -> None:
        used.append(host)
        install_fake(lab, host, state_json)

    yield install
    for host in used:
        lab.run(host, "rm -rf /root/bin")


class RecordingView:
    """A View that keeps what it was shown (a real renderer's input, not a mock of one)."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.phases: list[str] = []
        self.output: list[str] = []
        self.rows: list[list[TaskRow]] = []

    def step(self, text: str) -> None:
        self.steps.append(text)

    def phase(self, text: str) -> None:
        self.phases.append(text)

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self.output += [f"{label} | {line}" for line in lines]

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        self.rows.append(list(rows))

    def close(self) -> None:
        pass


SHOW_ENV = (
    "import os, time\n"
    "names = ('CUDA_VISIBLE_DEVICES', 'LD_LIBRARY_PATH', 'CUDA_CACHE_PATH', 'NOT_FORWARDED')\n"
    "print('env', *(f'{n}={os.environ.get(n, \"-\")}' for n in names), flush=True)\n"
    "time.sleep(float(os.environ.get('SLEEP', '0')))\n"
)


@pytest.mark.lab
@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
def test_up_with_auto_gpus_assigns_warns_and_shows_usage(
    clean_lab: Lab, lab_inventory: Any, fake_nvidia_smi: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    gpu_host, cpu_host = lab.hosts[0], lab.hosts[1]
    fake_nvidia_smi(
        gpu_host,
        state(util=[30, 50, 70, 90], used=1024, apps=[{"gpu": 3, "pid": 999, "used_memory": 10}]),
    )
    code = tmp_path / "code"
    code.mkdir()
    (code / "show.py").write_text(SHOW_ENV)
    path = lab_inventory(
        [[{"role": "worker", "count": 2}], [{"role": "worker"}]],
        code=code,
        job={
            "name": "gpus",
            "command": f"{lab.python} show.py",
            "env": {"SLEEP": "4"},
            "forward_env": ["LD_LIBRARY_PATH", "CUDA_CACHE_PATH", "UNSET_HERE"],
        },
    )
    text = path.read_text().replace(
        f'name = "{gpu_host.name}"',
        f'name = "{gpu_host.name}"\ngpus = "auto"\nallow_busy_gpus = true',
        1,
    )
    path.write_text(text)
    plan = make_plan(parse_inventory(__import__("tomllib").loads(text), path))
    view = RecordingView()
    environ = {
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "CUDA_CACHE_PATH": "/c",
        "NOT_FORWARDED": "x",
    }
    with Fleet(plan.hosts) as fleet:
        deployment = Deployment(plan, fleet, view, UpOptions(poll_interval=0.5), environ=environ)
        assert deployment.run() == 0, view.steps
    envs = {line.split(" | ")[0]: line.split(" | ")[1] for line in view.output if " | env " in line}
    rest = "LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_CACHE_PATH=/c NOT_FORWARDED=-"
    assert envs == {
        f"worker:0@{gpu_host.name}": f"env CUDA_VISIBLE_DEVICES=0,1 {rest}",
        f"worker:1@{gpu_host.name}": f"env CUDA_VISIBLE_DEVICES=2,3 {rest}",
        f"worker:2@{cpu_host.name}": f"env CUDA_VISIBLE_DEVICES= {rest}",
    }
    assert any(
        s == f"warning: {gpu_host.name}: GPU 3 (NVIDIA A10G, {uuid(3)}), given to worker:1, "
        "already runs compute process(es) pid 999 (python3, 10 MiB) (allow_busy_gpus = true)"
        for s in view.steps
    ), view.steps
    assert "warning: forward_env: UNSET_HERE are not set here" in view.steps
    # The split came out unequal, known only now: TF's MWMS rule said at preflight (tfrules.py).
    assert (
        "warning: MultiWorkerMirroredStrategy needs the same number of devices on every worker "
        "(and the chief), or TF's behaviour is undefined: worker:0 and worker:1: 2 GPUs; "
        "worker:2: CPU"
    ) in view.steps
    assert plan.warnings == ()  # the plan could not know: the GPU host's count was not learnt
    uses = {(r.name, r.gpu_use) for rows in view.rows for r in rows if r.gpu_use}
    assert uses == {("worker:0", "40% 2.0/45.0 GiB"), ("worker:1", "80% 2.0/45.0 GiB")}


@pytest.mark.lab
@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
def test_gpu_preflight_errors_on_the_lab(
    clean_lab: Lab, lab_inventory: Any, fake_nvidia_smi: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    code = tmp_path / "code"
    code.mkdir()
    (code / "x.py").write_text("print('never')\n")
    fake_nvidia_smi(lab.hosts[0], state(2))
    fake_nvidia_smi(lab.hosts[2], state(fail=True))
    path = lab_inventory(
        [[{"role": "worker", "gpus": [3]}], [{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "gpuerr", "command": f"{lab.python} x.py"},
    )
    text = path.read_text()
    for host in lab.hosts[1:3]:  # host 1 has no nvidia-smi at all; host 2's fails
        text = text.replace(f'name = "{host.name}"', f'name = "{host.name}"\ngpus = 2', 1)
    path.write_text(text)
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "deployer", "up", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    h = [host.name for host in lab.hosts[:3]]
    assert (
        f"{h[0]}: hosts[0].tasks[0].gpus: GPU 3 does not exist: nvidia-smi lists 2 GPU(s): "
        "indices 0, 1" in done.stderr
    )
    assert f"{h[1]}: GPUs were requested (gpus = 2) but nvidia-smi was not found" in done.stderr
    assert re.search(
        rf"{h[2]}: nvidia-smi failed: .* exited with code 9: NVIDIA-SMI has failed", done.stderr
    )
    assert "nothing was started" in done.stderr


def _tfdeploy(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "deployer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.lab
@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
def test_up_refuses_bad_and_busy_planned_gpus_and_check_reports_every_gpu(
    clean_lab: Lab, lab_inventory: Any, fake_nvidia_smi: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    h = lab.hosts[:3]
    code = tmp_path / "code"
    code.mkdir()
    (code / "x.py").write_text("open('/root/started', 'w').close()\n")
    ecc = {"ecc.errors.uncorrected.volatile.total": 2, "retired_pages.pending": "[N/A]"}
    fake_nvidia_smi(h[0], state(gpus={1: ecc, 3: {"remapped_rows.pending": "[N/A]"}}))
    stranger = {"gpu": 2, "pid": 4242, "process_name": "/usr/bin/python3", "used_memory": 800}
    fake_nvidia_smi(h[1], state(apps=[stranger]))
    reset = {"memory.used": "[GPU requires reset]", "utilization.gpu": "[GPU requires reset]"}
    fake_nvidia_smi(h[2], state(3, gpus={0: reset}, lost=["00000000:00:1E.0"]))
    auto = {"gpus": "auto"}
    path = lab_inventory(
        [[{"role": "worker", "count": 2}], [{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "gpuhealth", "command": f"{lab.python} x.py"},
        per_host={host.name: auto for host in h},
    )
    done = _tfdeploy(tmp_path, "up", str(path))
    assert done.returncode == 3, done.stdout + done.stderr
    err = done.stderr
    assert (
        f"{h[0].name}: GPU 1 (NVIDIA A10G, {uuid(1)}): 2 uncorrectable ECC error(s) since the "
        "driver loaded (max_ecc_errors = 0)" in err
    )
    assert "GPU 3" not in err  # [N/A] is a field the GPU does not report, not an error
    assert (
        f"{h[1].name}: GPU 2 (NVIDIA A10G, {uuid(2)}), given to worker:2, already runs compute "
        "process(es) pid 4242 (/usr/bin/python3, 800 MiB)" in err
    )
    assert (
        f"{h[2].name}: GPU 0 (NVIDIA A10G, {uuid(0)}): nvidia-smi reports [GPU requires reset]"
        in err
    )
    assert (
        f"{h[2].name}: the GPU at PCI 00000000:00:1E.0 cannot be reached (Unknown Error): it has "
        "fallen off the bus" in err
    )
    assert "nothing was started" in err and "allow_busy_gpus" in err
    for host in h:
        assert lab.run(host, "test -e /root/started").returncode != 0, host.name

    # Healthy GPUs, the busy one allowed: `check` passes and says what each host has.
    fake_nvidia_smi(h[0], state(gpus={3: {"mig.mode.current": "Enabled"}}))
    fake_nvidia_smi(h[2], state(3, gpus={0: {"driver_version": "535.161.08"}}))
    text = path.read_text().replace(
        f'name = "{h[1].name}"', f'name = "{h[1].name}"\nallow_busy_gpus = true', 1
    )
    path.write_text(text)
    done = _tfdeploy(tmp_path, "check", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert f"{h[0].name}: 4 GPU(s), driver 550.54.15: 0 ok, 1 ok, 2 ok, 3 ok" in out
    assert f"{h[1].name}: 4 GPU(s), driver 550.54.15: 0 ok, 1 ok, 2 ok (1 process(es)), 3 ok" in out
    assert f"{h[2].name}: 3 GPU(s), driver 535.161.08/550.54.15: 0 ok, 1 ok, 2 ok" in out
    assert "GPU 3 (NVIDIA A10G, " in out and "has MIG mode on" in out
    assert "(allow_busy_gpus = true)" in out
    assert "the hosts' NVIDIA driver versions differ" in out


HOLD = (
    "import json, os, sys, time\n"
    "state = os.path.expanduser('~/bin/nvidia-smi.json')\n"
    "if sys.argv[1] == 'leak':  # the driver keeps listing this pid after the process is gone\n"
    "    data = json.load(open(state))\n"
    "    data['apps'].append({'gpu': 0, 'pid': os.getpid(), 'used_memory': 700})\n"
    "    json.dump(data, open(state, 'w'))\n"
    "print('holding the GPU', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.lab
@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
def test_down_proves_the_gpus_free_and_names_a_process_still_holding_memory(
    clean_lab: Lab, lab_inventory: Any, fake_nvidia_smi: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    host = lab.hosts[0]
    code = tmp_path / "code"
    code.mkdir()
    (code / "hold.py").write_text(HOLD)
    # While a task runs, the stand-in lists it on GPU 0 (as the driver lists a CUDA context).
    fake_nvidia_smi(host, state(apps=[{"gpu": 0, "cmdline": "hold.py", "used_memory": 500}]))

    def run(mode: str) -> subprocess.CompletedProcess[str]:
        path = lab_inventory(
            [[{"role": "worker"}]],
            code=code,
            job={"name": f"gpuhold{mode}", "command": f"{lab.python} hold.py {mode}"},
            per_host={host.name: {"gpus": "auto", "gpu_release_s": 2}},
        )
        started = _tfdeploy(tmp_path, "up", "--detach", str(path))
        assert started.returncode == 0, started.stdout + started.stderr
        listed = lab.run(
            host, "/root/bin/nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits"
        )
        assert listed.stdout.strip(), "the running task is listed on its GPU"
        return _tfdeploy(tmp_path, "down", str(path))

    clean = run("clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "GPU" not in clean.stdout + clean.stderr
    leaky = run("leak")
    assert leaky.returncode == 3, leaky.stdout + leaky.stderr
    assert re.search(
        rf"GPU memory still held on 1 host; the run was stopped:\n  {host.name}: GPU 0 "
        rf"\({uuid(0)}\) still holds pid \d+ \(python3, 700 MiB\) of the run after the stop "
        r"\(waited 2 s for the driver to free it\)",
        leaky.stderr,
    ), leaky.stderr
