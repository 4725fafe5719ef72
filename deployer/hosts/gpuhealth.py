"""GPU health at preflight: the rules that refuse a bad or busy GPU before anything starts.

Per host and GPU, from nvidia-smi's query interface (the agent's `gpus` op): a GPU fallen off
the bus or reporting an alarm value (`[GPU requires reset]`), uncorrectable volatile ECC errors
over `max_ecc_errors`, retired pages pending, row remapping pending or failed, and compute
processes of someone else on a GPU the plan gives a task (refused unless `allow_busy_gpus`).
MIG mode on and a driver version that differs between hosts are warnings. A value the GPU does
not report (`[N/A]`, `[Not Supported]`) is never a problem. The rules and their keys:
docs/gpus.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from deployer.config.model import Host
from deployer.config.plan import Plan
from deployer.core.errors import HostError
from deployer.hosts.gpureport import Gpu, GpuReport

ECC = "ecc.errors.uncorrected.volatile.total"
YES = "yes"
BAD_GPU_HINT = (
    "take the GPU out of the plan (`gpus = [...]` on the tasks), drain or reset the host "
    '(`nvidia-smi -r -i INDEX` as root, or a reboot), or set gpu_health = "warn" on the host'
)
BUSY_HINT = (
    "stop those processes, give the tasks other GPUs, or set allow_busy_gpus = true on the "
    "host to share the GPU with them"
)


def gpu_health(plan: Plan, reports: Mapping[str, GpuReport]) -> tuple[list[HostError], list[str]]:
    """(problems, warnings) of every host's GPUs; only GPUs the plan gives a task can fail."""
    problems: list[HostError] = []
    warnings: list[str] = []
    for host in plan.hosts:
        report = reports.get(host.name)
        if report is None or report.nvidia_smi is None or report.error:
            continue
        planned = {i for t in plan.tasks_on(host.name) for i in t.gpus}
        bad, notes = _host_health(host, report, planned)
        warnings += notes
        if host.gpu_policy.health == "warn":
            warnings += [f'{p.message} (gpu_health = "warn")' for p in bad]
        elif host.gpu_policy.health == "check":
            problems += bad
        busy, busy_notes = _strangers(plan, host, report)
        problems += busy
        warnings += busy_notes
    warnings += _driver_versions(reports)
    return problems, warnings


def bad_reasons(gpu: Gpu, max_ecc_errors: int = 0) -> list[str]:
    """Why this GPU must not be given a task; empty when it is healthy (or cannot say)."""
    reasons = []
    if gpu.problem:
        reasons.append(f"nvidia-smi reports {gpu.problem}")
    errors = _count(gpu.health.get(ECC))
    if errors is not None and errors > max_ecc_errors:
        reasons.append(
            f"{errors} uncorrectable ECC error(s) since the driver loaded "
            f"(max_ecc_errors = {max_ecc_errors})"
        )
    if _yes(gpu.health.get("retired_pages.pending")):
        reasons.append("retired pages are pending (the GPU needs a reset to retire them)")
    if _yes(gpu.health.get("remapped_rows.pending")):
        reasons.append("row remapping is pending (the GPU needs a reset)")
    if _yes(gpu.health.get("remapped_rows.failure")):
        reasons.append("row remapping failed (the GPU should be replaced)")
    return reasons


def _host_health(
    host: Host, report: GpuReport, planned: set[int]
) -> tuple[list[HostError], list[str]]:
    if host.gpu_policy.health == "off":
        return [], []
    bad: list[HostError] = []
    warnings: list[str] = []
    for bus_id, reason in report.lost:
        bad.append(
            HostError(
                host.name,
                f"the GPU at PCI {bus_id} cannot be reached ({reason}): it has fallen off the "
                "bus, so nvidia-smi's indices may not be the planned ones",
                hint=BAD_GPU_HINT,
            )
        )
    for gpu in report.gpus:
        reasons = bad_reasons(gpu, host.gpu_policy.max_ecc_errors)
        if reasons and gpu.index in planned:
            bad.append(
                HostError(host.name, f"{_gpu_text(gpu)}: {'; '.join(reasons)}", hint=BAD_GPU_HINT)
            )
        elif reasons:
            warnings.append(
                f"{host.name}: {_gpu_text(gpu)} (no task uses it): {'; '.join(reasons)}"
            )
        if (
            gpu.index in planned
            and str(gpu.health.get("mig.mode.current", "")).lower() == "enabled"
        ):
            warnings.append(
                f"{host.name}: {_gpu_text(gpu)} has MIG mode on: CUDA_VISIBLE_DEVICES={gpu.index} "
                "gives its task one MIG instance, not the whole GPU"
            )
    return bad, warnings


def _strangers(plan: Plan, host: Host, report: GpuReport) -> tuple[list[HostError], list[str]]:
    """Someone else's compute processes on a GPU a task gets. Processes of this very run (an
    earlier attempt's, `run` true) are not strangers: preflight waits for them instead."""
    problems, warnings = [], []
    for task in plan.tasks_on(host.name):
        for index in task.gpus:
            gpu = report.gpu(index)
            others = [a for a in report.apps_on(gpu) if a.run is not True] if gpu else []
            if gpu is None or not others:
                continue
            text = (
                f"{_gpu_text(gpu)}, given to {task.name}, already runs compute process(es) "
                f"{', '.join(a.text() for a in others)}"
            )
            if host.gpu_policy.allow_busy:
                warnings.append(f"{host.name}: {text} (allow_busy_gpus = true)")
            else:
                problems.append(HostError(host.name, text, hint=BUSY_HINT))
    return problems, warnings


def _driver_versions(reports: Mapping[str, GpuReport]) -> list[str]:
    versions = {
        name: sorted({g.driver_version for g in r.gpus if g.driver_version})
        for name, r in reports.items()
        if r.gpus
    }
    known = {v for vs in versions.values() for v in vs}
    if len(known) < 2:
        return []
    listed = "; ".join(f"{n} {'/'.join(vs)}" for n, vs in sorted(versions.items()))
    return [f"the hosts' NVIDIA driver versions differ: {listed}"]


def _gpu_text(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.name}, {gpu.uuid})"


def _count(value: str | None) -> int | None:
    """A count, or None for "[N/A]" and the like (a GPU without ECC)."""
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _yes(value: str | None) -> bool:
    return value is not None and value.strip().lower() == YES


def gpu_lines(plan: Plan, reports: Mapping[str, GpuReport]) -> list[str]:
    """`tfdeploy check`'s account of every host's GPUs, one line per host."""
    lines = []
    for host in plan.hosts:
        report = reports.get(host.name)
        if report is None or report.nvidia_smi is None or report.error:
            continue
        drivers = sorted({g.driver_version for g in report.gpus if g.driver_version})
        states = [
            f"{g.index} {'; '.join(bad_reasons(g, host.gpu_policy.max_ecc_errors)) or 'ok'}"
            + (f" ({len(report.apps_on(g))} process(es))" if report.apps_on(g) else "")
            for g in report.gpus
        ] + [f"PCI {bus} lost" for bus, _ in report.lost]
        lines.append(
            f"{host.name}: {len(report.gpus)} GPU(s)"
            + (f", driver {'/'.join(drivers)}" if drivers else "")
            + (f": {', '.join(states)}" if states else "")
        )
    return lines
