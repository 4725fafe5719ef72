"""Acting on runs after `up` has returned: find them on the hosts, show, follow logs, stop.

The hosts' run directories are the truth; the local record only says which inventory (and so which
hosts) a run id belongs to.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deployer.agent import TaskStatus
from deployer.errors import UsageError
from deployer.fleet import Fleet, Member
from deployer.inventory import Inventory, load_inventory
from deployer.lines import LineAssembler
from deployer.state import load


@dataclass(frozen=True)
class HostRun:
    """One run as one host reports it."""

    host: str
    run_id: str
    job: str
    created: float
    detached: bool
    tasks: tuple[TaskStatus, ...]

    @property
    def active(self) -> bool:
        return any(not t.finished for t in self.tasks)


@dataclass(frozen=True)
class Target:
    """What a `down/status/logs` argument resolves to: an inventory and maybe one run id."""

    inventory: Inventory
    run_id: str | None


def resolve(target: str, inventory: str | None = None) -> Target:
    """TARGET is an inventory file, or a run id found in the local state (or via --inventory)."""
    if Path(target).is_file():
        return Target(load_inventory(target), None)
    if inventory:
        return Target(load_inventory(inventory), target)
    record = load(target)
    if record is None:
        raise UsageError(
            f"{target!r} is neither an inventory file nor a run known on this machine",
            hint="name the inventory too: --inventory FILE (runs are found on the hosts)",
        )
    return Target(load_inventory(record.inventory), record.run_id)


def find_runs(fleet: Fleet, target: Target) -> list[HostRun]:
    """Every run of the inventory's job (or the one run id) on every host, newest first."""

    def runs_on(member: Member) -> list[HostRun]:
        found = []
        for r in member.agent.runs():
            if target.run_id is not None and r["run_id"] != target.run_id:
                continue
            if target.run_id is None and r.get("job") != target.inventory.job.name:
                continue
            found.append(
                HostRun(
                    host=member.name,
                    run_id=r["run_id"],
                    job=r.get("job", ""),
                    created=float(r.get("created") or 0),
                    detached=bool(r.get("detached")),
                    tasks=tuple(TaskStatus.from_json(t) for t in r.get("tasks", [])),
                )
            )
        return found

    def ensure_then_list(member: Member) -> list[HostRun]:
        _ensure_agent(member)
        return runs_on(member)

    results = fleet.each(ensure_then_list, what="listing runs failed")
    runs = [r for host_runs in results.values() for r in host_runs]
    return sorted(runs, key=lambda r: (-r.created, r.run_id, r.host))


def _ensure_agent(member: Member) -> None:
    if member.agent.home is None:
        member.agent.install()


def stop_runs(fleet: Fleet, runs: list[HostRun], grace: float) -> list[HostRun]:
    """Stops the given runs on their hosts (in parallel); returns those that had running tasks."""
    active = [r for r in runs if r.active]
    by_host: dict[str, list[str]] = {}
    for r in active:
        by_host.setdefault(r.host, []).append(r.run_id)
    members = [fleet.member(h) for h in by_host]

    def stop(member: Member) -> None:
        for run_id in by_host[member.name]:
            member.agent.stop(run_id, grace=grace)

    fleet.each(stop, members, what="stopping failed")
    return active


def follow_logs(
    fleet: Fleet,
    run_id: str,
    emit: Callable[[str, str], None],
    *,
    task: str | None = None,
    tail: int | None = None,
    follow: bool = False,
    interval: float = 0.5,
) -> bool:
    """Prints a run's logs by byte offset; with follow, until every task has finished.

    Returns False when no host knows the run (or the task).
    """
    offsets: dict[tuple[str, str], int] = {}
    assemblers: dict[tuple[str, str], LineAssembler] = {}
    first, seen = True, False
    while True:
        active = False
        for member in fleet.members:
            statuses = _statuses(member, run_id)
            wanted = [s for s in statuses or [] if task is None or s.name == task]
            for s in wanted:
                key = (member.name, s.name)
                if key not in offsets:
                    offsets[key] = _tail_offset(s.log_bytes, tail) if first else 0
                    assemblers[key] = LineAssembler()
            for label, lines in _read_logs(member, run_id, wanted, offsets, assemblers).items():
                for line in lines[-tail:] if (first and tail is not None) else lines:
                    emit(label, line)
            seen = seen or bool(wanted)
            active = active or any(not s.finished for s in wanted)
        first = False
        if not follow or not active:
            return seen
        time.sleep(interval)


def _statuses(member: Member, run_id: str) -> list[TaskStatus] | None:
    _ensure_agent(member)
    for r in member.agent.runs():
        if r["run_id"] == run_id:
            return [TaskStatus.from_json(t) for t in r.get("tasks", [])]
    return None


def _tail_offset(size: int, tail: int | None) -> int:
    """Where to start reading to show about `tail` lines without reading a huge log."""
    return 0 if tail is None else max(0, size - 512 * max(tail, 1))


def _read_logs(
    member: Member,
    run_id: str,
    statuses: list[TaskStatus],
    offsets: dict[tuple[str, str], int],
    assemblers: dict[tuple[str, str], LineAssembler],
) -> dict[str, list[str]]:
    """Reads every task's log up to its current end; returns the complete lines per label."""
    out: dict[str, list[str]] = {}
    finished = {s.name for s in statuses if s.finished}
    while statuses:
        request = {s.name: offsets[(member.name, s.name)] for s in statuses}
        poll = member.agent.poll(run_id, request, max_bytes=4 << 20, heartbeat=False)
        progressed = False
        for name, (offset, data) in poll.logs.items():
            key = (member.name, name)
            progressed = progressed or offset > offsets[key]
            offsets[key] = offset
            label = f"{name}@{member.name}"
            lines = assemblers[key].feed(data)
            if not data and name in finished:
                lines += assemblers[key].flush()
            out.setdefault(label, []).extend(lines)
        if not progressed:
            break
    return out
