"""What one host's nvidia-smi reported (the `gpus` op's reply, read once at the edge): its GPUs,
their health fields, the compute processes on them, and GPUs it cannot reach; and what that
says of each running task's use (`status`, deployer/results/gpuuse.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployer.hosts.replies import task_name_ok
from deployer.hosts.reply_types import TaskStatus


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: int | None  # MiB
    memory_used: int | None  # MiB
    utilization: int | None  # percent
    pci_bus_id: str = ""
    driver_version: str = ""
    # nvidia-smi's words for the health fields its driver knows (protocol.GPU_HEALTH_FIELDS)
    health: Mapping[str, str] = dataclasses.field(default_factory=dict)
    problem: str | None = None  # a value such as "[GPU requires reset]" in its row


@dataclass(frozen=True)
class GpuApp:
    """A compute process on a GPU, as the driver lists it."""

    gpu_uuid: str
    pid: int | None
    process_name: str = ""
    used_memory: int | None = None  # MiB
    run: bool | None = None  # of the run asked about; None: the host cannot tell (a container)
    task: str | None = None  # its TFDEPLOY_TASK, when it is of the run asked about

    def text(self) -> str:
        memory = f"{self.used_memory} MiB" if self.used_memory is not None else "? MiB"
        return f"pid {self.pid} ({self.process_name or '?'}, {memory})"


@dataclass(frozen=True)
class GpuReport:
    """One host's answer to the `gpus` op."""

    nvidia_smi: str | None  # its path; None when the host has none
    error: str | None
    gpus: tuple[Gpu, ...]
    apps: tuple[GpuApp, ...]  # compute processes
    lost: tuple[tuple[str, str], ...] = ()  # (PCI bus id, reason) of GPUs nvidia-smi cannot reach

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GpuReport:
        return cls(
            nvidia_smi=d.get("nvidia_smi"),
            error=d.get("error"),
            gpus=tuple(
                Gpu(
                    index=int(g["index"]),
                    uuid=str(g.get("uuid", "")),
                    name=str(g.get("name", "")),
                    memory_total=_int(g.get("memory_total")),
                    memory_used=_int(g.get("memory_used")),
                    utilization=_int(g.get("utilization")),
                    pci_bus_id=str(g.get("pci_bus_id", "")),
                    driver_version=str(g.get("driver_version", "")),
                    health=dict(g.get("health") or {}),
                    problem=g.get("problem"),
                )
                for g in d.get("gpus", [])
            ),
            apps=tuple(
                GpuApp(
                    gpu_uuid=str(a.get("gpu_uuid", "")),
                    pid=_int(a.get("pid")),
                    process_name=str(a.get("process_name", "")),
                    used_memory=_int(a.get("used_memory")),
                    run=a.get("run"),
                    # a host's word becomes a key of `status --json`: a plan's task name or none
                    task=a["task"] if task_name_ok(a.get("task")) else None,
                )
                for a in d.get("apps", [])
            ),
            lost=tuple((str(x["pci_bus_id"]), str(x["reason"])) for x in d.get("lost", [])),
        )

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def apps_on(self, gpu: Gpu) -> tuple[GpuApp, ...]:
        return tuple(a for a in self.apps if a.gpu_uuid == gpu.uuid)


@dataclass(frozen=True)
class TaskGpu:
    """One running task's use of the GPUs, as nvidia-smi lists its processes."""

    task: str
    gpus: tuple[int, ...]  # indices of the GPUs its processes are on
    memory_mib: int  # its processes' GPU memory, summed
    utilization: int | None  # mean utilization.gpu (%) of those GPUs

    def text(self) -> str:
        """'40% 500 MiB': what the status table's GPU column says."""
        percent = "?%" if self.utilization is None else f"{self.utilization}%"
        return f"{percent} {self.memory_mib} MiB"


def task_gpu_use(report: GpuReport, tasks: Sequence[TaskStatus]) -> tuple[TaskGpu, ...]:
    """The running tasks' GPU use in one host's report (asked with their run's id)."""
    running = {t.name for t in tasks if not t.finished}
    by_pid: dict[int | None, str] = {
        t.pid: t.name for t in tasks if not t.finished and t.pid is not None
    }
    held: dict[str, list[tuple[Gpu, GpuApp]]] = {}
    for gpu in report.gpus:
        for app in report.apps_on(gpu):
            # its environment names the task; unreadable there (run None), its pid may
            name = app.task if app.run else by_pid.get(app.pid) if app.run is None else None
            if name is not None and name in running:
                held.setdefault(name, []).append((gpu, app))
    return tuple(_use(name, pairs) for name, pairs in sorted(held.items()))


def _use(task: str, pairs: list[tuple[Gpu, GpuApp]]) -> TaskGpu:
    gpus = {g.index: g for g, _ in pairs}
    utils = [g.utilization for g in gpus.values() if g.utilization is not None]
    return TaskGpu(
        task=task,
        gpus=tuple(sorted(gpus)),
        memory_mib=sum(a.used_memory or 0 for _, a in pairs),
        utilization=round(sum(utils) / len(utils)) if utils else None,
    )


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
