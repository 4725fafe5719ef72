"""A container job's host loss and a controller killed mid-run (issue 42): the stop paths that no
`down` reaches still end with no container on any host.

Killing a task's process group ends the runtime's client, not the container its monitor (conmon)
keeps; so these tests count the containers themselves (`lab.containers_left`, by the run label),
not processes. A host cut off from the controller hears no whole-run stop: its supervisors see
the lease lapse and remove the run's containers (remote/supervisor.py); a controller SIGKILLed
sends nothing either, and the same lease path removes them on every host.
"""

# ruff: noqa: F811  # the shared fixtures (tests/support/image_jobs.py) are parameters here

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.faults import Up, final_states
from tests.support.image_jobs import (  # noqa: F401 (fixtures)
    controller_podman,
    inventory,
    job_image,
    podman_here,
    run_job_image,
)
from tests.support.lab_cli import tfdeploy

# the image tests' fixtures: this machine's podman, the run's image (built once) under a tag of
# each test's own, the inventory writer

pytestmark = pytest.mark.isolated(reason="container hosts need the namespace lab (root)")

LEASE = 5


def _code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    return code


def _sleepers(image: str) -> dict[str, Any]:
    return {
        "image": image,
        "image_from": "controller",
        "command": "echo started; sleep 300",
        "require_tensorflow": False,
        "stop_grace": 2,
        "lease_seconds": LEASE,
    }


def _running(lab: Lab, host: Any) -> list[str]:
    return [c for c in lab.containers_left(host) if c.startswith("container") and " Up " in c]  # type: ignore[attr-defined]


def _wait_no_container(lab: Lab, hosts: list[Any], timeout: float) -> float:
    """Seconds until no host holds a tfdeploy container; fails naming what is left."""
    began = time.monotonic()
    while True:
        left = {h.name: lab.containers_left(h) for h in hosts}  # type: ignore[attr-defined]
        if not any(left.values()):
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise AssertionError(f"containers left after {timeout:g} s: {left}")
        time.sleep(0.5)


def test_a_cut_off_host_removes_its_containers_when_the_lease_lapses(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """`up` tears down the surviving hosts (0 containers when it returns); the host it lost
    keeps running, and its supervisors remove the run's containers once the lease lapses."""
    lab = controller_podman
    hosts, victim = lab.hosts[:3], lab.hosts[1]
    inv = inventory(
        [[{"role": "worker"}]] * 3, code=_code(tmp_path), job=_sleepers(job_image), hosts=hosts
    )
    up = Up(inv, state=tmp_path / "state")
    try:
        up.wait_for(r"worker:\d@\S+ \| started", count=3, timeout=120)
        run_id = up.run_id()
        assert all(_running(lab, h) for h in hosts), [lab.containers_left(h) for h in hosts]  # type: ignore[attr-defined]
        lab.cut_link(victim)
        try:
            up.wait_for(rf"^tfdeploy: host {victim.name} lost after", timeout=30)
            assert up.finish(timeout=120) == 1, up.report()
            survivors = [h for h in hosts if h != victim]
            for h in survivors:  # torn down before `up` returned
                assert lab.containers_left(h) == [], (h.name, up.report())  # type: ignore[attr-defined]
            # still cut off: only the host's own supervisors can end its container
            took = _wait_no_container(lab, [victim], LEASE + 2 + 2 + 20)
        finally:
            lab.restore_link(victim)
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
            up.finish()
    print(f"cut-link: the lost host's container removed {took:.1f} s after `up` ended")
    states = final_states(inv, run_id, tmp_path)
    assert states[f"worker:1@{victim.name}"]["reason"] == "lease expired", states
    # The cut connection's agent session on the victim saw no end of it: it leaves at its idle
    # exit (15 s, PROTOCOL.md), which the fixture's leftover check then finds done.
    lab.leftovers(victim, settle=30)


def test_a_crashed_hosts_container_is_removed_by_the_next_preflight(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    lab = controller_podman
    hosts, victim = lab.hosts[:3], lab.hosts[1]
    inv = inventory(
        [[{"role": "worker"}]] * 3, code=_code(tmp_path), job=_sleepers(job_image), hosts=hosts
    )
    up = Up(inv, state=tmp_path / "state")
    try:
        up.wait_for(r"worker:\d@\S+ \| started", count=3, timeout=120)
        lab.crash_host(victim)
        try:
            up.wait_for(rf"^tfdeploy: host {victim.name} lost after", timeout=30)
            assert up.finish(timeout=120) == 1, up.report()
            for h in hosts:
                if h != victim:
                    assert lab.containers_left(h) == [], (h.name, up.report())  # type: ignore[attr-defined]
        finally:
            lab.revive_host(victim)
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
            up.finish()
    # Its supervisors died with it; its image store did not: the container's record is still
    # there (no process, no port). The next preflight that reaches the host removes it.
    before = lab.containers_left(victim)  # type: ignore[attr-defined]
    try:
        check = tfdeploy("check", str(inv), state=tmp_path / "state")
        assert check.returncode == 0, check.stdout + check.stderr
        assert lab.containers_left(victim) == [], (before, check.stdout)  # type: ignore[attr-defined]
    finally:
        lab.podman(victim, "rm -af")  # type: ignore[attr-defined]  # (the lab's own cleanup)


def test_a_killed_up_leaves_no_container_once_the_lease_lapses(
    controller_podman: Lab,
    job_image: str,
    inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """A foreground `up` SIGKILLed: no stop is ever sent; every host's supervisors see the
    lease lapse and remove the run's containers."""
    lab = controller_podman
    hosts = lab.hosts[:2]
    inv = inventory(
        [[{"role": "chief"}], [{"role": "worker"}]],
        code=_code(tmp_path),
        job=_sleepers(job_image),
        hosts=hosts,
    )
    up = Up(inv, state=tmp_path / "state")
    try:
        up.wait_for(r":0@\S+ \| started", count=2, timeout=120)
        run_id = up.run_id()
    finally:
        up.proc.kill()
        up.finish()
    time.sleep(1)
    assert all(_running(lab, h) for h in hosts), "the containers died with the controller"
    took = _wait_no_container(lab, hosts, LEASE + 2 + 2 + 20)
    print(f"lease: every container removed {took + 1:.1f} s after `up` was killed")
    states = final_states(inv, run_id, tmp_path, hosts=2)
    assert {t["reason"] for t in states.values()} == {"lease expired"}, states
