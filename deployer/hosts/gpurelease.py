"""Proof that a stopped run left its GPUs free: no compute process of the run on any GPU.

After `up` ends or `down` stops a run, each of its hosts that has nvidia-smi is asked for the
compute processes on its GPUs (`--query-compute-apps`) with the run's id: the agent marks each
process whose environment carries TFDEPLOY_RUN_ID of the run (children inherit it). The driver
may take a moment to free a dead process's memory, so the check asks again for up to the host's
`gpu_release_s` before it names what is left (pid, process name, memory).

Where the driver lists pids this host cannot see (a task in a container: another PID namespace),
a process cannot be told apart from another job's; there each GPU's `memory.used` must come back
to what preflight saw before the run started (`before`), and a GPU that still holds more is
named with both figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from deployer.core.errors import HostError
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpureport import GpuReport

SLACK_MIB = 64  # memory.used may differ this much from its figure before the run


@dataclass(frozen=True)
class Left:
    """What a stopped run still holds on one host's GPU."""

    host: str
    text: str


def leftovers(
    report: GpuReport,
    host: str,
    before: GpuReport | None = None,
    pids: Collection[int] = (),
) -> list[Left]:
    """The run's compute processes still listed (by environment, or a pid of its tasks: the
    driver may list a dead task's pid until it frees the memory), else (pids unknown here)
    memory not returned."""
    left = [
        Left(host, f"GPU {g.index} ({g.uuid}) still holds {a.text()} of the run")
        for g in report.gpus
        for a in report.apps_on(g)
        if a.run is True or (a.pid is not None and a.pid in pids)
    ]
    if left or before is None:
        return left
    for g in report.gpus:
        unknown = [a for a in report.apps_on(g) if a.run is None]
        old = before.gpu(g.index)
        if not unknown or old is None or old.memory_used is None or g.memory_used is None:
            continue
        if g.memory_used > old.memory_used + SLACK_MIB:
            left.append(
                Left(
                    host,
                    f"GPU {g.index} ({g.uuid}) uses {g.memory_used} MiB, {old.memory_used} MiB "
                    f"before the run; processes this host cannot match to the run (another PID "
                    f"namespace): {', '.join(a.text() for a in unknown)}",
                )
            )
    return left


def prove_released(
    fleet: Fleet,
    members: Iterable[Member],
    run_id: str,
    *,
    before: Mapping[str, GpuReport] | None = None,
    pids: Mapping[str, Collection[int]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    interval: float = 1.0,
) -> list[HostError]:
    """Asks until no GPU of these hosts holds a process of the run, for up to each host's
    `gpu_release_s`; returns one HostError per host naming what is still there. `pids`: the
    run's task (and escaped) pids on each host, as its stop reported them. Hosts without
    nvidia-smi, or whose nvidia-smi fails, prove nothing and are skipped (an unreachable host
    is the stop's own failure, reported there); a host whose hello said it has none is not
    asked (`down`: one round trip per host less)."""
    pending = [m for m in members if m.agent.nvidia_smi is not False]
    deadline = {m.name: clock() + m.host.gpu_policy.release_s for m in pending}
    while True:
        replies, _ = fleet.each_settled(lambda m: m.agent.gpus(run_id), pending)
        found: dict[str, list[Left]] = {}
        for name, reply in replies.items():
            report = GpuReport.from_json(reply)
            if report.nvidia_smi and not report.error:
                left = leftovers(report, name, (before or {}).get(name), (pids or {}).get(name, ()))
                if left:
                    found[name] = left
        pending = [m for m in pending if m.name in found]
        if not pending:
            return []
        if all(clock() >= deadline[m.name] for m in pending):
            return [_error(m, found[m.name]) for m in pending]
        sleep(interval)


def _error(member: Member, left: list[Left]) -> HostError:
    waited = member.host.gpu_policy.release_s
    return HostError(
        member.name,
        f"{'; '.join(x.text for x in left)} after the stop (waited {waited:g} s for the driver "
        "to free it)",
        hint="the process outlived the stop (a child in another session, a process stuck in "
        "the driver): `kill -9 PID` on the host, or reset the GPU; gpu_release_s waits longer",
    )


def prove_runs_released(
    fleet: Fleet, stopped: Iterable[tuple[str, str, Collection[int]]]
) -> list[HostError]:
    """`down`'s proof for each (host, run id, its pids there) it stopped."""
    by_run: dict[str, list[Member]] = {}
    pids: dict[str, dict[str, Collection[int]]] = {}
    for host, run_id, known in stopped:
        by_run.setdefault(run_id, []).append(fleet.member(host))
        pids.setdefault(run_id, {})[host] = known
    return [
        e
        for run_id, members in sorted(by_run.items())
        for e in prove_released(fleet, members, run_id, pids=pids[run_id])
    ]
