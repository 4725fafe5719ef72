"""`up`'s teardown proof for GPUs: after the stop, no GPU of the run's hosts holds a process of
the run (deployer/hosts/gpurelease.py). What is left is said as warnings: the job's own outcome
stays its exit status, and `tfdeploy down RUN_ID` checks again (and fails while it holds)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpurelease import prove_released
from deployer.hosts.gpureport import GpuReport
from deployer.watch.board import TaskBoard


def gpus_left(
    fleet: Fleet,
    members: Sequence[Member],
    run_id: str,
    before: Mapping[str, GpuReport],
    pids: Mapping[str, Collection[int]],
) -> list[str]:
    """Warning lines, one per host whose GPUs still hold the run; only hosts whose GPUs
    preflight saw (`before`) are asked."""
    asked = [m for m in members if m.name in before and before[m.name].nvidia_smi]
    if not asked:
        return []
    return [
        f"warning: {e.message}; `tfdeploy down {run_id}` checks again"
        for e in prove_released(fleet, asked, run_id, before=before, pids=pids)
    ]


def task_pids(board: TaskBoard) -> dict[str, set[int]]:
    """The pids the run's tasks had on each host, as the board last saw them."""
    pids: dict[str, set[int]] = {}
    for watch in board.watches.values():
        if watch.status is not None and watch.status.pid is not None:
            pids.setdefault(watch.task.host, set()).add(watch.status.pid)
    return pids
