"""Preflight proves a container can start (issue 47): a host whose runtime answers `podman info`
but cannot create a container (no cgroup mounts: runc's `no cgroup mount found`) fails `check`
by name, in the runtime's words, instead of passing it and failing every task at start. The
same trial container reads the image's TensorFlow and frameworks for preflight's rules."""

# ruff: noqa: F811  # the shared fixtures (tests/support/image_jobs.py) are parameters here

from __future__ import annotations

import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab import Lab
from tests.lab import containers as lab_containers
from tests.support.image_jobs import controller_podman, inventory  # noqa: F401 (fixtures)
from tests.support.lab_cli import tfdeploy

pytestmark = pytest.mark.isolated(reason="container hosts need the namespace lab (root)")

# The cgroup part of a container host's boot (its /run/libpod tmpfs stays as it is).
CGROUP_MOUNTS = [line for line in lab_containers.boot_lines() if "cgroup" in line]


def test_a_host_whose_runtime_cannot_start_a_container_fails_check_by_name(
    controller_podman: Lab, inventory: Callable[..., Path], tmp_path: Path
) -> None:
    lab = controller_podman
    h1, h2 = lab.hosts[:2]
    image = f"localhost/tfdeploy-i47/trial:{secrets.token_hex(4)}"
    for h in (h1, h2):
        lab.import_test_image(h, image)  # type: ignore[attr-defined]
    code = tmp_path / "code"
    code.mkdir()
    job = {"image": image, "command": "true", "require_tensorflow": False}
    inv = inventory([[{"role": "chief"}], [{"role": "worker"}]], code=code, job=job, hosts=[h1, h2])
    try:
        gone = lab.run(h2, "umount -R /sys/fs/cgroup")
        assert gone.returncode == 0, gone.stderr
        result = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=3)
        said = result.stdout + result.stderr
        # Before: "image ... on h1 and h2 (podman)", "check ok", exit 0; `up` then failed at
        # start with runc's words, as a task failure.
        assert f"{h2.name}: podman cannot start a container of {image} on this host" in said, said
        assert "cgroup" in said and "check ok" not in said, said
        assert f"{h1.name}:" not in said.split("error")[-1], said
    finally:
        back = lab.run(h2, " && ".join(CGROUP_MOUNTS))
        assert back.returncode == 0, back.stderr
    ok = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=0).stdout
    assert f"a trial container ran on {h1.name} and {h2.name}" in ok, ok
    for h in (h1, h2):
        lab.podman(h, f"rmi -f {shlex.quote(image)}")  # type: ignore[attr-defined]


PYTHON_TF215 = "/opt/tfdeploy/venv-tf215/bin/python"
VENV = "/opt/tfdeploy/venv"


def test_an_images_tensorflow_is_compared_with_the_host_pythons(
    controller_podman: Lab, inventory: Callable[..., Path], tmp_path: Path
) -> None:
    """The image's TensorFlow (read by the trial container, through the tasks' own python: the
    lab's TF venv mounted read-only, as test_up_images.py trains) against a host python on TF
    2.15. Before, image hosts were left out of the TensorFlow rule: `check` said ok."""
    if not Path(PYTHON_TF215).is_file():
        pytest.skip(f"{PYTHON_TF215} is missing: scripts/install.sh installs it")
    lab = controller_podman
    h1, h2 = lab.hosts[:2]
    image = f"localhost/tfdeploy-i47/tf:{secrets.token_hex(4)}"
    lab.import_test_image(h1, image)  # type: ignore[attr-defined]
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")  # preflight refuses a command whose script is missing
    job = {
        "command": f"{VENV}/bin/python train.py",
        "container_mounts": ["/usr:ro", "/lib:ro", "/lib64:ro", f"{VENV}:ro"],
        "role_commands": {"worker": "python train.py"},  # h2's python, on the host
    }
    inv = inventory(
        [[{"role": "chief"}], [{"role": "worker"}]],
        code=code,
        job=job,
        hosts=[h1, h2],
        per_host={h1.name: {"image": image}, h2.name: {"python": PYTHON_TF215}},
    )
    try:
        result = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=3)
        said = " ".join((result.stdout + result.stderr).split())
        assert "hosts disagree on the TensorFlow version" in said, said
        assert f"{h1.name}: TensorFlow 2.21.0 for chief:0 (image {image})" in said, said
        assert f"{h2.name}: TensorFlow 2.15.1 for worker:0 ({PYTHON_TF215})" in said, said
    finally:
        lab.podman(h1, f"rmi -f {shlex.quote(image)}")  # type: ignore[attr-defined]


def _torch_venv(where: Path, version: str) -> Path:
    """A venv of the lab's /usr/bin/python3 (no pip: well under a second) whose only package is
    a torch dist-info of `version`: its METADATA, no module (read, never imported)."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(where)], check=True)
    info = next(where.glob("lib/python3*/site-packages")) / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return where


def test_an_images_torch_is_read_by_its_trial_and_compared_with_the_host_pythons(
    controller_podman: Lab, inventory: Callable[..., Path], tmp_path: Path
) -> None:
    """`framework = "torch"`: the trial container reads the image's torch through the tasks'
    own python (a venv mounted read-only, as the test above mounts the lab's TF venv), and the
    framework rule compares it with a host python's. Before, image tasks were left out of the
    framework rule: `check` said ok, and the versions met at the first collective."""
    lab = controller_podman
    h1, h2 = lab.hosts[:2]
    image = f"localhost/tfdeploy-i47/torch:{secrets.token_hex(4)}"
    lab.import_test_image(h1, image)  # type: ignore[attr-defined]
    shared = Path(tempfile.mkdtemp(prefix="tfd-torch-", dir="/var/tmp"))  # hosts' /tmp: their own
    try:
        in_image = _torch_venv(shared / "image", "2.12.0")
        on_host = _torch_venv(shared / "host", "2.13.0")
        subprocess.run(["chmod", "-R", "a+rX", str(shared)], check=True)
        code = tmp_path / "code"
        code.mkdir()
        (code / "train.py").write_text("")
        job = {
            "framework": "torch",
            "command": f"{in_image}/bin/python train.py",
            "container_mounts": ["/usr:ro", "/lib:ro", "/lib64:ro", f"{in_image}:ro"],
            "role_commands": {"worker": "python train.py"},  # h2's python, on the host
        }
        inv = inventory(
            [[{"role": "chief"}], [{"role": "worker"}]],
            code=code,
            job=job,
            hosts=[h1, h2],
            per_host={h1.name: {"image": image}, h2.name: {"python": f"{on_host}/bin/python"}},
        )
        result = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=3)
        said = " ".join((result.stdout + result.stderr).split())
        assert f"{h1.name}: torch 2.12.0 (image {image})" in said, said
        both = f"{h1.name} and {h2.name}: one version on every host"
        assert f"{h2.name}: torch 2.13.0 hint: {both}" in said, said
    finally:
        lab.podman(h1, f"rmi -f {shlex.quote(image)}")  # type: ignore[attr-defined]
        shutil.rmtree(shared, ignore_errors=True)
