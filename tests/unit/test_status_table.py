"""`status` with many tasks (issue 27): a screen by default, every task with --all or --json."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from deployer.api.render import status_json, status_table
from deployer.cli.parser import build_parser
from deployer.hosts.reply_types import TaskStatus
from deployer.results.runs import HostRun
from tests.support.helpers import one_line, run_cli
from tests.support.local_jobs import local_job, run_id_of, state  # noqa: F401 (a fixture)

T0 = 1_700_000_000.0
RUN = "fleet-20261124T052848Z-0db3"


def fleet(n: int) -> list[HostRun]:
    """n hosts with one worker each: all running but worker:7 (exit 3), worker:9 (restarted
    twice) and worker:200 (frozen by SIGSTOP)."""
    runs = []
    for i in range(n):
        task = TaskStatus(f"worker:{i}", "running", 10_000 + i, started=T0)
        if i == 7:
            task = TaskStatus("worker:7", "exited", 10_007, exit_code=3, reason="exited")
        elif i == 9:
            task = TaskStatus("worker:9", "running", 10_009, started=T0, restarts=2)
        elif i == 200:
            task = TaskStatus("worker:200", "running", 10_200, started=T0, frozen=True)
        runs.append(HostRun(f"h{i + 1}", RUN, "fleet", T0, False, (task,)))
    return runs


def shown(runs: list[HostRun], height: int | None, width: int = 80) -> list[str]:
    console = Console(file=io.StringIO(), width=width, height=height or 25, color_system=None)
    console.print(status_table(runs, height))
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined, no-any-return]


def tasks_in(lines: list[str]) -> list[str]:
    return [line.strip("│").split("│")[0].strip() for line in lines if line.startswith("│")]


def test_256_tasks_fit_a_screen_with_the_ones_worth_a_look_first() -> None:
    lines = shown(fleet(256), height=40)
    assert len(lines) <= 40 - 2, "\n".join(lines)  # the command and the next prompt fit too
    assert lines[0].startswith(f"run {RUN}")
    assert lines[1] == "256 tasks (worker): 254 running, 1 exited 3, 1 frozen"
    listed = tasks_in(lines)
    assert listed[:3] == ["worker:7", "worker:200", "worker:9"], lines
    assert (
        listed[3:]
        == [f"worker:{i}" for i in range(len(listed) + 1) if i not in (7, 9)][: len(listed) - 3]
    )
    hidden = 256 - len(listed)
    assert lines[-1] == f"… {hidden} more: {hidden} running (`status --all` lists every task)"


def test_all_tasks_without_a_height_and_every_task_in_json() -> None:
    runs = fleet(256)
    assert len(tasks_in(shown(runs, height=None))) == 256
    assert tasks_in(shown(fleet(20), height=40)) == [f"worker:{i}" for i in range(20)]  # fits
    document = json.loads(status_json(runs))
    assert len(document["runs"]) == 256 and all(len(r["tasks"]) == 1 for r in document["runs"])


def test_several_runs_share_the_screen() -> None:
    older = [HostRun(r.host, "fleet-old", "fleet", T0 - 60, False, r.tasks) for r in fleet(100)]
    lines = shown(fleet(100) + older, height=40)
    assert len(lines) <= 40 - 2, "\n".join(lines)
    assert sum(line.startswith("run fleet-") for line in lines) == 2


def test_status_all_is_a_flag() -> None:
    parser = build_parser()
    assert parser.parse_args(["status", "inv.toml", "--all"]).all is True
    assert parser.parse_args(["status", "inv.toml"]).all is False


def ended(run_id: str, n: int, created: float) -> list[HostRun]:
    stopped = [TaskStatus(f"worker:{i}", "exited", 20_000 + i, reason="stopped") for i in range(n)]
    stopped[1] = TaskStatus("worker:1", "exited", 20_001, exit_code=1, reason="exited")
    return [
        HostRun(f"h{i + 1}", run_id, "fleet", created, True, (t,)) for i, t in enumerate(stopped)
    ]


def test_ended_runs_are_one_line_each_after_the_running_ones() -> None:
    old = [
        ended(f"fleet-202511{30 - i}T000000Z-00a{i:x}", 64, T0 - 3600 * (i + 1)) for i in range(11)
    ]
    runs = fleet(20) + [r for run in old for r in run]
    console = Console(file=io.StringIO(), width=80, height=40, color_system=None)
    console.print(status_table(runs, 40, brief_ended=True))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines[0].startswith(f"run {RUN}") and len(tasks_in(lines)) == 20  # the running one
    briefs = [line for line in lines if line.startswith("run fleet-202511")]
    assert briefs[0] == "run fleet-20251130T000000Z-00a0: ended, 63 stopped by tfdeploy, 1 exited 1"
    assert len(briefs) == 40 // 4 and lines[-2] == "… 1 older ended run", lines  # the rest counted
    assert lines[-1] == "`status RUN_ID` or `status --all` lists an ended run's tasks"
    assert all(len(line) <= 80 for line in lines) and len(lines) <= 40 - 2
    # A pipe (no height) lists every ended run; without brief_ended each gets its table again.
    assert len(shown(runs, height=None)) > 11 * 64
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(status_table(runs, None, brief_ended=True))
    piped = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert sum(x.startswith("run fleet-202511") for x in piped) == 11


def test_tasks_are_listed_by_role_and_index_whatever_order_hosts_answered() -> None:
    runs = list(reversed(fleet(12)))
    assert tasks_in(shown(runs, height=None)) == [f"worker:{i}" for i in range(12)]


@pytest.mark.timeout(120)
def test_piped_status_lists_every_task_of_an_ended_run(
    tmp_path: Path,
    state: Path,  # noqa: F811
) -> None:
    """Through the CLI with stdout a pipe (run_cli's is no terminal): an ended run's tasks are
    each listed, as the README says pipes get, not the terminal's one line `ended, 2 exited 0`."""
    inventory = local_job(tmp_path, "true", tasks=2)
    code, out, err = run_cli("up", str(inventory))
    assert code == 0, out + err
    run_id = run_id_of(out)
    code, out, err = run_cli("status", str(inventory))
    assert (code, err) == (0, ""), one_line(out + err)
    assert f"run {run_id}: ended" not in out, out
    assert tasks_in(out.splitlines()) == ["worker:0", "worker:1"], out
    assert sum("exited 0" in line for line in out.splitlines()) == 2, out
