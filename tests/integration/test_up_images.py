"""`up` with `[job] image` on container lab hosts (issue 42): the image built here is sent from
this machine to hosts whose own stores never saw it (`image_from = "controller"`), or pulled by
the hosts from a registry on the lab; each task runs in its own container with TF_CONFIG, and
every way a run ends (its end, `down`, Ctrl-C, a task failure) leaves no container, port or mount
on any host (`clean_container_lab`). Preflight refuses a host without a usable runtime, an image
that no host has, and a GPU task where no GPU runtime is; nothing starts.

The image is the busybox test image (2 MB, no network here) plus a marker file, and a Python
is the lab's /opt/tfdeploy/venv with the host's /usr, mounted read-only (`container_mounts`).
The tasks that must talk across hosts run the TF-shaped stand-in (tests/support/standin.py)
inside their containers, with the containers' TF_CONFIG, on hosts whose image stores never held
the image: the subject is the image's journey and the containers' network, not TensorFlow,
which test_seed_programs runs for real (issue 61).
"""

# ruff: noqa: F811  # the shared fixtures (tests/support/image_jobs.py) are parameters here

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support import standin
from tests.support.gpus import FAKE, STATE_NAME, state
from tests.support.image_jobs import (  # noqa: F401 (fixtures)
    controller_podman,
    inventory,
    job_image,
    podman_here,
    run_job_image,
)
from tests.support.lab_cli import tfdeploy

pytestmark = pytest.mark.isolated(reason="container hosts need the namespace lab (root)")

SHOW = """\
import json, os
tf = json.loads(os.environ["TF_CONFIG"])
print("task", tf["task"]["type"], tf["task"]["index"], "cluster", json.dumps(tf["cluster"]))
"""


def _has_image(lab: Lab, host: Any, image: str) -> bool:
    return lab.podman(host, f"image exists {shlex.quote(image)}").returncode == 0  # type: ignore[attr-defined]


def _code(tmp_path: Path, script: str) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(script)
    return code


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def test_an_image_built_here_is_sent_and_runs_every_task_with_its_tf_config(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    lab = controller_podman
    code = _code(tmp_path, "")
    (code / "train.sh").write_text(
        'cat /marker; echo "TF_CONFIG=$TF_CONFIG"; echo "ids $(id -u):$(id -g)"\n'
        "echo written > out-$TFDEPLOY_ATTEMPT.txt; ls -ln out-$TFDEPLOY_ATTEMPT.txt\n"
    )
    job = {
        "image": job_image,
        "image_from": "controller",
        "command": "sh train.sh",
        "require_tensorflow": False,
    }
    hosts = lab.hosts[:2]
    assert not any(_has_image(lab, h, job_image) for h in hosts)
    inv = inventory([[{"role": "chief"}], [{"role": "worker"}]], code=code, job=job, hosts=hosts)
    state = tmp_path / "state"
    out = tfdeploy("up", str(inv), state=state, check_rc=0).stdout
    assert out.count("built-here") == 2, out
    configs = [json.loads(c) for c in re.findall(r"TF_CONFIG=(\{.*\})", out)]
    assert sorted((c["task"]["type"], c["task"]["index"]) for c in configs) == [
        ("chief", 0),
        ("worker", 0),
    ], out
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs), out
    assert f"image loaded on {hosts[0].name} and {hosts[1].name}" in out, out
    assert all(_has_image(lab, h, job_image) for h in hosts)
    # a redeploy: the hosts hold the image, nothing is saved, sent or loaded
    again = tfdeploy("up", str(inv), state=state, check_rc=0).stdout
    assert "image loaded" not in again and "to be sent" not in again, again
    assert again.count("built-here") == 2, again


def _up_in_background(inv: Path, state: Path) -> subprocess.Popen[str]:
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state), "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", str(inv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _wait_for_containers(
    lab: Lab, hosts: list[Any], up: subprocess.Popen[str], timeout: float = 180
) -> None:
    """Until every host runs a tfdeploy container (the lab lists them by label), or `up` ended
    without (its output then says why); the bound is for a loaded machine, not a measurement."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and up.poll() is None:
        if all(
            any(x.startswith("container") for x in lab.containers_left(h))  # type: ignore[attr-defined]
            for h in hosts
        ):
            return
        time.sleep(0.5)
    said = up.communicate(timeout=60)[0] if up.poll() is not None else "(up still running)"
    raise AssertionError(f"the tasks' containers did not start:\n{said}")


def test_ctrl_c_leaves_no_container_on_any_host(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    lab = controller_podman
    hosts = lab.hosts[:2]
    job = {
        "image": job_image,
        "image_from": "controller",
        "command": "echo started; sleep 300",
        "require_tensorflow": False,
        "stop_grace": 3,
    }
    inv = inventory(
        [[{"role": "chief"}], [{"role": "worker"}]], code=_code(tmp_path, ""), job=job, hosts=hosts
    )
    up = _up_in_background(inv, tmp_path / "state")
    try:
        _wait_for_containers(lab, hosts, up)
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode != 0, out
    assert "Traceback" not in out, out
    for h in hosts:  # clean_container_lab checks processes and mounts too, afterwards
        assert lab.containers_left(h) == [], out  # type: ignore[attr-defined]


def test_a_task_failure_ends_with_no_container_and_the_tasks_exit_code(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    lab = controller_podman
    hosts = lab.hosts[:2]
    job = {
        "image": job_image,
        "image_from": "controller",
        "require_tensorflow": False,
        "stop_grace": 3,
        "role_commands": {"chief": "sleep 300", "worker": "sleep 1; exit 7"},
    }
    inv = inventory(
        [[{"role": "chief"}], [{"role": "worker"}]], code=_code(tmp_path, ""), job=job, hosts=hosts
    )
    result = tfdeploy("up", str(inv), state=tmp_path / "state", timeout=180)
    said = _said(result)
    assert result.returncode != 0, said
    assert "exit code 7" in said, said
    for h in hosts:
        assert lab.containers_left(h) == [], said  # type: ignore[attr-defined]


def test_restart_job_ends_with_no_container_left(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """Every attempt's containers go before the next starts (same names: tfdeploy-RUN-TASK)."""
    lab = controller_podman
    hosts = lab.hosts[:2]
    job = {
        "image": job_image,
        "image_from": "controller",
        "require_tensorflow": False,
        "stop_grace": 3,
        "on_failure": "restart-job",
        "max_restarts": 1,
        "retry_exit_codes": [5],
        "restart_backoff": 1,
        "role_commands": {
            "chief": "sleep 300",
            "worker": "echo attempt $TFDEPLOY_ATTEMPT; sleep 1; exit 5",
        },
    }
    inv = inventory(
        [[{"role": "chief"}], [{"role": "worker"}]], code=_code(tmp_path, ""), job=job, hosts=hosts
    )
    result = tfdeploy("up", str(inv), state=tmp_path / "state", timeout=240)
    said = _said(result)
    assert result.returncode != 0, said
    assert "attempt 0" in said and "attempt 1" in said, said
    for h in hosts:
        assert lab.containers_left(h) == [], said  # type: ignore[attr-defined]


# -- preflight: named, nothing started ------------------------------------------------------------


def _nothing_started(said: str) -> None:
    assert "pushed" not in said and "starting" not in said, said
    assert "Traceback" not in said, said


def test_a_host_without_the_runtime_fails_preflight_by_name(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    lab = controller_podman
    hosts = lab.hosts[:2]
    job = {
        "image": job_image,
        "image_from": "controller",
        "command": "true",
        "require_tensorflow": False,
    }
    inv = inventory(
        [[{"role": "chief"}], [{"role": "worker"}]],
        code=_code(tmp_path, ""),
        job=job,
        hosts=hosts,
        per_host={hosts[1].name: {"container_runtime": "docker"}},
    )
    result = tfdeploy("up", str(inv), state=tmp_path / "state", check_rc=3)
    said = _said(result)
    # this machine (so each lab host) has docker's client, and no docker engine to answer it
    assert f"{hosts[1].name}: docker cannot run containers for this user" in said, said
    assert "Cannot connect to the Docker daemon" in said and "run `docker info`" in said, said
    assert f"{hosts[0].name}:" not in said.split("error:")[-1], said
    _nothing_started(said)


def test_an_image_missing_everywhere_fails_preflight_on_every_host(
    controller_podman: Lab,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    lab = controller_podman
    hosts = lab.hosts[:2]
    image = f"localhost/tfdeploy-i42/nowhere:{secrets.token_hex(4)}"
    job = {"image": image, "command": "true", "require_tensorflow": False}
    inv = inventory(
        [[{"role": "chief"}], [{"role": "worker"}]], code=_code(tmp_path, ""), job=job, hosts=hosts
    )
    result = tfdeploy("up", str(inv), state=tmp_path / "state", check_rc=3)
    said = _said(result)
    for h in hosts:
        assert f"{h.name}: image {image} is not on this host and cannot be pulled" in said, said
    _nothing_started(said)
    # sent from here instead: this machine lacks it too, and says so
    inv = inventory(
        [[{"role": "chief"}], [{"role": "worker"}]],
        code=_code(tmp_path, ""),
        job={**job, "image_from": "controller"},
        hosts=hosts,
    )
    result = tfdeploy("up", str(inv), state=tmp_path / "state", check_rc=2)
    said = _said(result)
    assert f"image {image} is not on this machine" in said, said
    _nothing_started(said)


def test_a_gpu_task_without_the_gpu_runtime_fails_preflight_by_name(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """h1 has a GPU (the nvidia-smi stand-in, tests/support/gpus.py) and no CDI spec."""
    lab = controller_podman
    h = lab.hosts[0]
    script = [
        "mkdir -p /root/bin",
        f"printf %s {shlex.quote(FAKE.read_text())} > /root/bin/nvidia-smi",
        "chmod +x /root/bin/nvidia-smi",
        f"printf %s {shlex.quote(state(1))} > /root/bin/{STATE_NAME}",
    ]
    assert lab.run(h, " && ".join(script)).returncode == 0
    try:
        job = {
            "image": job_image,
            "image_from": "controller",
            "command": "true",
            "require_tensorflow": False,
        }
        inv = inventory(
            [[{"role": "worker", "gpus": [0]}]],
            code=_code(tmp_path, ""),
            job=job,
            hosts=[h],
            per_host={h.name: {"gpus": 1, "gpu_health": "off"}},
        )
        result = tfdeploy("up", str(inv), state=tmp_path / "state", check_rc=3)
    finally:
        lab.run(h, "rm -rf /root/bin")
    said = _said(result)
    assert f"{h.name}: the tasks here have GPUs but no CDI spec names nvidia.com/gpu" in said, said
    assert "nvidia-ctk cdi generate" in said, said
    _nothing_started(said)


# The image's marker (the task runs in the image sent from here), then the TF-shaped stand-in
# (tests/support/standin.py) on the python of the lab's venv, mounted read-only.
IN_IMAGE = 'echo "marker $(cat /marker) task $TFDEPLOY_TASK"; /opt/tfdeploy/venv/bin/python '


def test_containers_of_an_image_sent_from_here_reach_each_other_across_hosts(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """Two workers, each in its own container of an image sent from here, on hosts whose stores
    never held it: with --peers each dials the other over the hosts' network before its first
    step, as MWMS's collectives do (the subject is the image's delivery and the containers'
    networking; real MWMS across hosts is tests/integration/test_seed_programs.py's)."""
    lab = controller_podman
    hosts = lab.hosts[:2]
    assert not any(_has_image(lab, h, job_image) for h in hosts)
    code = tmp_path / "code"
    job = {
        "image": job_image,
        "image_from": "controller",
        "command": f"{IN_IMAGE}{standin.write(code)} 4 --peers",
        "require_tensorflow": False,  # the tasks are stand-ins
        "container_mounts": ["/usr:ro", "/lib:ro", "/lib64:ro", "/opt/tfdeploy/venv:ro"],
    }
    inv = inventory([[{"role": "worker"}], [{"role": "worker"}]], code=code, job=job, hosts=hosts)
    result = tfdeploy("up", str(inv), state=tmp_path / "state", timeout=600, check_rc=0)
    out = result.stdout
    found = re.findall(r"\| marker built-here task worker:(\d)$", out, re.M)
    assert sorted(found) == ["0", "1"], out  # each task ran in the image sent from here
    reached = re.findall(r"\| worker (\d) reached (.*)$", out, re.M)
    assert sorted(reached) == [("0", "worker:1"), ("1", "worker:0")], out  # each dialled the other
    assert len(re.findall(r"\| worker \d done at step 4$", out, re.M)) == 2, out
    assert all(_has_image(lab, h, job_image) for h in hosts)
