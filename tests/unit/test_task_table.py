"""The live view's task table with many tasks and on narrow terminals (issues 27 and 29).

Rendered into a real rich console of a given size, and read back as a person would see it.
"""

from __future__ import annotations

import io
from collections import Counter

import pytest
from rich.console import Console

from deployer.core.fold import counts_text, fold
from deployer.watch.board import TaskRow
from deployer.watch.table import Heard, TaskTable, region_rows, task_panel
from deployer.watch.view import LiveView
from tests.support.terminal import Screen

NOW = 1_000.0


def rows(n: int, **changes: dict[str, object]) -> list[TaskRow]:
    """n running workers on hosts h1..hn; `changes` by task name ("worker:7": {...})."""
    made = []
    for i in range(n):
        row = TaskRow(
            f"worker:{i}", f"h{i + 1}", "running", 4000 + i, started=NOW - 90,
            last_line=f"epoch 3/8 step {i} loss=0.{i:04d} accuracy=0.97 and more words",
        )  # fmt: skip
        made.append(TaskRow(**(row.__dict__ | changes.get(row.name, {}))))
    return made


def render(renderables: list[object], width: int, height: int = 50) -> list[str]:
    console = Console(file=io.StringIO(), width=width, height=height, color_system=None)
    for renderable in renderables:
        console.print(renderable)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined, no-any-return]


def cell(line: str, column: int) -> str:
    return line.strip("│").split("│")[column].strip()


def test_fold_keeps_the_most_important_and_counts_the_rest() -> None:
    items = list(range(10))
    folded = fold(items, 3, rank=lambda i: -i, kind=lambda i: "even" if i % 2 == 0 else "odd")
    assert folded.shown == [9, 8, 7]
    assert folded.rest == Counter({"even": 4, "odd": 3}) and folded.hidden == 7
    assert fold(items, 20, rank=lambda i: i, kind=str).shown == items  # all fit: all shown
    assert counts_text(Counter({"exited 0": 12, "running": 240, "lost": 2})) == (
        "240 running, 12 exited 0, 2 lost"
    )


@pytest.mark.parametrize("host", ["h1", "ip-10-0-12-34.eu-west-1.compute.internal"])
def test_the_final_table_keeps_the_last_line_readable_at_80_columns(host: str) -> None:
    """Issue 29: once tasks exit, the last line was squeezed to `l…` at 80 columns."""
    finished = {
        "worker:0": {"state": "exited", "outcome": "exit code 0", "ended": NOW, "host": host},
        "worker:1": {
            "state": "exited",
            "outcome": "exit code 137: a process killed by signal 9?",
            "failed": True,
            "restarts": 2,
            "gpus": "0,1",
            "gpu_use": "87% 20.1/22.5 GiB",
        },
    }
    lines = render([TaskTable(rows(2, **finished), now=NOW)], 80)
    assert all(len(line) <= 80 for line in lines), lines
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == 2, lines  # one line per task: nothing wrapped
    header = [c.strip() for c in lines[1].strip("┃").split("┃")]
    last = header.index("last line")
    for line, row in zip(body, rows(2), strict=True):
        shown = cell(line, last).removesuffix("…")
        assert len(shown) >= 20 and row.last_line.startswith(shown), lines
    states = [cell(line, header.index("state")) for line in body]
    assert states == ["exited 0", "exited 137"], lines
    assert "restarts" in header  # kept: a restart is worth its column


def test_many_tasks_fold_into_counts_and_the_tasks_worth_a_look() -> None:
    changes = {
        "worker:7": {"state": "exited", "outcome": "exit code 3", "failed": True},
        "worker:11": {"restarts": 2},
        "worker:250": {"state": "lost", "outcome": "lost (its supervisor vanished)"},
    }
    many = rows(256, **changes)
    many += [TaskRow("chief:0", "c1", "exited", 1, started=NOW - 90, outcome="exit code 0")]
    said = {row.label: 100 for row in many}
    said["worker:40@h41"] = 3  # behind the others: the slowest
    heard_at = {row.label: NOW - 5 for row in many}
    heard_at["worker:30@h31"] = NOW - 200  # nothing printed for 200 s: silent
    heard = Heard(heard_at, said, NOW)
    lines = render([*task_panel(many, 20, heard, now=NOW)], 100)
    assert len(lines) == 20, lines
    assert lines[0] == "257 tasks: 254 running, 1 exited 0, 1 exited 3, 1 lost"
    assert lines[1] == "  worker 256: 254 running, 1 exited 3, 1 lost"
    assert lines[2] == "  chief 1: 1 exited 0"
    shown = [cell(line, 0) for line in lines if line.startswith("│")]
    # failed first (in plan order), then restarted, then silent, then the slowest
    assert shown[:5] == ["worker:7", "worker:250", "worker:11", "worker:30", "worker:40"]
    header = [c.strip() for c in lines[4].strip("┃").split("┃")]
    silent = next(line for line in lines if line.startswith("│worker:30 "))
    assert cell(silent, header.index("quiet")) == "3:20"
    running_shown = len(shown) - 2  # all but worker:7 and worker:250
    assert lines[-1] == f"… {257 - len(shown)} more: {254 - running_shown} running, 1 exited 0"


@pytest.mark.parametrize("height", [10, 24, 40, 100])
def test_the_live_region_fits_the_terminal_whatever_the_number_of_tasks(height: int) -> None:
    """The region (table and status line) takes region_rows(height) lines at most, and the
    status line is always its last line: never cut off by rich's overflow ellipsis."""
    for n in (1, 8, 30, 256):
        console = Console(
            file=io.StringIO(),
            width=100,
            height=height,
            force_terminal=True,
            _environ={"TERM": "xterm-256color"},
        )
        view = LiveView(console, refreshes_per_second=0.1)
        view.step("watching; the job ends when every worker exits")
        view.tasks(rows(n))
        view.lines("worker:0@h1", ["a line"])
        view.step("still watching")  # a print: the region is redrawn below it
        view.close()
        screen = Screen(height, 100)
        screen.feed(console.file.getvalue())  # type: ignore[attr-defined]
        assert screen.overruns == 0
        last = screen.frames[-1]  # the region as the print of "still watching" erased it
        assert any(line.startswith(("┏", f"{n} tasks")) for line in last), (n, height, last)
        if height >= 24:  # room for a table, folded or not
            assert any(line.startswith("┏") for line in last), (n, height, last)
        for frame in screen.frames:
            assert len(frame) <= region_rows(height), (n, height, frame)
            assert frame[-1].startswith("tfdeploy: "), (n, height, frame)
