"""`python -m bench.agent_start [--counts 1,6,16] [--reps 5] [--out docs/bench/agent_start.md]`

How long the host agent's `start` of N tasks takes, against N starts of one task each made one
after another (the baseline: a start that waited for each task's supervisor before forking the
next would cost about that). The agent forks every supervisor first and then waits for all of
them (remote/taskops.py `op_start`), so N tasks should cost far less than N single starts.
Each cell is the median of `--reps` runs after one untimed run; every task is `sleep 30`,
stopped after its cell. No lab and no root: the agent runs here on a temporary workdir, driven
exactly as the controller drives it (JSON on stdin, one process per call).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench import report
from bench.tools import make_tmp
from tests.support.agent import call, new_run, ok, start


def _tasks(count: int) -> list[dict[str, str]]:
    return [{"name": f"worker:{i}", "command": "sleep 30"} for i in range(count)]


def _stop(workdir: Path, run_id: str) -> None:
    ok(call(workdir, "stop", run_id=run_id, tasks=None, grace=0))


def together(workdir: Path, count: int, run_id: str) -> float:
    """One `start` call of `count` tasks: wall seconds."""
    new_run(workdir, run_id)
    began = time.monotonic()
    started = start(workdir, *_tasks(count), run_id=run_id)
    seconds = time.monotonic() - began
    assert [t["state"] for t in started] == ["running"] * count, started
    _stop(workdir, run_id)
    return seconds


def one_by_one(workdir: Path, count: int, run_id: str) -> float:
    """`count` calls of one task each, one after another: wall seconds."""
    new_run(workdir, run_id)
    began = time.monotonic()
    for task in _tasks(count):
        [started] = start(workdir, task, run_id=run_id)
        assert started["state"] == "running", started
    seconds = time.monotonic() - began
    _stop(workdir, run_id)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_start")
    parser.add_argument("--counts", default="1,6,16")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    tmp = make_tmp()
    cells: dict[tuple[str, int], list[float]] = {}
    try:
        workdir = tmp / "wd"
        for count in counts:
            for rep in range(1 + args.reps):
                for name, way in (("together", together), ("one_by_one", one_by_one)):
                    seconds = way(workdir, count, f"{name}-{count}-{rep}")
                    if rep:  # the first run of each cell warms caches and is not counted
                        cells.setdefault((name, count), []).append(seconds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with report.tee_to(args.out, "bench.agent_start"):
        _print(args, counts, cells)
    return 0


def _print(
    args: argparse.Namespace, counts: list[int], cells: dict[tuple[str, int], list[float]]
) -> None:
    print(
        f"The agent's `start` of N `sleep 30` tasks in one call, against N one-task calls made one "
        f"after another (the same agent, the same workdir, alternately); medians of {args.reps} "
        f"runs after one untimed run, (min-max); {report.machine()}; load average "
        f"{report.load()}.\n"
    )
    print("| N tasks | one call of N | N calls of one | one call ÷ N calls |")
    print("|---|---|---|---|")
    for count in counts:
        both = [cells[(name, count)] for name in ("together", "one_by_one")]
        medians = [statistics.median(times) for times in both]
        shown = [
            f"{m:.3f} s ({min(t):.3f}-{max(t):.3f})" for m, t in zip(medians, both, strict=True)
        ]
        print(f"| {count} | {shown[0]} | {shown[1]} | {medians[0] / medians[1]:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
