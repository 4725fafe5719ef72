"""A host whose disk fills up under a run: the tasks' exit records and the stop still work.

The lab host's workdir (`~/.tfdeploy` of root) becomes a tmpfs of its own, just large enough
for preflight (100 MiB free), and a task fills it to the last block before it exits 0. Its
supervisor then cannot create exit.json the usual way: it writes the blocks it reserved at the
start. The other task is stopped by `down` on that full disk.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab, LabHost
from tests.support.faults import final_states, tfdeploy

pytestmark = pytest.mark.lab

WORKDIR = "/root/.tfdeploy"

# Fills the disk it runs on, then exits 0 without a word: the log is on that disk too. It waits
# for the run's keeper to record itself first: a disk that fills mid-run, not during `up`.
FILL = """
import glob, os, time
deadline = time.monotonic() + 60
while not glob.glob("/root/.tfdeploy/hosts/*/runs/%s/keeper.json" % os.environ["TFDEPLOY_RUN_ID"]):
    if time.monotonic() > deadline:
        break
    time.sleep(0.05)
try:
    with open("fill", "wb", buffering=0) as f:
        while True:
            f.write(b"x" * 65536)
except OSError:
    pass
open("/tmp/filled-" + os.environ["TFDEPLOY_RUN_ID"], "w").close()
os._exit(0)
"""


@pytest.fixture
def full_disk_host(clean_lab: Lab) -> Iterator[LabHost]:
    """A host whose workdir is a 110 MiB tmpfs, for this test only."""
    host = clean_lab.hosts[0]
    mount = f"mkdir -p {WORKDIR} && mount -t tmpfs -o size=110m,mode=0700 tfd-full {WORKDIR}"
    clean_lab.run(host, mount).check_returncode()
    try:
        yield host
    finally:
        clean_lab.run(host, f"umount -l {WORKDIR}")


def _status(inventory: Path, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    out = tfdeploy(
        "status", run_id, "-i", str(inventory), "--json", state=tmp_path / "fresh", check_rc=0
    )
    return {t["name"]: t for r in json.loads(out.stdout)["runs"] for t in r["tasks"]}


def test_a_task_that_fills_the_disk_keeps_its_exit_status_and_down_works(
    clean_lab: Lab, full_disk_host: LabHost, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    code = tmp_path / "code"
    code.mkdir()
    (code / "fill.py").write_text(FILL)
    tasks = [[{"role": "worker", "command": f"{lab.python} fill.py"}, {"role": "worker"}]]
    job = {"name": "diskfull", "command": "sleep 3600", "stop_grace": 2, "lease_seconds": 5}
    job |= {"require_tensorflow": False}
    inventory = lab_inventory(tasks, code=code, job=job, hosts=[full_disk_host])
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    found = re.search(r"run (\S+) is running detached", up.stdout)
    assert found, up.stdout
    run_id = found.group(1)
    deadline = time.monotonic() + 60
    while _status(inventory, run_id, tmp_path)["worker:0"]["state"] == "running":
        assert time.monotonic() < deadline, "worker:0 never ended"
        time.sleep(0.5)
    filled = lab.run(full_disk_host, f"test -e /tmp/filled-{run_id}")
    assert filled.returncode == 0, "the task never saw its disk full"
    worker = _status(inventory, run_id, tmp_path)["worker:0"]
    assert (worker["state"], worker["exit_code"], worker["reason"]) == ("exited", 0, "exited")
    assert worker["disk_full"] == WORKDIR, worker
    table = tfdeploy("status", run_id, "-i", str(inventory), state=tmp_path / "fresh")
    assert f"exited 0, disk full ({WORKDIR})" in table.stdout, table.stdout
    # The other task is stopped on the full disk, and nothing of the run is left (clean_lab).
    down = tfdeploy("down", run_id, "-i", str(inventory), state=tmp_path / "fresh", check_rc=0)
    assert f"stopped run {run_id}" in down.stdout, down.stdout
    states = final_states(inventory, run_id, tmp_path)
    assert states[f"worker:1@{full_disk_host.name}"]["reason"] == "stopped", states
    assert states[f"worker:0@{full_disk_host.name}"]["exit_code"] == 0
