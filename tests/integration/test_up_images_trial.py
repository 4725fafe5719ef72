"""Preflight proves a container can start (issue 47): a host whose runtime answers `podman info`
but cannot create a container (no cgroup mounts: runc's `no cgroup mount found`) fails `check`
by name, in the runtime's words, instead of passing it and failing every task at start."""

# ruff: noqa: F811  # the shared fixtures (tests/support/image_jobs.py) are parameters here

from __future__ import annotations

import secrets
import shlex
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
