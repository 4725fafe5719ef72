"""Progress and task metrics in the live view: drawn under the table with rich's public API,
cleared when the phase ends; a folded table's per-role line."""

from __future__ import annotations

import time

from deployer.watch.board import TaskRow
from deployer.watch.progress import HostProgress, Progress
from deployer.watch.series import TaskProgress
from deployer.watch.table import role_progress
from deployer.watch.view import LiveView
from tests.support.terminal import screen, terminal

ROWS = [TaskRow("worker:0", "h1", "running", 4242), TaskRow("worker:1", "h2", "running", 4343)]


def test_a_phases_progress_is_drawn_under_the_table_and_goes_when_it_ends() -> None:
    console = terminal(width=120, height=30)
    view = LiveView(console, refreshes_per_second=0.01)  # redrawn by hand below
    view.tasks(ROWS)
    installing = Progress(
        "installing the job's environment",
        started=time.monotonic() - 12,
        done=1,
        total=2,
        unit="hosts",
        rows=(
            HostProgress("h1", done=40, total=40, unit="wheels", state="done"),
            HostProgress("h2", done=12, total=40, unit="wheels", state="installing"),
        ),
    )
    view.progress(installing)
    view.phase("working")  # redraws the region now
    shown = screen(console).text()
    head = next(line for line in shown if line.startswith("installing the job's environment"))
    assert head.startswith("installing the job's environment: 1 of 2 hosts (12 s)")
    assert any("h2" in line and "installing, 12 of 40 wheels" in line for line in shown)
    table = next(i for i, line in enumerate(shown) if "worker:1" in line)
    assert shown.index(head) > table  # under the table
    view.progress(installing.advanced(finished=True))
    view.phase("working")  # redraws the region now
    assert not any("installing the job" in line for line in screen(console).text()[-8:])
    view.close()


def test_the_table_shows_each_tasks_step_rate_eta_loss_cpu_and_rss() -> None:
    console = terminal(width=160, height=30)
    view = LiveView(console, refreshes_per_second=0.01)
    progress = TaskProgress(
        step=120, total_steps=500, rate=3.2, eta_s=119, loss=0.4123, cpu=180, rss=1_230_000_000
    )
    view.tasks([TaskRow("worker:0", "h1", "running", 42, progress=progress)])
    view.phase("working")  # redraws the region now
    row = next(line for line in screen(console).text() if "worker:0" in line)
    for cell in ("120/500", "3.2", "1m59s", "0.4123", "180%", "1.2 GB"):
        assert cell in row, row
    view.close()


def test_a_folded_table_says_each_roles_progress() -> None:
    rows = [
        TaskRow(
            f"worker:{i}",
            f"h{i}",
            "running",
            progress=TaskProgress(step=100 + i, total_steps=500, rate=2.0, loss=0.5, rss=10**9),
        )
        for i in range(3)
    ]
    assert role_progress(rows) == [
        "  worker: step 100/500 (slowest), steps/s 2 (mean), loss 0.5 (mean), RSS 1.0 GB (max)"
    ]
