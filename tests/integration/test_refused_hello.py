"""A hello refused at the edge releases what it reserved (issue 58), on the lab: a host whose
agent claims glibc `2.999999999` is refused by `up` (exit 3), and once the host is honest
again the next `up`, of the same job or of another one, starts at once, instead of being
refused for a minute by the refused run's port reservation ("reserved by run R ..., which an
`up` is starting", though that `up` had exited)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import Lab
from tests.support.hostile import Hostile, hostile_run

pytestmark = [pytest.mark.lab]

HUGE_GLIBC = [('        "glibc": hostfacts.glibc(),', '        "glibc": "2.999999999",')]


@pytest.fixture
def hostile(lab: Lab, tmp_path: Path) -> Iterator[Hostile]:
    with hostile_run(lab, tmp_path, 'print("done", flush=True)\n') as run:
        yield run


def _honest_again(hostile: Hostile) -> None:
    """The patch lives in the agent's compiled files (tests/support/hostile.py): without them
    the host runs its agent's sources, as shipped."""
    folder = f"{hostile.workdir}/agent/*/__pycache__"
    argv = hostile.lab.ssh_argv(hostile.host, "sh", "-c", f"'rm -rf {folder}'")
    assert subprocess.run(argv, capture_output=True, timeout=60).returncode == 0


def test_a_refused_hello_leaves_no_reservation_for_the_next_up(
    hostile: Hostile, tmp_path: Path
) -> None:
    hostile.patch({"agent.py": HUGE_GLIBC})
    refused = hostile.tfdeploy("up", str(hostile.inventory))
    said = refused.stdout + refused.stderr
    assert refused.returncode == 3, said
    assert f"{hostile.host}: its agent's hello reply is not valid: glibc is" in said, said
    _honest_again(hostile)
    other = hostile.lab.write_inventory(
        tmp_path / "other.toml",
        tasks=[[{"role": "worker"}]],
        job={"name": "other", "code": str(tmp_path / "code"), "command": "python3 task.py"},
        hosts=hostile.hosts,
        per_host={hostile.host: {"workdir": hostile.workdir}},  # the same host's TF port
    )
    for inventory in (other, hostile.inventory):  # another job, then the refused job again
        up = hostile.tfdeploy("up", str(inventory))
        assert up.returncode == 0, up.stdout + up.stderr
        assert "| done" in up.stdout, up.stdout
