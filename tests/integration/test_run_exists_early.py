"""Issue 47: `down` during `up`'s push or setup stops the run, and its `up` starts nothing.

`down INVENTORY` while `up` pushed said `nothing to stop`, exit 0, and the job then started:
a run was not a run for `down` until its first task. Real `up` and `down` on lab hosts: a push
slowed by a capped uplink (the code cannot reach the hosts for seconds) and a slow setup.
The agent's side alone: tests/unit/test_run_exists_early.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.faults import Up, tfdeploy

pytestmark = pytest.mark.lab

STOPPED = "was stopped on this host (`tfdeploy down`, or its own `up`'s teardown) before it"


def _job(lab: Lab, lab_inventory: Any, tmp_path: Path, marker: str, **job: Any) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "task.py").write_text(
        f"import pathlib, time\npathlib.Path({marker!r}).touch()\ntime.sleep(60)\n"
    )
    table = {"name": "early", "command": f"{lab.python} task.py", "lease_seconds": 30} | job
    return lab_inventory([[{"role": "worker"}]] * 2, code=code, job=table)  # type: ignore[no-any-return]


def _nothing_ran(lab: Lab, marker: str) -> None:
    for host in lab.hosts[:2]:
        assert lab.run(host, ["test", "-e", marker]).returncode == 1, f"a task ran on {host.name}"


def _down_while(up: Up, inventory: Path, tmp_path: Path, hosts: list[str]) -> str:
    down = tfdeploy("down", str(inventory), state=tmp_path / "other-shell", timeout=60)
    assert down.returncode == 0, down.stdout + down.stderr
    found = re.search(r"stopped run (\S+) on", down.stdout)  # `up` has not said it yet
    assert found, down.stdout + up.report()
    run_id = found.group(1)
    assert run_id.startswith("early-")
    for host in hosts:  # said per host, and what it means for the `up` under way
        assert (
            f"stopped run {run_id} on {host} before any task of it started (its `up` was "
            "preparing it): the host refuses the rest of it, and that `up` starts nothing"
        ) in down.stdout, down.stdout
    assert "nothing to stop" not in down.stdout
    return run_id


def test_down_during_the_push_stops_the_run_and_up_starts_nothing(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    marker = f"/root/early-push-{os.getpid()}"
    inventory = _job(clean_lab, lab_inventory, tmp_path, marker)
    (tmp_path / "code" / "weights.bin").write_bytes(os.urandom(6 << 20))
    clean_lab.cap_uplink("4mbit")  # ~0.5 MB/s: the 6 MB of code take ~12 s to reach the hosts
    try:
        up = Up(inventory, "--no-netcheck", state=tmp_path / "state")
        up.wait_for(r"preflight ok", timeout=90)
        run_id = _down_while(up, inventory, tmp_path, [h.name for h in clean_lab.hosts[:2]])
        code = up.finish(timeout=120)
    finally:
        clean_lab.uncap_uplink()
    assert code != 0, up.report()
    assert "pushed" not in up.stdout and "started" not in up.stdout, up.report()
    assert STOPPED in up.stderr and run_id in up.stderr, up.report()
    _nothing_ran(clean_lab, marker)
    status = tfdeploy("status", str(inventory), state=tmp_path / "other-shell", timeout=60)
    assert run_id not in status.stdout, status.stdout  # stopped before it ran: nothing left


def test_down_during_setup_stops_it_and_up_starts_nothing(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    marker = f"/root/early-setup-{os.getpid()}"
    inventory = _job(clean_lab, lab_inventory, tmp_path, marker, setup=["sleep 60"])
    up = Up(inventory, "--no-netcheck", state=tmp_path / "state")
    up.wait_for(r"setup \(1 command\) on 2 hosts", timeout=90)
    status = tfdeploy("status", str(inventory), state=tmp_path / "other-shell", timeout=60)
    assert "starting on h1, h2: its `up` is preparing it" in status.stdout, status.stdout
    _down_while(up, inventory, tmp_path, [h.name for h in clean_lab.hosts[:2]])
    assert up.finish(timeout=120) != 0, up.report()
    assert STOPPED in up.stderr and "setup failed" in up.stderr, up.report()
    _nothing_ran(clean_lab, marker)
