"""An evaluator that fails is never silent, on the lab's real sshd hosts (issue 26).

Real processes, real CLI: the failure is reported while the workers still train, `up`'s last line
says the job succeeded but the evaluator failed, and `status` (table and --json, from a fresh shell
with no local state) shows it; `evaluator_failure = "fail"` fails the job. `clean_lab` checks that
nothing is left on any host. The rules are tested in tests/unit/test_evaluator_failure.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.lab_cli import tfdeploy

pytestmark = pytest.mark.lab

TASK = r"""
import os, sys, time
name = os.environ["TFDEPLOY_TASK"]
print(name, "started", flush=True)
if name.startswith("evaluator:"):
    print("evaluating ckpt-1", flush=True)
    print("OSError: no checkpoint in /shared/model", flush=True)
    sys.exit(int(sys.argv[1]))
time.sleep(float(sys.argv[2]))
print(name, "trained", flush=True)
"""


def write_job(
    lab: Lab, lab_inventory: Any, tmp_path: Path, code: int, sleep: float, **job: Any
) -> Path:
    src = tmp_path / "code"
    src.mkdir()
    (src / "task.py").write_text(TASK)
    return lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}], [{"role": "evaluator"}]],
        code=src,
        job={"name": "evalfail", "command": f"{lab.python} task.py {code} {sleep}", **job},
    )


def test_a_failed_evaluator_is_reported_at_once_in_the_last_line_and_in_status(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    h1, h2, h3 = (h.name for h in lab.hosts[:3])
    inventory = write_job(lab, lab_inventory, tmp_path, code=3, sleep=6)
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0)
    out = result.stdout.splitlines()

    report = out.index(f"tfdeploy: evaluator:0@{h3} failed (exit code 3); its last 3 log lines:")
    assert out[report + 1 : report + 4] == [
        "    evaluator:0 started",
        "    evaluating ckpt-1",
        "    OSError: no checkpoint in /shared/model",
    ]
    assert out[report + 4].startswith('the job goes on without it (evaluator_failure = "report"')
    trained = out.index(f"worker:0@{h1} | worker:0 trained")
    assert report < trained  # reported when it happened, while the workers still trained
    assert (
        f"tfdeploy: job succeeded: worker:0 and worker:1 exited 0, but the evaluator failed "
        f"(evaluator:0@{h3}: exit code 3); stopping the rest" in out
    )
    # The outcome is the last line before the next steps (the run id and what to type next).
    steps = max(i for i, line in enumerate(out) if line.startswith("tfdeploy: next, for run"))
    assert out[steps - 1] == (
        f"tfdeploy: the job succeeded, but the evaluator failed (evaluator:0@{h3}: exit code 3)"
    )
    assert not any("waiting up to" in line for line in out)  # it had ended long before
    assert f"worker:1@{h2} | worker:1 trained" in out

    # status from a fresh shell (no local state): named by the inventory
    fresh = tmp_path / "fresh"
    status = tfdeploy("status", str(inventory), "--json", state=fresh, check_rc=0).stdout
    runs = json.loads(status)["runs"]
    assert {r["host"]: r["failed_evaluators"] for r in runs} == {
        h1: [],
        h2: [],
        h3: ["evaluator:0"],
    }
    table = tfdeploy("status", str(inventory), state=fresh, check_rc=0).stdout
    assert "; evaluator failed: evaluator:0 exited 3" in " ".join(table.split())


def test_evaluator_failure_fail_fails_the_job_at_once(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    h3 = lab.hosts[2].name
    inventory = write_job(
        lab, lab_inventory, tmp_path, code=2, sleep=120, evaluator_failure="fail", stop_grace=3
    )
    started = time.monotonic()
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=1)
    assert time.monotonic() - started < 60  # the workers (120 s) were stopped, not awaited
    first = result.stderr.splitlines()[0]
    assert first == f"error: evaluator:0@{h3} failed (exit code 2); its last 3 log lines:"
    assert "OSError: no checkpoint in /shared/model" in result.stderr
    assert "job succeeded" not in result.stdout
