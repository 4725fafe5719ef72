"""`tfdeploy profile` and `tfdeploy tensorboard` on the lab, as a user runs them: a two-worker
MultiWorkerMirroredStrategy job with `profiler = true`, traced while it trains, an evaluator that
never imports TensorFlow named as not traceable, then the run's events and profiles in a
TensorBoard here, looked at by headless Chromium (docs/profile.md).

TensorFlow is the subject here (its profiler server in each task, its client on each host, the
traces' format), so the workers are real MWMS workers; their steps sleep between collectives so
the job costs little CPU while it waits to be traced.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.lab_cli import TF_ENV, tfdeploy

CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
CHROMIUM_FLAGS += ["--disable-background-networking", "--disable-component-update"]

pytestmark = [pytest.mark.lab, pytest.mark.starts_tf]

TRAIN = r"""
import os
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


writer = tf.summary.create_file_writer(f"logs/{os.environ['TFDEPLOY_TASK'].replace(':', '-')}")
deadline = time.time() + 600  # `tfdeploy down` ends it long before
steps = 0
while time.time() < deadline:
    total = step()
    steps += 1
    if steps % 10 == 0:
        with writer.as_default():
            tf.summary.scalar("total", total, step=steps)
        writer.flush()
    if steps == 20:
        print("training", flush=True)
    time.sleep(0.05)
"""

# What the profile plugin's Profile tab does with a trace: its own converter, in a process of its
# own (it loads the plugin's native library).
CONVERT = r"""
import json, sys
from xprof.convert import raw_to_tool_data
for path in sys.argv[1:]:
    overview, kind = raw_to_tool_data.xspace_to_tool_data([path], "overview_page", {})
    steps = json.loads(overview)
    print(json.dumps({"path": path, "overview": len(overview), "kind": kind,
                      "parts": len(steps)}))
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


def json_of(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as answer:
        return json.loads(answer.read())


def look_at_the_board(inventory: Path, state: Path, runs: Path, tmp_path: Path) -> dict[str, Any]:
    """`tfdeploy tensorboard INVENTORY` while the run trains: its URL, what its plugins and
    scalars say once the events arrived, the page as Chromium renders it, and how Ctrl-C ends
    it (TensorBoard gone, its port free)."""
    env = {**os.environ, "TFDEPLOY_STATE_DIR": str(state), "COLUMNS": "200"}
    argv = [sys.executable, "-m", "deployer", "tensorboard", str(inventory)]
    board = subprocess.Popen(
        [*argv, "--port", "0", "--to", str(runs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert board.stdout is not None
    said: list[str] = []
    url = ""
    try:
        while not url or not any("pulled" in line for line in said):
            line = board.stdout.readline()
            assert line, f"tensorboard ended: {said}"
            said.append(line.rstrip())
            found = re.search(r"TensorBoard at (http://127\.0\.0\.1:\d+/)", line)
            url = found.group(1) if found else url
        # TensorBoard reads what arrived at its next reload (every 5 s): until it has both.
        deadline = time.monotonic() + 120
        while True:
            plugins = json_of(url + "data/plugins_listing")
            tags = json_of(url + "data/plugin/scalars/tags")
            if sum("total" in t for t in tags.values()) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(1)
        dom = ""
        looks = [f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=20000"]
        if CHROMIUM is not None:
            dom = subprocess.run(
                [CHROMIUM, *CHROMIUM_FLAGS, *looks, "--dump-dom", url],
                capture_output=True,
                text=True,
                timeout=180,
                check=True,
            ).stdout
        board.send_signal(signal.SIGINT)
        rc = board.wait(timeout=60)
    finally:
        if board.poll() is None:
            board.kill()
            board.wait()
    port = int(url.rsplit(":", 1)[1].strip("/"))
    return {"said": said, "plugins": plugins, "tags": tags, "dom": dom, "rc": rc, "port": port}


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
            "tensorboard": {"logdir": "logs"},
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
        board_checked = look_at_the_board(inventory, state, runs, tmp_path)
    finally:
        tfdeploy("down", str(inventory), state=state, check_rc=0)
    out = profiled.stdout
    # The evaluator serves a port but never imported TensorFlow: named, and the exit says so.
    assert profiled.returncode == 4, f"{profiled.returncode}\n{out}\n{profiled.stderr}"
    said = " ".join(out.split())
    assert f"worker:0 on {h1.name}: traced for 3 s" in said, out
    assert f"worker:1 on {h2.name}: traced for 3 s" in said, out
    assert f"evaluator:0 on {h1.name}: not traced: nothing listens on its profiler port" in said
    assert f"no profiler in tensorboard:0 on {h1.name}: not TensorFlow tasks" in said, out
    assert "profile: 2 of 3 tasks with a profiler traced" in said, out
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
    assert all(p["overview"] > 100 and p["parts"] > 0 for p in pages), pages
    # `tfdeploy tensorboard`: the events pulled as the run went on, the profiles beside them.
    board = board_checked
    assert board["plugins"]["scalars"]["enabled"] is True, board["plugins"]
    assert board["plugins"]["profile"]["enabled"] is True, board["plugins"]
    # Each host's files land once, under one of its tasks' folders (as `tfdeploy pull` puts
    # them): h1's events under worker-0/ or evaluator-0/, h2's under worker-1/.
    runs_with_totals = {run for run, tags in board["tags"].items() if "total" in tags}
    assert {run.split("/", 1)[1] for run in runs_with_totals} == {
        "logs/worker-0",
        "logs/worker-1",
    }, board["tags"]
    if CHROMIUM is not None:  # the page a person opens: TensorBoard's app with both tools
        dom = board["dom"]
        assert "<tb-webapp" in dom, dom[:2000]
        tabs = {t.lower() for t in re.findall(r">\s*(scalars|profile)\s*<", dom, re.I)}
        assert tabs == {"scalars", "profile"}, dom[:4000]
    assert board["rc"] == 0, board["said"]
    with socket.socket() as probe:  # Ctrl-C took TensorBoard with it: nothing listens there
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its closed connections
        probe.bind(("127.0.0.1", board["port"]))
