"""`up` with `[job] image` on container lab hosts (issue 42): the image built here is sent from
this machine to hosts whose own stores never saw it (`image_from = "controller"`), or pulled by
the hosts from a registry on the lab; each task runs in its own container with TF_CONFIG, and
every way a run ends (its end, `down`, Ctrl-C, a task failure) leaves no container, port or mount
on any host (`clean_container_lab`). Preflight refuses a host without a usable runtime, an image
that no host has, and a GPU task where no GPU runtime is; nothing starts.

TensorFlow cannot be put into an image here (no registry, no network; the busybox test image is
2 MB): the TF test's image is busybox plus a marker file, and the Python with TensorFlow is the
lab's /opt/tfdeploy/venv with the host's /usr, mounted read-only (`container_mounts`). The
training runs inside the container, with the container's TF_CONFIG, on hosts whose image
stores never held the image.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import _inventory_writer
from tests.lab import Lab
from tests.lab import containers as lab_containers
from tests.support.lab_cli import tfdeploy

pytestmark = pytest.mark.isolated(reason="container hosts need the namespace lab (root)")

SHOW = """\
import json, os
tf = json.loads(os.environ["TF_CONFIG"])
print("task", tf["task"]["type"], tf["task"]["index"], "cluster", json.dumps(tf["cluster"]))
"""


@pytest.fixture
def controller_podman(clean_container_lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Lab:
    """This machine's podman (the controller's, which saves the image) with the lab's
    containers.conf: runc and no default ulimits, as this kernel needs (CONTAINER_NOTES.md)."""
    monkeypatch.setenv("CONTAINERS_CONF", str(clean_container_lab.dir / "containers.conf"))  # type: ignore[attr-defined]
    return clean_container_lab


def _podman_here(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["podman", *args], input=stdin, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def job_image(controller_podman: Lab, tmp_path: Path) -> Iterator[str]:
    """An image built here with `podman build` (the busybox test image plus a marker file),
    under a name of this test's own; removed from this machine afterwards."""
    base = f"localhost/tfdeploy-i42/base:{secrets.token_hex(4)}"
    name = f"localhost/tfdeploy-i42/job:{secrets.token_hex(4)}"
    _podman_here("import", "-q", str(lab_containers.test_image_tar()), base)
    ctx = tmp_path / "image"
    ctx.mkdir()
    (ctx / "marker").write_text("built-here\n")
    (ctx / "Containerfile").write_text(f"FROM {base}\nCOPY marker /marker\n")
    _podman_here("build", "-q", "-t", name, str(ctx))
    try:
        yield name
    finally:
        subprocess.run(["podman", "rmi", "-f", name, base], capture_output=True, timeout=120)


@pytest.fixture
def inventory(controller_podman: Lab, tmp_path: Path) -> Callable[..., Path]:
    return _inventory_writer(controller_podman, tmp_path, controller_podman.user)


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
    controller_podman: Lab, job_image: str, inventory: Callable[..., Path], tmp_path: Path
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
