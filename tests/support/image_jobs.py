"""What the tests of jobs in container images share: this machine's podman set up as the lab's
controller, an image built here for one test, and an inventory writer on the container lab."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.lab import Lab
from tests.lab import containers as lab_containers
from tests.support.lab_inventories import inventory_writer


@pytest.fixture
def controller_podman(clean_container_lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Lab:
    """This machine's podman (the controller's, which saves the image) with the lab's
    containers.conf: runc and no default ulimits, as this kernel needs (CONTAINER_NOTES.md)."""
    monkeypatch.setenv("CONTAINERS_CONF", str(clean_container_lab.dir / "containers.conf"))  # type: ignore[attr-defined]
    return clean_container_lab


def podman_here(*args: str, stdin: str | None = None) -> str:
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
    podman_here("import", "-q", str(lab_containers.test_image_tar()), base)
    ctx = tmp_path / "image"
    ctx.mkdir()
    (ctx / "marker").write_text("built-here\n")
    (ctx / "Containerfile").write_text(f"FROM {base}\nCOPY marker /marker\n")
    podman_here("build", "-q", "-t", name, str(ctx))
    try:
        yield name
    finally:
        subprocess.run(["podman", "rmi", "-f", name, base], capture_output=True, timeout=120)


@pytest.fixture
def inventory(controller_podman: Lab, tmp_path: Path) -> Callable[..., Path]:
    return inventory_writer(controller_podman, tmp_path, controller_podman.user)
