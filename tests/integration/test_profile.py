"""`tfdeploy profile` on the lab, as a user runs it: a two-worker MultiWorkerMirroredStrategy job
with `profiler = true`, traced while it trains, and an evaluator that never imports TensorFlow
named as not traceable (docs/profile.md).

TensorFlow is the subject here (its profiler server in each task, its client on each host, the
traces' format), so the workers are real MWMS workers; their steps sleep between collectives so
the job costs little CPU while it waits to be traced.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.lab_cli import TF_ENV, tfdeploy

pytestmark = [pytest.mark.lab, pytest.mark.starts_tf]

TRAIN = r"""
import time
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    weights = tf.Variable(tf.random.normal((64, 64)))


@tf.function
def step():
    def replica():
        return tf.reduce_sum(tf.linalg.matmul(weights, weights))

    return strategy.reduce("SUM", strategy.run(replica), axis=None)


deadline = time.time() + 600  # `tfdeploy down` ends it long before
steps = 0
while time.time() < deadline:
    step()
    steps += 1
    if steps == 20:
        print("training", flush=True)
    time.sleep(0.02)
"""

# What the profile plugin's Profile tab does with a trace: its own converter, in a process of its
# own (it loads the plugin's native library).
CONVERT = r"""
import json, sys
from xprof.convert import raw_to_tool_data
for path in sys.argv[1:]:
    overview, kind = raw_to_tool_data.xspace_to_tool_data([path], "overview_page", {})
    trace, _ = raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {})
    events = json.loads(trace)["traceEvents"]
    print(json.dumps({"path": path, "overview": len(overview), "kind": kind,
                      "events": len(events)}))
"""


def xplane_module() -> ModuleType:
    """TensorFlow's XSpace message, loaded by file: it needs protobuf only, not TensorFlow."""
    spec = importlib.util.find_spec("tensorflow")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "tsl" / "profiler" / "protobuf" / "xplane_pb2.py"
    loaded = importlib.util.spec_from_file_location("xplane_pb2", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def trace_interval(xplane: ModuleType, path: Path) -> tuple[float, float]:
    """(start, stop) of a trace, Unix seconds, as its server recorded them."""
    space = xplane.XSpace()
    space.ParseFromString(path.read_bytes())
    found = {}
    for plane in space.planes:
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for stat in plane.stats:
            if names.get(stat.metadata_id) in ("profile_start_time", "profile_stop_time"):
                found[names[stat.metadata_id]] = stat.uint64_value / 1e9
    return found["profile_start_time"], found["profile_stop_time"]


def wait_for_lines(inventory: Path, state: Path, pattern: str, count: int) -> str:
    """`tfdeploy logs` until `count` lines match: the event, not a time (bounded at 240 s)."""
    deadline = time.monotonic() + 240
    out = ""
    while time.monotonic() < deadline:
        out = tfdeploy("logs", str(inventory), "--tail", "200", state=state).stdout
        if len(re.findall(pattern, out, re.M)) >= count:
            return out
        time.sleep(2)
    raise AssertionError(f"{count} lines of {pattern!r} never came:\n{out}")


def test_profile_traces_every_worker_over_one_interval_and_names_the_rest(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    state = tmp_path / "state"
    inventory = lab_inventory(
        [[{"role": "worker"}, {"role": "evaluator"}], [{"role": "worker"}]],
        code=code,
        job={
            "name": "profiled",
            "command": f"{lab.python} train.py",
            "role_commands": {"evaluator": f"{lab.python} -c 'import time; time.sleep(600)'"},
            "env": TF_ENV,
            "profiler": True,
        },
    )
    tfdeploy("up", str(inventory), "--detach", state=state, check_rc=0)
    try:
        wait_for_lines(inventory, state, r"^worker:\d@\S+\s+\| training$", 2)
        logs = wait_for_lines(
            inventory, state, r"tfdeploy: TensorFlow's profiler serves on port \d+$", 2
        )
        runs = tmp_path / "runs"
        profiled = tfdeploy(
            "profile", str(inventory), "--seconds", "3", "--to", str(runs), state=state
        )
    finally:
        tfdeploy("down", str(inventory), state=state, check_rc=0)
    out = profiled.stdout
    # The evaluator serves a port but never imported TensorFlow: named, and the exit says so.
    assert profiled.returncode == 4, f"{profiled.returncode}\n{out}\n{profiled.stderr}"
    said = " ".join(out.split())
    assert f"worker:0 on {h1.name}: traced for 3 s" in said, out
    assert f"worker:1 on {h2.name}: traced for 3 s" in said, out
    assert f"evaluator:0 on {h1.name}: not traced: nothing listens on its profiler port" in said
    assert "profile: 2 of 3 tasks traced" in said, out
    # The planned ports, as the tasks served them: each host's first from 9012, skipping none.
    assert re.findall(r"^worker:0@\S+\s+\| tfdeploy: .* serves on port (\d+)$", logs, re.M) == [
        "9012"
    ]
    [capture] = (runs / next(p.name for p in runs.iterdir()) / "profile").iterdir()
    assert sorted(p.name for p in capture.iterdir()) == ["worker-0", "worker-1"]
    traces = sorted(capture.glob("*/plugins/profile/*/*.xplane.pb"))
    assert [p.relative_to(capture).parts[0] for p in traces] == ["worker-0", "worker-1"]
    # One interval: the servers' own start times within a second, each trace about 3 s long.
    xplane = xplane_module()
    intervals = [trace_interval(xplane, p) for p in traces]
    starts = [start for start, _ in intervals]
    assert max(starts) - min(starts) < 1.0, intervals
    assert all(2.5 < stop - start < 10 for start, stop in intervals), intervals
    # What the Profile tab shows, from the plugin's converter installed from PyPI.
    converted = subprocess.run(
        [sys.executable, "-c", CONVERT, *map(str, traces)],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    ).stdout
    pages = [json.loads(line) for line in converted.splitlines() if line.startswith("{")]
    assert [p["kind"] for p in pages] == ["application/json"] * 2, converted
    assert all(p["overview"] > 100 and p["events"] > 10 for p in pages), pages
