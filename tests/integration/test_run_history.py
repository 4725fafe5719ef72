"""A run history that is true (issue 58), on the lab: every verb that learns a detached run's
end records it (deployer/results/metricsync.py), so `tfdeploy runs` says succeeded or failed
and `report` has the tasks' metrics, after the README's own detached commands and after
`status` alone; and `down` stops a run whose local records are damaged."""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab]

STEPS = 12
TRAIN = f"""
import os, sys, time
from tfdeploy_metrics import report
os.makedirs("out", exist_ok=True)
with open("out/model.txt", "w") as f:
    f.write("weights")
for step in range(1, {STEPS} + 1):
    time.sleep(0.05)
    report(step, total_steps={STEPS}, loss=1.0 / step)
print("trained", flush=True)
sys.exit(int(sys.argv[1]) if os.environ["TFDEPLOY_TASK"] == "worker:1" else 0)
"""
SLEEP = """
import time
print("training", flush=True)
time.sleep(300)
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    (code / "sleep.py").write_text(SLEEP)
    return code


def _inventory(lab_inventory: Any, code: Path, command: str, artifacts_to: Path) -> Path:
    job = {
        # A name of the test's own: the lab's hosts keep the runs of earlier tests, and `down
        # INVENTORY` speaks of every run of the job it finds there.
        "name": f"history{secrets.token_hex(3)}",
        "command": command,
        "require_tensorflow": False,
        "stop_grace": 2,
        "artifacts": ["out/**"],
        "artifacts_to": str(artifacts_to),
    }
    return lab_inventory([[{"role": "worker"}], [{"role": "worker"}]], code=code, job=job)


def _run_id(up_stdout: str) -> str:
    return up_stdout.split("(run ")[1].split(")")[0]


def _listed(state: Path, *extra: str) -> dict[str, Any]:
    """This run's entry of `tfdeploy runs --json` (the only run of the test's state)."""
    runs = json.loads(tfdeploy("runs", "--json", *extra, state=state, check_rc=0).stdout)["runs"]
    assert len(runs) == 1, runs
    listed: dict[str, Any] = runs[0]
    return listed


def _as_up_detached_left_it(state: Path, run_id: str) -> None:
    """The outcome a detached `up` records when it returns: the run's end is still unknown."""
    (state / "runs" / run_id / "outcome.json").write_text('{"outcome": "running"}')


def _wait_ended_by_status(state: Path, run_id: str) -> None:
    """`status RUN` until every task of the run has exited and its keeper has left (the run's
    end, the event), and nothing else."""
    deadline = time.monotonic() + 60
    while True:
        document = json.loads(tfdeploy("status", run_id, "--json", state=state).stdout)
        tasks = [t for r in document["runs"] for t in r["tasks"]]
        kept = any(r["kept"] for r in document["runs"])
        if len(tasks) == 2 and all(t["state"] == "exited" for t in tasks) and not kept:
            return
        assert time.monotonic() < deadline, document
        time.sleep(0.3)


def test_the_readmes_detached_commands_leave_runs_and_the_report_true(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """The README's five commands (check, up --detach, logs -f, pull, down INVENTORY): `runs`
    and `runs -i` say succeeded with the last step, and the report has every step. Each verb
    that learns the end records it on its own: the outcome is put back as `up --detach` left
    it, and `down INVENTORY` (which finds nothing to stop), `logs --sync`, `pull` and
    `status INVENTORY` each make the history true again."""
    state, home = tmp_path / "state", tmp_path / "home"
    inventory = str(_inventory(lab_inventory, code, "python3 train.py 0", home))
    tfdeploy("check", inventory, state=state, check_rc=0)
    run_id = _run_id(tfdeploy("up", inventory, "--detach", state=state, check_rc=0).stdout)
    logs = tfdeploy("logs", inventory, "-f", state=state, check_rc=0)
    assert logs.stdout.splitlines()[-1] == f"tfdeploy: run {run_id} succeeded: 2 exit code 0"
    tfdeploy("pull", inventory, "out/**", "--to", str(tmp_path / "pulled"), state=state, check_rc=0)
    down = tfdeploy("down", inventory, state=state, check_rc=0)
    assert f"nothing to stop: run {run_id} has no running task" in down.stdout, down.stdout
    for extra in ((), ("-i", inventory)):
        run = _listed(state, *extra)
        assert (run["run_id"], run["outcome"], run["last_step"]) == (run_id, "succeeded", STEPS)
        assert run["final"]["loss"] == pytest.approx(1.0 / STEPS)
    page = Path(tfdeploy("report", run_id, state=state, check_rc=0).stdout.splitlines()[-1])
    loss = page.read_text().split("data-metric='loss'")[1].split("</svg>")[0]  # the loss chart
    for task in ("worker:0", "worker:1"):
        drawn = re.search(rf"data-task='{task}' data-points='(\d+)'", loss)
        assert drawn and int(drawn.group(1)) == STEPS, loss[:300]  # every step came home
    verbs = {
        "down INVENTORY": ("down", inventory),
        "logs --sync": ("logs", run_id, "--sync"),
        "pull": ("pull", run_id, "out/**", "--to", str(tmp_path / "again")),
        "status INVENTORY": ("status", inventory),
    }
    for verb, argv in verbs.items():
        _as_up_detached_left_it(state, run_id)
        assert _listed(state)["outcome"] == "running"
        tfdeploy(*argv, state=state, check_rc=0)
        assert _listed(state)["outcome"] == "succeeded", f"{verb} did not record the end"


def test_status_alone_records_a_detached_runs_success_and_its_metrics(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """No `logs -f`, no `down`: the `status` that sees every task exited records the end, and
    brings home the metrics the run wrote after `up` detached."""
    state = tmp_path / "state"
    inventory = str(_inventory(lab_inventory, code, "python3 train.py 0", tmp_path / "home"))
    run_id = _run_id(tfdeploy("up", inventory, "--detach", state=state, check_rc=0).stdout)
    _wait_ended_by_status(state, run_id)
    run = _listed(state)
    assert (run["outcome"], run["last_step"], run["detail"]) == ("succeeded", STEPS, "")
    assert run["duration_s"] > 0


def test_status_records_a_detached_runs_failure_naming_the_task(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    inventory = str(_inventory(lab_inventory, code, "python3 train.py 3", tmp_path / "home"))
    run_id = _run_id(tfdeploy("up", inventory, "--detach", state=state, check_rc=0).stdout)
    _wait_ended_by_status(state, run_id)
    run = _listed(state)
    assert (run["outcome"], run["detail"]) == ("failed", "worker:1 exit code 3"), run
    table = tfdeploy("runs", state=state, check_rc=0).stdout
    assert "failed: worker:1 exit code 3" in table, table
    assert _listed(state, "--state", "failed")["run_id"] == run_id


def test_down_stops_a_run_whose_local_records_are_damaged(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """Garbage in outcome.json, metric_offsets.json and facts.json: `down RUN` still stops the
    tasks, exits 0, and records the run as stopped."""
    state = tmp_path / "state"
    inventory = str(_inventory(lab_inventory, code, "python3 sleep.py", tmp_path / "home"))
    run_id = _run_id(tfdeploy("up", inventory, "--detach", state=state, check_rc=0).stdout)
    deadline = time.monotonic() + 60
    while tfdeploy("logs", run_id, state=state).stdout.count("training") < 2:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    folder = state / "runs" / run_id
    (folder / "outcome.json").write_text("[1, 2]")
    (folder / "metric_offsets.json").write_text('["worker:0", -5]')
    (folder / "facts.json").write_text('{"began": ')
    down = tfdeploy("down", run_id, state=state, check_rc=0)
    assert down.stdout.count(f"stopped run {run_id} on") == 2, down.stdout
    document = json.loads(tfdeploy("status", run_id, "--json", state=state).stdout)
    assert {t["state"] for r in document["runs"] for t in r["tasks"]} == {"exited"}, document
    assert json.loads((folder / "outcome.json").read_text())["outcome"] == "stopped"
