"""A task's metrics line that no decoder should recurse into, on the lab (issue 58): 1,020 nested
`[` written to TFDEPLOY_METRICS killed an attached `up` (RecursionError: `internal error`, the job
torn down), and in a detached run made `down` crash before it stopped anything, and `status`,
`status --json` and `runs -i` die. Now the line is dropped and counted, and every verb works.
A small plain-Python task; no TensorFlow."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deployer.results import metricstore
from tests.lab import Lab
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab]

TASK = """
import os, sys, time
with open(os.environ["TFDEPLOY_METRICS"], "a") as f:
    f.write("[" * 1020 + "\\n")  # issue 58's line
    f.write('{"step": 1, "loss": 0.5}\\n')
    f.write('{"step": 2, "loss": 0.25}\\n')
print("wrote the metrics", flush=True)
time.sleep(float(sys.argv[1]))
"""


# Lines of ~1.5 kB as fast as the file takes them: the polls bring 64 kB a reply, about 200 kB
# a second, what issue 58's two flooding tasks sent (25 MB a minute into the store).
FLOOD = """
import json, os, sys, time
names = ["metric_%02d_%s" % (i, "x" * 28) for i in range(20)]
out, step, end = open(os.environ["TFDEPLOY_METRICS"], "a"), 0, time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(200):
        out.write(json.dumps({"step": step, **{n: step + 0.123456789 for n in names}}) + "\\n")
        step += 1
    out.flush()
    time.sleep(0.2)
print("wrote", step, "records", flush=True)
"""


def inventory(lab_inventory: Any, tmp_path: Path, seconds: float, script: str = "nested") -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "nested.py").write_text(TASK)
    (code / "flood.py").write_text(FLOOD)
    return lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={
            "name": "nested",
            "command": f"python3 {script}.py {seconds}",
            "require_tensorflow": False,
            "stop_grace": 1,
        },
    )


def run_id_of(output: str) -> str:
    return output.split("(run ")[1].split(")")[0]


def listed(state: Path, run_id: str, *args: str) -> dict[str, Any]:
    runs = json.loads(tfdeploy("runs", "--json", *args, state=state, check_rc=0).stdout)["runs"]
    found: dict[str, Any] = next(r for r in runs if r["run_id"] == run_id)
    return found


def test_a_nested_metrics_line_is_dropped_and_counted_by_an_attached_up(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    inv = inventory(lab_inventory, tmp_path, 1)
    up = tfdeploy("up", str(inv), state=state, check_rc=0)
    said = up.stdout + up.stderr
    assert "internal error" not in said and "RecursionError" not in said, said
    assert "wrote the metrics" in said
    run = listed(state, run_id_of(up.stdout))
    assert run["outcome"] == "succeeded" and run["last_step"] == 2, run
    assert run["metrics_dropped"] == 1 and run["damage"] == [], run
    report = tfdeploy("report", run["run_id"], state=state, check_rc=0)
    page = Path(report.stdout.splitlines()[-1]).read_text()
    assert "metrics lines dropped" in page and "worker:0: 1" in page


@pytest.mark.parametrize("target", ["run", "inventory"])
def test_a_nested_metrics_line_leaves_every_verb_of_a_detached_run_working(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, target: str
) -> None:
    """`status` reads each task's last metrics lines (the nested one among them), `down` and
    `runs -i` read them as `status` does: each works, and `down` stops the task (clean_lab
    checks nothing of it is left on the host)."""
    state = tmp_path / "state"
    inv = inventory(lab_inventory, tmp_path, 300)
    run_id = run_id_of(tfdeploy("up", "--detach", str(inv), state=state, check_rc=0).stdout)
    deadline, step = time.monotonic() + 60, None
    while step != 2:  # the event: the host's agent has the lines, the nested one first
        assert time.monotonic() < deadline, "the task's records never reached `status`"
        document = json.loads(tfdeploy("status", run_id, "--json", state=state, check_rc=0).stdout)
        tasks = [t for r in document["runs"] for t in r["tasks"]]
        step = next((t["progress"]["step"] for t in tasks if t["progress"]), None)
    shown = tfdeploy("status", str(inv), state=state, check_rc=0)
    assert run_id in shown.stdout and "internal error" not in shown.stdout + shown.stderr
    assert listed(state, run_id, "-i", str(inv))["outcome"] == "running"
    down = tfdeploy("down", run_id if target == "run" else str(inv), state=state, check_rc=0)
    assert "internal error" not in down.stdout + down.stderr, down.stdout + down.stderr
    document = json.loads(tfdeploy("status", run_id, "--json", state=state).stdout or "{}")
    running = [t for r in document.get("runs", []) for t in r["tasks"] if t["state"] == "running"]
    assert running == [], running
    run = listed(state, run_id)
    assert run["outcome"] == "stopped" and run["last_step"] == 2, run
    assert run["metrics_dropped"] == 1, run


def test_a_flooding_task_leaves_this_machine_a_store_within_its_bound(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """An attached `up` of a task writing ~1.5 kB lines as fast as it can for 15 s: the polls
    bring about 200 kB a second, and the store of them stays within its bound (the latest whole,
    an even sample of the rest from the first record on)."""
    state = tmp_path / "state"
    inv = inventory(lab_inventory, tmp_path, 15, script="flood")
    up = tfdeploy("up", str(inv), state=state, check_rc=0)
    run_id = run_id_of(up.stdout)
    folder = state / "runs" / run_id / "metrics"
    stored = sum(p.stat().st_size for p in folder.iterdir())
    assert stored <= metricstore.HISTORY_BYTES + metricstore.TAIL_BYTES + 4096, stored
    index = json.loads((folder / "worker-0.index.json").read_text())
    assert index["folded"] > 0, f"the polls brought too little to fold ({stored} bytes): {index}"
    history = (folder / "worker-0.history.jsonl").read_text().splitlines()
    assert json.loads(history[0])["step"] == 0  # the first record is kept
    run = listed(state, run_id)
    assert run["last_step"] > index["folded"] and run["metrics_dropped"] == 0, run
