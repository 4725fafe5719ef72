"""Seeing a run, on the lab: each task's step, rate, ETA, CPU and RSS in `status --json`, the
end of `logs -f`, the run listed by `tfdeploy runs` once its hosts are gone, its report, and
the stop's grace countdown."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.faults import Up
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab]

STEPS = 40
TRAIN = f"""
import sys, time
from tfdeploy_metrics import report
total = sum(i * i for i in range(200000))  # some CPU for the sampler to see
keep = bytearray(50 * 1000 * 1000)  # 50 MB resident
for step in range(1, {STEPS} + 1):
    time.sleep(float(sys.argv[1]))
    report(step, total_steps={STEPS}, loss=1.0 / step, accuracy=step / {STEPS})
print("done", flush=True)
"""
POLITE = """
import signal, sys, time
def bye(*_):
    print("saving a checkpoint", flush=True)
    time.sleep(1.5)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("training", flush=True)
time.sleep(300)
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    (code / "polite.py").write_text(POLITE)
    return code


def inventory(lab_inventory: Any, code: Path, command: str) -> Path:
    return lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "observe", "command": command, "require_tensorflow": False, "stop_grace": 3},
    )


def test_a_runs_progress_is_in_status_runs_and_its_report(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    inv = inventory(lab_inventory, code, "python3 train.py 0.25")
    up = tfdeploy("up", "--detach", str(inv), state=state, check_rc=0)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    deadline, seen = time.monotonic() + 60, None
    while seen is None:
        assert time.monotonic() < deadline, "no task reported its progress"
        document = json.loads(tfdeploy("status", run_id, "--json", state=state).stdout)
        progress = [t["progress"] for r in document["runs"] for t in r["tasks"] if t["progress"]]
        ready = [p for p in progress if p["step"] and p["steps_per_s"] and p["cpu_percent"]]
        seen = ready[0] if len(ready) == 2 else None
        time.sleep(0.5)
    assert seen["total_steps"] == STEPS and 0 < seen["step"] <= STEPS
    assert seen["eta_s"] is not None and seen["rss_bytes"] > 50_000_000
    assert 0 < seen["steps_per_s"] < 10  # one step every 0.25 s at most: about 4 a second
    logs = tfdeploy("logs", run_id, "-f", state=state, check_rc=0)
    assert logs.stdout.splitlines()[-1] == (f"tfdeploy: run {run_id} succeeded: 2 exit code 0"), (
        logs.stdout[-500:]
    )
    tfdeploy("down", run_id, state=state, check_rc=0)  # keeps the metrics and the outcome
    listed = json.loads(tfdeploy("runs", "--json", state=state, check_rc=0).stdout)["runs"]
    run = next(r for r in listed if r["run_id"] == run_id)
    assert run["outcome"] == "succeeded" and run["last_step"] == STEPS
    assert run["final"]["loss"] == pytest.approx(1.0 / STEPS) and run["hosts"] == ["h1", "h2"]
    assert run["duration_s"] > 0
    report = tfdeploy("report", run_id, state=state, check_rc=0)
    page = Path(report.stdout.splitlines()[-1]).read_text()
    loss = page.split("data-metric='loss'")[1].split("</svg>")[0]  # the loss chart
    drawn = re.search(r"data-task='worker:0' data-points='(\d+)'", loss)
    assert drawn and int(drawn.group(1)) == STEPS, loss[:300]  # one point per reported step


def test_a_stop_counts_down_the_grace_and_says_the_output_is_the_tasks_own(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """Ctrl-C of `up` and `down` of a detached run, piped: a line names the tasks inside their
    stop_grace and the SIGKILL to come, and one says their output meanwhile is their own."""
    state = tmp_path / "state"
    inv = inventory(lab_inventory, code, "python3 polite.py")
    up = Up(inv, state=state)
    up.wait_for(r"\| training$", count=2)
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(timeout=60) == 130, up.stdout
    said = up.stdout
    assert "tfdeploy: stopping: 2 tasks inside their stop_grace (3 s), SIGKILL in 3 s" in said
    assert "tfdeploy: what the tasks print meanwhile is their own output" in said
    assert said.count("| saving a checkpoint") == 2
    detached = tfdeploy("up", "--detach", str(inv), state=state, check_rc=0)
    run_id = detached.stdout.split("(run ")[1].split(")")[0]
    deadline = time.monotonic() + 30
    while "training" not in tfdeploy("logs", run_id, state=state).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    down = tfdeploy("down", run_id, state=state, check_rc=0)
    assert "stopping: 2 tasks inside their stop_grace (3 s), SIGKILL in 3 s" in down.stdout
    assert "what the tasks print meanwhile is their own output" in down.stdout
    kept = json.loads(tfdeploy("runs", "--json", "--state", "stopped", state=state).stdout)
    assert {r["run_id"] for r in kept["runs"]} >= {run_id}
