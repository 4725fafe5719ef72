"""GPUs as the hosts report them: preflight checks, the re-plan for `gpus = "auto"`, live usage.

The agent's `gpus` op runs nvidia-smi on a host. Preflight asks every host that wants GPUs
(`gpus = N`, `gpus = "auto"`, or a task naming GPU indices) and then plans again with the counts
the hosts reported, so `CUDA_VISIBLE_DEVICES` follows the hardware actually found.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from deployer.config.model import Host
from deployer.config.plan import Plan, Task
from deployer.core.errors import HostError
from deployer.hosts.gpuhealth import gpu_health
from deployer.hosts.gpureport import Gpu as Gpu  # re-exported
from deployer.hosts.gpureport import GpuApp as GpuApp
from deployer.hosts.gpureport import GpuReport as GpuReport

POLL_INTERVAL = 3.0  # seconds between GPU usage queries while a job runs: nvidia-smi is cheap
NO_SMI_HINT = (
    "install the NVIDIA driver on the host (it provides nvidia-smi), or remove `gpus` from the "
    "host and its tasks to run on CPU"
)


def wants_gpus(host: Host) -> bool:
    """Whether preflight must ask the host's nvidia-smi."""
    return host.gpus_auto or host.gpus > 0 or any(spec.gpus for spec in host.tasks)


def _why(host: Host) -> str:
    if host.gpus_auto:
        return 'gpus = "auto"'
    if host.gpus:
        return f"gpus = {host.gpus}"
    return "a task names GPU indices"


def check_gpus(
    plan: Plan, reports: Mapping[str, GpuReport]
) -> tuple[Plan, list[HostError], list[str]]:
    """Checks the GPUs each host reported; returns the re-planned Plan, problems and warnings.

    Problems (preflight fails): no nvidia-smi or a failing one where GPUs were requested, fewer
    GPUs than `gpus = N`, a task naming an index the host lacks, and the health rules of
    gpuhealth.py (a bad GPU, another's processes on a planned GPU).
    """
    problems: list[HostError] = []
    replaced: dict[str, Host] = {}
    for host in plan.hosts:
        if not wants_gpus(host):
            continue
        report = reports.get(host.name)
        if report is None or report.nvidia_smi is None:
            problems.append(
                HostError(
                    host.name,
                    f"GPUs were requested ({_why(host)}) but nvidia-smi was not found on the host",
                    hint=NO_SMI_HINT,
                )
            )
            continue
        if report.error:
            problems.append(HostError(host.name, f"nvidia-smi failed: {report.error}"))
            continue
        found = sorted(g.index for g in report.gpus)
        listed = f"nvidia-smi lists {len(found)} GPU(s)" + (
            f": indices {', '.join(map(str, found))}" if found else ""
        )
        if host.gpus_auto and not found:
            problems.append(HostError(host.name, f'gpus = "auto" but {listed}'))
            continue
        if not host.gpus_auto and host.gpus > len(found):
            problems.append(HostError(host.name, f"gpus = {host.gpus} but {listed}"))
            continue
        for spec in host.tasks:
            for index in spec.gpus or ():
                if index not in found:
                    problems.append(
                        HostError(
                            host.name,
                            f"{spec.key}.gpus: GPU {index} does not exist: {listed}",
                        )
                    )
        if host.gpus_auto:
            replaced[host.name] = dataclasses.replace(host, gpus=len(found))
    if problems:
        return plan, problems, []
    if replaced:
        hosts = tuple(replaced.get(h.name, h) for h in plan.inventory.hosts)
        plan = plan.with_hosts(hosts)
    problems, warnings = gpu_health(plan, reports)
    return plan, problems, warnings


def monitored_hosts(plan: Plan, reports: Mapping[str, GpuReport]) -> set[str]:
    """Hosts whose GPU usage the live view shows: nvidia-smi answered, a task has GPUs."""
    return {
        name
        for name, report in reports.items()
        if report.nvidia_smi and not report.error and any(t.gpus for t in plan.tasks_on(name))
    }


def usage_text(task: Task, report: GpuReport | None) -> str:
    """'87% 20.1/22.5 GiB': mean utilization and summed memory of the task's GPUs."""
    if report is None or not task.gpus:
        return ""
    gpus = [g for g in (report.gpu(i) for i in task.gpus) if g is not None]
    utils = [g.utilization for g in gpus if g.utilization is not None]
    used = [g.memory_used for g in gpus if g.memory_used is not None]
    total = [g.memory_total for g in gpus if g.memory_total is not None]
    if not utils and not used:
        return ""
    parts = [f"{round(sum(utils) / len(utils))}%" if utils else "?%"]
    if used and total:
        parts.append(f"{sum(used) / 1024:.1f}/{sum(total) / 1024:.1f} GiB")
    return " ".join(parts)


def usage_numbers(task: Task, report: GpuReport | None) -> dict[str, float]:
    """What usage_text says, as numbers: gpu_util (mean %), gpu_mem (GiB used, summed)."""
    if report is None or not task.gpus:
        return {}
    gpus = [g for g in (report.gpu(i) for i in task.gpus) if g is not None]
    utils = [g.utilization for g in gpus if g.utilization is not None]
    used = [g.memory_used for g in gpus if g.memory_used is not None]
    found: dict[str, float] = {}
    if utils:
        found["gpu_util"] = float(sum(utils)) / len(utils)
    if used:
        found["gpu_mem"] = round(float(sum(used)) / 1024, 2)
    return found


class GpuMonitor:
    """Asks GPU hosts for their usage at most every `interval` seconds while the job runs."""

    def __init__(
        self,
        hosts: set[str],
        *,
        interval: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hosts = hosts
        self.interval = interval
        self.clock = clock
        self.reports: dict[str, GpuReport] = {}
        self._last: float | None = None

    def due(self) -> bool:
        return bool(self.hosts) and (
            self._last is None or self.clock() - self._last >= self.interval
        )

    def update(self, reports: Mapping[str, GpuReport]) -> None:
        self._last = self.clock()
        self.reports.update(reports)

    def usage(self, task: Task) -> str:
        return usage_text(task, self.reports.get(task.host))

    def numbers(self, task: Task) -> dict[str, float]:
        """The task's GPUs as numbers for its series: mean utilization (%), memory used (GiB)."""
        return usage_numbers(task, self.reports.get(task.host))
