"""`tfdeploy up INVENTORY --resume RUN` on the lab (issue 59): a run that ended early goes on
under its own id, every task started again in its folder of the run with the next
TFDEPLOY_ATTEMPT, so the checkpoint it left inside the run (no [job] checkpoint_dir) is there
to resume from; the run's logs and local history stay one run. And the runs it refuses, each
with its reason, nothing started.

The task is TF-shaped (tests/support/standin.py; no TensorFlow): it reads TF_CONFIG, binds its
port, saves a step counter into ckpt/ in its working directory (the run's code folder, as
examples/digits does by default) after each step, and resumes from it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.lab.base import wait_until
from tests.support import standin
from tests.support.faults import tfdeploy

pytestmark = pytest.mark.lab

STEPS = 30


def _runs_on(lab: Lab, host: Any) -> list[str]:
    said = lab.run(host, ["sh", "-c", "ls ~/.tfdeploy/hosts/*/runs/ 2>/dev/null || true"])
    return sorted(said.stdout.split())


def _run_id(up_stdout: str) -> str:
    found = re.search(r"\(run (\S+)\)$", up_stdout, re.MULTILINE)
    assert found, up_stdout
    return found.group(1)


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    standin.write(code)
    return code


def _inventory(
    lab_inventory: Any, lab: Lab, code: Path, file: str = "inventory.toml", **job: Any
) -> str:
    job = {"name": "resumejob", "command": f"{lab.python} {standin.NAME} {STEPS}", **job}
    tasks = job.pop("tasks", [[{"role": "worker"}]] * 2)
    return str(lab_inventory(tasks, code=code, job=job, name=file))


def test_a_run_stopped_by_down_goes_on_under_its_own_id_from_its_checkpoint(
    lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab_inventory, lab, code)
    state = tmp_path / "state"
    run_id = _run_id(tfdeploy("up", "--detach", inventory, state=state, check_rc=0).stdout)
    wait_until(
        "worker:1 to pass step 5", lambda: standin.step_on(lab, h2, run_id, "worker:1") >= 5, 60
    )
    tfdeploy("down", run_id, state=state, check_rc=0)  # the run dies early
    saved = {h.name: standin.step_on(lab, h, run_id, f"worker:{i}") for i, h in enumerate((h1, h2))}
    before = {h.name: _runs_on(lab, h) for h in (h1, h2)}

    resumed = tfdeploy("up", inventory, "--resume", run_id, state=state, check_rc=0, timeout=180)
    out = resumed.stdout
    assert f"resuming run {run_id} at attempt 1 (TFDEPLOY_ATTEMPT=1)" in out, out
    assert f"next, for run {run_id}:" in out, out
    for i, host in enumerate((h1, h2)):
        assert f"/runs/{run_id}/code/ckpt" in out, out  # its checkpoints: the run's own
        said = rf"worker:{i}@\S+ \[attempt 1\] \| worker {i} attempt 1 resumed from step (\d+)"
        went_on = re.search(said, out)
        assert went_on and int(went_on.group(1)) >= saved[host.name] > 0, out
        assert f"worker {i} done at step {STEPS}" in out
        assert f"worker {i} attempt 0" not in out  # the old attempt's lines not again
    assert {h.name: _runs_on(lab, h) for h in (h1, h2)} == before  # no new run folder

    read = tfdeploy("logs", run_id, "--task", "worker:0", state=state, check_rc=0)
    assert "hosts" not in read.stderr, read.stderr  # the local archive has all of it, whole
    logs = read.stdout
    assert "worker 0 attempt 0 starting at step 0" in logs  # attempt 0, in the same output.log
    assert f"tfdeploy: run {run_id} resumed by `tfdeploy up --resume` (attempt 1)" in logs
    assert logs.index("starting at step 0") < logs.index("resumed from step") < logs.index("done")
    runs = json.loads(tfdeploy("runs", "--json", state=state, check_rc=0).stdout)["runs"]
    assert [(r["run_id"], r["outcome"], r["resumed"]) for r in runs] == [
        (run_id, "succeeded", 1)
    ], runs
    assert "succeeded (resumed)" in tfdeploy("runs", state=state, check_rc=0).stdout
    status = json.loads(tfdeploy("status", run_id, "--json", state=state, check_rc=0).stdout)
    tasks = [t for r in status["runs"] for t in r["tasks"]]
    assert [(t["state"], t["exit_code"]) for t in tasks] == [("exited", 0)] * 2, status
    assert [t["restarts"] for t in tasks] == [1, 1], status  # the resumed start counts
    for host in (h1, h2):
        assert not lab.leftovers(host, 10), lab.leftovers(host)

    # A run that succeeded has nothing left to resume.
    again = tfdeploy("up", inventory, "--resume", run_id, state=state, check_rc=2)
    assert f"cannot resume run {run_id}: it succeeded, there is nothing to resume" in again.stderr
    assert "preflight" not in again.stdout


def test_runs_that_cannot_be_resumed_are_refused_with_their_reason_and_nothing_starts(
    lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab_inventory, lab, code, command=f"{lab.python} {standin.NAME} 100000")
    state = tmp_path / "state"
    run_id = _run_id(tfdeploy("up", "--detach", inventory, state=state, check_rc=0).stdout)
    before = {h.name: _runs_on(lab, h) for h in (h1, h2)}

    running = tfdeploy("up", inventory, "--resume", run_id, state=state, check_rc=2)
    assert f"cannot resume run {run_id}: it is still kept by its keeper" in running.stderr
    assert f"tfdeploy down {run_id}" in running.stderr
    status = json.loads(tfdeploy("status", run_id, "--json", state=state, check_rc=0).stdout)
    assert {t["state"] for r in status["runs"] for t in r["tasks"]} == {"running"}, status
    tfdeploy("down", run_id, state=state, check_rc=0)

    other_job = _inventory(lab_inventory, lab, code, "other.toml", name="otherjob")
    refusals = [running, tfdeploy("up", other_job, "--resume", run_id, state=state, check_rc=2)]
    assert (
        f"cannot resume run {run_id}: it is a run of job 'resumejob', and this inventory's job "
        "is 'otherjob'" in refusals[-1].stderr
    ), refusals[-1].stderr

    moved = [[{"role": "worker"}], [{"role": "worker"}, {"role": "worker"}]]
    grown = _inventory(lab_inventory, lab, code, "grown.toml", tasks=moved)
    refusals.append(tfdeploy("up", grown, "--resume", run_id, state=state, check_rc=2))
    assert (
        f"cannot resume run {run_id}: the inventory's plan no longer matches its tasks: "
        "worker:2 is not in the run" in refusals[-1].stderr
    ), refusals[-1].stderr
    assert "starts a new run" in refusals[-1].stderr

    unknown = "resumejob-20200101T000000Z-abcd"
    refusals.append(tfdeploy("up", inventory, "--resume", unknown, state=state, check_rc=2))
    assert f"cannot resume: no run {unknown} on" in refusals[-1].stderr, refusals[-1].stderr

    for said in refusals:
        assert "preflight" not in said.stdout, said.stdout  # refused before any preflight
    assert {h.name: _runs_on(lab, h) for h in (h1, h2)} == before
    for host in (h1, h2):
        assert not lab.leftovers(host, 10), lab.leftovers(host)


def _ended(state: Path, run_id: str) -> bool:
    """Every task of the run exited and no keeper of it is left (the run's end, the event)."""
    document = json.loads(tfdeploy("status", run_id, "--json", state=state, check_rc=0).stdout)
    tasks = [t for r in document["runs"] for t in r["tasks"]]
    kept = any(r["kept"] for r in document["runs"])
    return len(tasks) == 2 and all(t["state"] == "exited" for t in tasks) and not kept


def test_a_detached_run_failed_under_teardown_is_resumed_detached_and_its_keeper_ends_it(
    lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """worker:1 fails at step 5 of attempt 0: the keeper stops the run (on_failure teardown).
    `up --detach --resume` hands the resumed run to a keeper again, and the run ends
    succeeded by itself, its workers on from their checkpoints."""
    inventory = _inventory(
        lab_inventory, lab, code, command=f"{lab.python} {standin.NAME} 20 --fail-at 5"
    )
    state = tmp_path / "state"
    run_id = _run_id(tfdeploy("up", "--detach", inventory, state=state, check_rc=0).stdout)
    deadline = time.monotonic() + 60
    while not _ended(state, run_id):
        assert time.monotonic() < deadline, "the keeper did not end the failed run"
        time.sleep(0.3)

    resumed = tfdeploy("up", "--detach", inventory, "--resume", run_id, state=state, check_rc=0)
    assert f"resuming run {run_id} at attempt 1" in resumed.stdout, resumed.stdout
    assert f"run {run_id} is running detached, kept by its keeper" in resumed.stdout
    logs = tfdeploy("logs", run_id, "-f", state=state, check_rc=0, timeout=120).stdout
    assert logs.splitlines()[-1] == f"tfdeploy: run {run_id} succeeded: 2 exit code 0", logs
    assert re.search(r"worker 1 attempt 1 resumed from step 5\b", logs), logs
    assert "worker 1 done at step 20" in logs and "worker 0 done at step 20" in logs
    runs = json.loads(tfdeploy("runs", "--json", state=state, check_rc=0).stdout)["runs"]
    assert [(r["run_id"], r["outcome"]) for r in runs] == [(run_id, "succeeded")], runs
    for host in lab.hosts[:2]:
        assert not lab.leftovers(host, 10), lab.leftovers(host)
