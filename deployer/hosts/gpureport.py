"""What one host's nvidia-smi reported (the `gpus` op's reply, read once at the edge): its GPUs,
their health fields, the compute processes on them, and GPUs it cannot reach."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
                )
                for a in d.get("apps", [])
            ),
            lost=tuple((str(x["pci_bus_id"]), str(x["reason"])) for x in d.get("lost", [])),
        )

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def apps_on(self, gpu: Gpu) -> tuple[GpuApp, ...]:
        return tuple(a for a in self.apps if a.gpu_uuid == gpu.uuid)


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
