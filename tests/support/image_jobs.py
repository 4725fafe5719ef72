"""What the tests of jobs in container images share: this machine's podman set up as the lab's
controller, the run's image built here, and an inventory writer on the container lab.

The image (the busybox test image plus a marker file, by `podman import` and `podman build`) is
built once per pytest run: under pytest-xdist every worker is a session of its own, so the
first to ask builds it under a file lock in the directory the workers share (the controller's
basetemp) and writes its name there; the others read it. Each test gets a tag of its own
(`job_image`), so what one test sends to the lab hosts, untags or retags is no other test's. The
run's image is removed by the process that ran the session, once every worker is done
(`remove_run_image`, from tests/conftest.py's pytest_sessionfinish: the xdist controller, or the
one serial session)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.lab import Lab
from tests.lab import containers as lab_containers
from tests.support.lab_inventories import inventory_writer

REPO = "localhost/tfdeploy-i42/job"
STATE = "tfdeploy-job-image"  # the run's folder of it: its name, its lock, its build context
CONTAINERFILE = "FROM {base}\nCOPY marker /marker\n"
MARKER = "built-here\n"


@pytest.fixture
def controller_podman(clean_container_lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Lab:
    """This machine's podman (the controller's, which saves the image) with the lab's
    containers.conf: runc and no default ulimits, as this kernel needs (CONTAINER_NOTES.md)."""
    monkeypatch.setenv("CONTAINERS_CONF", str(clean_container_lab.dir / "containers.conf"))  # type: ignore[attr-defined]
    return clean_container_lab


def podman_here(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["podman", *args], input=stdin, capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run_dir(config: pytest.Config, basetemp: Path) -> Path:
    """The directory of this pytest run that every xdist worker shares: a worker's basetemp is
    the controller's plus `popen-gwN`; a serial session's is its own."""
    return basetemp.parent if hasattr(config, "workerinput") else basetemp


def _exists(image: str) -> bool:
    done = subprocess.run(["podman", "image", "exists", image], capture_output=True, timeout=60)
    return done.returncode == 0


@pytest.fixture(scope="session")
def run_job_image(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The run's image: built by the first session (xdist worker) that asks, under a lock, and
    keyed by its content; removed by `remove_run_image` when the run ends, not here (a worker's
    session may end while another still deploys it)."""
    d = _run_dir(pytestconfig, tmp_path_factory.getbasetemp()) / STATE
    d.mkdir(exist_ok=True)
    tar = lab_containers.test_image_tar()
    key = hashlib.sha256(f"{tar.name}\n{CONTAINERFILE}\n{MARKER}".encode()).hexdigest()[:12]
    state = d / f"{key}.name"
    with (d / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if state.exists() and _exists(name := state.read_text().strip()):
            return name
        name = f"{REPO}:run-{key}-{secrets.token_hex(4)}"  # this run's: others run beside it
        state.write_text(name)  # before the build: a half-built image is removed at the end too
        _build(d / f"{key}.ctx", tar, name)
        return name


def _build(ctx: Path, tar: Path, name: str) -> None:
    """`podman import` of the busybox tarball as a base, `podman build` of the image FROM it,
    and the base's tag removed (the image keeps its layer). The lab's containers.conf, though
    no container runs: COPY only."""
    ctx.mkdir(exist_ok=True)
    conf = ctx.parent / "containers.conf"
    conf.write_text(lab_containers.CONTAINERS_CONF)
    env = os.environ | {"CONTAINERS_CONF": str(conf)}
    base = f"localhost/tfdeploy-i42/base:{secrets.token_hex(4)}"
    podman_here("import", "-q", str(tar), base, env=env)
    try:
        (ctx / "marker").write_text(MARKER)
        (ctx / "Containerfile").write_text(CONTAINERFILE.format(base=base))
        podman_here("build", "-q", "-t", name, str(ctx), env=env)
    finally:
        subprocess.run(["podman", "rmi", base], capture_output=True, timeout=120, env=env)


def remove_run_image(config: pytest.Config) -> list[str]:
    """At the end of the run, in the process that ran the session (not in an xdist worker: the
    controller's hook runs after every worker is done): the run's image removed from this
    machine. Returns what is left (an image podman would not remove) for the leftover check."""
    if hasattr(config, "workerinput"):
        return []
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or factory._basetemp is None:  # no temp dir yet: no image was built
        return []
    left = []
    for state in sorted((factory.getbasetemp() / STATE).glob("*.name")):
        name = state.read_text().strip()
        subprocess.run(["podman", "rmi", "-f", name], capture_output=True, timeout=120)
        state.unlink()
        if _exists(name):
            left.append(f"this machine's image {name} (podman rmi -f failed)")
    return left


@pytest.fixture
def job_image(controller_podman: Lab, run_job_image: str) -> Iterator[str]:
    """The run's image under a name of this test's own (`podman tag`): the lab hosts keep the
    images tests sent them, so each test's name is new to them, and a test may retag or untag
    its name freely. The tag is removed afterwards; the run's image stays for other tests."""
    name = f"{REPO}:{secrets.token_hex(4)}"
    podman_here("tag", run_job_image, name)
    try:
        yield name
    finally:
        subprocess.run(["podman", "untag", name, name], capture_output=True, timeout=120)


@pytest.fixture
def inventory(controller_podman: Lab, tmp_path: Path) -> Callable[..., Path]:
    return inventory_writer(controller_podman, tmp_path, controller_podman.user)
