"""`image_from = "hosts"` (the default) against a registry on the lab (issue 42): Debian's
`docker-registry` runs on one lab host's address (plain HTTP, its storage in the lab directory),
the image built here is pushed to it, and every other host pulls it with its own registry access,
once, in preflight, before anything starts. No traffic leaves the lab's addresses.

The lab's registries.conf marks the registry insecure (`lab.trust_registry`, reaching the hosts
through sshd's `SetEnv CONTAINERS_REGISTRIES_CONF`): a host's own configuration, as on a real
fleet; tfdeploy passes no TLS flag of its own.
"""

# ruff: noqa: F811  # the shared fixtures (tests/support/image_jobs.py) are parameters here

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab import Lab, LabHost
from tests.support.image_jobs import (  # noqa: F401 (fixtures)
    controller_podman,
    inventory,
    job_image,
    podman_here,
    run_job_image,
)
from tests.support.lab_cli import tfdeploy

pytestmark = pytest.mark.isolated(reason="container hosts need the namespace lab (root)")

# the image tests' fixtures: this machine's podman, the run's image (built once) under a tag of
# each test's own, the inventory writer

PORT = 5000
REGISTRY_CONF = """\
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: {addr}
"""


@dataclass(frozen=True)
class Registry:
    address: str  # ADDR:PORT
    log: Path  # its request log: who fetched what


@pytest.fixture
def registry(controller_podman: Lab) -> Iterator[Registry]:
    """`docker-registry` serving on the last lab host's address. Stopped and its storage
    removed afterwards (before `clean_container_lab` looks for leftovers)."""
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry is not installed (scripts/install.sh installs it as root)")
    lab = controller_podman
    host = lab.hosts[-1]
    address = f"{host.address}:{PORT}"
    d = lab.dir / f"registry-{secrets.token_hex(4)}"
    d.mkdir()
    (d / "config.yml").write_text(REGISTRY_CONF.format(root=d / "data", addr=address))
    start = f"docker-registry serve {d / 'config.yml'} > {d / 'log'} 2>&1 & echo $!"
    pid = lab.run(host, ["sh", "-c", start]).stdout.strip()
    try:
        _wait_serving(address, d / "log")
        lab.trust_registry(address)  # type: ignore[attr-defined]
        yield Registry(address, d / "log")
    finally:
        lab.run(host, ["kill", pid])
        time.sleep(0.5)
        shutil.rmtree(d, ignore_errors=True)


def _wait_serving(address: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["curl", "-sf", "-o", "/dev/null", f"http://{address}/v2/"], capture_output=True
        )
        if done.returncode == 0:
            return
        time.sleep(0.3)
    raise AssertionError(f"the lab's registry did not answer: {log.read_text()}")


def _pulls_by_host(lab: Lab, log: str, repo: str) -> dict[str, int]:
    """Manifest fetches of `repo` in the registry's log, by the lab host that asked."""
    by_addr = {h.address: h.name for h in lab.hosts}
    counts: dict[str, int] = {}
    fetch = re.compile(rf'^([\d.]+) - - \[[^]]*\] "GET /v2/{repo}/manifests/')
    for line in log.splitlines():  # the access log's lines (the JSON-ish ones are its twins)
        found = fetch.match(line)
        if found and found.group(1) in by_addr:
            name = by_addr[found.group(1)]
            counts[name] = counts.get(name, 0) + 1
    return counts


def test_every_host_pulls_the_image_once_from_a_registry_before_anything_starts(
    controller_podman: Lab,
    job_image: str,
    registry: Registry,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    lab = controller_podman
    hosts = lab.hosts[:2]
    image = f"{registry.address}/test:1"
    podman_here("tag", job_image, image)
    try:
        podman_here("push", "-q", "--tls-verify=false", image)
    finally:
        podman_here("rmi", image)  # this machine keeps job_image only
    assert not any(_holds(lab, h, image) for h in hosts)
    code = tmp_path / "code"
    code.mkdir()
    job = {
        "image": image,
        "command": 'cat /marker; echo "TF_CONFIG=$TF_CONFIG"; sleep 300',
        "require_tensorflow": False,
        "stop_grace": 2,
    }
    inv = inventory([[{"role": "chief"}], [{"role": "worker"}]], code=code, job=job, hosts=hosts)
    up = tfdeploy("up", "--detach", str(inv), state=tmp_path / "state", check_rc=0, timeout=300)
    out = up.stdout
    try:
        said = " ".join(out.split())
        assert f"image {image} on {hosts[0].name} and {hosts[1].name} (podman), pulled on" in said
        pulled = said.index("pulled on")
        assert pulled < said.index("pushed") < said.index("starting"), out  # before anything
        assert "to be sent" not in out and "image loaded" not in out, out  # nothing from here
        # once per host: one manifest fetch each (the push came from this machine)
        assert _pulls_by_host(lab, registry.log.read_text(), "test") == {
            h.name: 1 for h in hosts
        }, registry.log.read_text()
        for h in hosts:
            assert _holds(lab, h, image), h.name
        _wait_for_output(lab, hosts)
    finally:
        down = tfdeploy("down", str(inv), state=tmp_path / "state", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    for h in hosts:
        assert lab.containers_left(h) == [], down.stdout  # type: ignore[attr-defined]


def _holds(lab: Lab, host: LabHost, image: str) -> bool:
    return lab.podman(host, f"image exists {shlex.quote(image)}").returncode == 0  # type: ignore[attr-defined,no-any-return]


def _wait_for_output(lab: Lab, hosts: list[LabHost]) -> None:
    """Each task's container ran the job's command: its log says the image's marker."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = [
            lab.podman(h, "logs --latest").stdout  # type: ignore[attr-defined]
            for h in hosts
        ]
        if all("built-here" in log and "TF_CONFIG=" in log for log in logs):
            return
        time.sleep(0.5)
    raise AssertionError(f"the tasks' containers did not run the job: {logs}")
