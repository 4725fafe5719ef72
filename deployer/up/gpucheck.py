"""`up`'s teardown proof for GPUs: after the stop, no GPU of the run's hosts holds a process of
the run (deployer/hosts/gpurelease.py). What is left is said as warnings: the job's own outcome
stays its exit status, and `tfdeploy down RUN_ID` checks again (and fails while it holds)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpurelease import prove_released
from deployer.hosts.gpureport import GpuReport


def gpus_left(
    fleet: Fleet, members: Sequence[Member], run_id: str, before: Mapping[str, GpuReport]
) -> list[str]:
    """Warning lines, one per host whose GPUs still hold the run; only hosts whose GPUs
    preflight saw (`before`) are asked."""
    asked = [m for m in members if m.name in before and before[m.name].nvidia_smi]
    if not asked:
        return []
    return [
        f"warning: {e.message}; `tfdeploy down {run_id}` checks again"
        for e in prove_released(fleet, asked, run_id, before=before)
    ]
