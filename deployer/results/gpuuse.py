"""Each running task's GPU memory and utilization, for `status` (where nvidia-smi is present).

The agent's `gpus` op, asked with a run's id, lists the compute processes on the host's GPUs and
names each one's task from its environment (TFDEPLOY_RUN_ID and TFDEPLOY_TASK): the process
holding a GPU is often not the task's own pid (a shell, a launcher such as torchrun, a
DataLoader worker) and may have left its process group, but children keep the environment.
Where the host cannot read a process's environment (another user, another PID namespace) a
process whose pid is the task's own still counts. nvidia-smi gives utilization per GPU, not
per process, so a task's utilization is that of the GPUs its processes are on (shared GPUs
show their total). A host without nvidia-smi, or whose nvidia-smi fails, shows nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpureport import GpuReport, task_gpu_use
from deployer.results.runs import HostRun


def with_gpu_use(fleet: Fleet, runs: Sequence[HostRun]) -> list[HostRun]:
    """`runs` with each running task's GPU use filled in: one `gpus` question per host and
    active run, of the hosts with nvidia-smi (or not known to lack it). A host that cannot
    answer it shows no GPU use (status is about the runs: the
    `runs` answer already said what the host has)."""
    active: dict[str, list[str]] = {}
    for r in runs:
        if fleet.member(r.host).agent.nvidia_smi is False:
            continue  # its hello said it has no nvidia-smi: a round trip per host saved
        if r.active and r.tasks and r.run_id not in active.setdefault(r.host, []):
            active[r.host].append(r.run_id)
    members = [fleet.member(h) for h in active]

    def ask(member: Member) -> dict[str, GpuReport]:
        reports = {}
        for run_id in active[member.name]:
            report = GpuReport.from_json(member.agent.gpus(run_id))
            if not report.nvidia_smi or report.error:
                return {}
            reports[run_id] = report
        return reports

    replies, _ = fleet.each_settled(ask, members)
    return [
        dataclasses.replace(r, gpu_use=task_gpu_use(replies[r.host][r.run_id], r.tasks))
        if r.run_id in replies.get(r.host, {})
        else r
        for r in runs
    ]
