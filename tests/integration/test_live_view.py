"""The live view in a real terminal (a pty), as a person sees `tfdeploy up` (issues 27 and 29).

What the CLI writes is read back through tests/support/terminal.Screen: the frames rich drew
and erased, the scrollback, the screen at the end.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployer.watch.table import region_rows
from tests.lab import Lab, start_lab
from tests.support.lab_cli import tfdeploy
from tests.support.terminal import Screen, run_in_pty

pytestmark = pytest.mark.lab

# 64 tasks, four to a host: the view folds by tasks; 16 hosts cost a quarter of the agents,
# SSH sessions and sshds that 64 did (the suite's CPU, issue 61), and show the same screen.
HOSTS, TASKS = 16, 64
# A task that says a few things over ~4 s: several frames of the watching phase.
TICKS = """\
import time
for i in range(4):
    print(f"tick {i} of a task that reports its progress in a rather long line", flush=True)
    time.sleep(1)
"""
TICKS_LAST = "tick 3 of a task that reports its progress in a rather long line"


@pytest.fixture(scope="module")
def lab16() -> Iterator[Lab]:
    """16 hosts for this module; stopped afterwards, also on failures."""
    lab = start_lab(HOSTS, "flat")
    try:
        yield lab
    finally:
        lab.stop()


def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "ticks.py").write_text(TICKS)
    return code


def up_in_pty(inventory: Path, state: Path, rows: int, columns: int) -> tuple[int, Screen]:
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state)}
    argv = [sys.executable, "-m", "deployer", "up", str(inventory), "--no-netcheck"]
    code, written = run_in_pty(argv, rows, columns, env, timeout=120)
    screen = Screen(rows, columns)
    screen.feed(written)
    return code, screen


def assert_nothing_left(lab: Lab) -> None:
    left = {h.name: lab.leftovers(h) for h in lab.hosts}
    assert not {name: items for name, items in left.items() if items}


def test_a_64_task_job_stays_within_the_terminal_at_every_frame(lab16: Lab, tmp_path: Path) -> None:
    rows, columns = 40, 100
    inventory = lab16.write_inventory(
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}] * (TASKS // HOSTS)] * HOSTS,
        job={
            "name": "wide",
            "code": str(code_dir(tmp_path)),
            "command": f"{lab16.python} ticks.py",
            "stop_grace": 2,
        },
    )
    state = tmp_path / "state"
    try:
        code, screen = up_in_pty(inventory, state, rows, columns)
        text = screen.text()
        assert code == 0, "\n".join(text[-40:])
        assert screen.overruns == 0  # no frame was taller than the screen
        tables = [f for f in screen.frames if any(line.startswith("┏") for line in f)]
        assert len(tables) >= 5, screen.frames  # the watching phase drew many frames
        for frame in filter(None, screen.frames):
            assert len(frame) <= region_rows(rows), frame  # room is left for log lines
            assert frame[-1].startswith("tfdeploy: "), frame  # never cut off at the bottom
        folded = [f for f in tables if f[0].startswith(f"{TASKS} tasks (worker): ")]
        assert folded and all(any(line.startswith("… ") for line in f) for f in folded)
        assert any("running" in f[0] for f in folded), folded[-1]
        assert any("job succeeded" in line for line in text)
        assert sum("| tick 3 of a task" in line for line in text) == TASKS  # every log line

        # status on the same terminal: a screen by default, every task with --all and --json
        env = os.environ | {"TFDEPLOY_STATE_DIR": str(state)}
        status = [sys.executable, "-m", "deployer", "status", str(inventory)]
        code, written = run_in_pty(status, rows, columns, env, timeout=60)
        shown = Screen(rows, columns)
        shown.feed(written)
        assert code == 0, written
        assert len(shown.text()) <= rows - 2, shown.text()
        (ended,) = [line for line in shown.text() if line.startswith("run wide-")]
        assert ended.endswith(f": ended, {TASKS} exited 0"), shown.text()  # one line: it ended
        run_id = ended.split()[1].rstrip(":")
        named = [sys.executable, "-m", "deployer", "status", run_id, "-i", str(inventory)]
        code, written = run_in_pty(named, rows, columns, env, timeout=60)
        shown = Screen(rows, columns)
        shown.feed(written)
        assert code == 0, written
        assert len(shown.text()) <= rows - 2, shown.text()  # the run named: its tasks, folded
        assert f"{TASKS} tasks (worker): {TASKS} exited 0" in shown.text()
        code, written = run_in_pty([*status, "--all"], rows, columns, env, timeout=60)
        every = Screen(rows, columns)
        every.feed(written)
        assert code == 0, written
        listed = {line.strip("│").split("│")[0].strip() for line in every.text()}
        assert {f"worker:{i}" for i in range(TASKS)} <= listed, every.text()
        document = json.loads(tfdeploy("status", str(inventory), "--json", state=state).stdout)
        assert sum(len(run["tasks"]) for run in document["runs"]) == TASKS
    finally:
        tfdeploy("down", str(inventory), state=state)
    assert_nothing_left(lab16)


def test_the_status_line_follows_the_phase_and_the_final_table_reads_at_80_columns(
    lab16: Lab, tmp_path: Path
) -> None:
    """Issue 29: the line under the table said `preflight of 1 host` through push, start and
    watching, and the final table at 80 columns squeezed the last line to `l…`."""
    rows, columns = 24, 80
    inventory = lab16.write_inventory(
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}], [{"role": "worker"}, {"role": "worker"}]],
        job={
            "name": "phases",
            "code": str(code_dir(tmp_path)),
            "command": f"{lab16.python} ticks.py",
            "stop_grace": 2,
        },
    )
    state = tmp_path / "state"
    try:
        code, screen = up_in_pty(inventory, state, rows, columns)
    finally:
        tfdeploy("down", str(inventory), state=state)
    text = screen.text()
    assert code == 0, "\n".join(text)
    said: list[str] = []  # the status lines of the frames, in order, each once
    for frame in screen.frames:
        if frame and frame[-1].startswith("tfdeploy: ") and frame[-1] not in said[-1:]:
            said.append(frame[-1].removeprefix("tfdeploy: "))
    phases = ["preflight of 2 hosts", "pushing the code", "pushed", "starting", "watching"]
    phases += ["job succeeded", "teardown: stopping run"]
    at = [next((i for i, s in enumerate(said) if s.startswith(p)), -1) for p in phases]
    assert -1 not in at and at == sorted(at), said
    table = text[text.index(next(line for line in text if line.startswith("┏"))) :]
    header = [cell.strip() for cell in table[1].strip("┃").split("┃")]
    last = header.index("last line")
    body = [line for line in table if line.startswith("│")]
    assert len(body) == 3 and all(len(line) <= columns for line in table), table
    for line in body:
        cell = line.strip("│").split("│")[last].strip().removesuffix("…")
        assert len(cell) >= 20 and TICKS_LAST.startswith(cell), table
    assert_nothing_left(lab16)
