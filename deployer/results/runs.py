"""Acting on runs after `up` has returned: find them on the hosts, show, follow logs, stop.

The hosts' run directories are the truth; the local record only says which inventory (and so which
hosts) a run id belongs to.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deployer.config.inventory import Inventory
from deployer.config.roles import LEAD_TASKS
from deployer.core.errors import HostError, HostsFailed, UsageError
from deployer.core.lines import LineAssembler
from deployer.hosts.agent import Escaped, TaskStatus
from deployer.hosts.fleet import Fleet, Member
from deployer.results.archive import LogArchive, read_lines
from deployer.results.state import load
from deployer.sources import load_inventory


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


def find_runs(fleet: Fleet, target: Target, *, outcome: str | None = None) -> list[HostRun]:
    """Every run of the inventory's job (or the one run id) on every host, newest first.

    Raises HostsFailed if a host cannot be asked; `outcome` says what that meant for the verb.
    """
    runs, failures = find_runs_settled(fleet, target)
    if failures:
        raise HostsFailed(failures, what="listing runs failed", outcome=outcome)
    return runs


def task_host(runs: list[HostRun], task: str | None) -> tuple[str, str]:
    """(host, task) of `task` in a run, or of its chief (else worker:0) when None."""
    where = {t.name: r.host for r in runs for t in r.tasks}
    wanted = task or next((n for n in LEAD_TASKS if n in where), None)
    if wanted is None or wanted not in where:
        known = ", ".join(sorted(where)) or "none"
        raise UsageError(f"the run has no task {task or ' or '.join(LEAD_TASKS)} (tasks: {known})")
    return where[wanted], wanted


def find_runs_settled(fleet: Fleet, target: Target) -> tuple[list[HostRun], list[HostError]]:
    """Like find_runs, but the hosts that could not be asked come back instead of raising."""

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

    results, failures = fleet.each_settled(ensure_then_list)
    runs = [r for host_runs in results.values() for r in host_runs]
    return sorted(runs, key=lambda r: (-r.created, r.run_id, r.host)), failures


def _ensure_agent(member: Member) -> None:
    member.agent.look()  # these verbs create nothing on a host


@dataclass(frozen=True)
class Stopped:
    """One run stopped on one host, with the processes that had left their task's group."""

    run: HostRun
    escaped: tuple[Escaped, ...]

    @property
    def anything(self) -> bool:
        """Whether the stop ended something: a running task, or an escaped process."""
        return self.run.active or bool(self.escaped)


def stop_runs(
    fleet: Fleet, runs: list[HostRun], grace: float, *, finished_too: bool = False
) -> tuple[list[Stopped], list[HostError]]:
    """Stops the given runs on their hosts (in parallel): those with running tasks, or with
    finished_too every one (a named run: its escaped processes may outlive its tasks).

    Returns what was stopped and the hosts that failed: one unreachable host must not keep the
    others running.
    """
    chosen = [r for r in runs if finished_too or r.active]
    by_host: dict[str, list[HostRun]] = {}
    for r in chosen:
        by_host.setdefault(r.host, []).append(r)
    members = [fleet.member(h) for h in by_host]

    def stop(member: Member) -> list[Stopped]:
        return [
            Stopped(r, member.agent.stop(r.run_id, grace=grace).escaped)
            for r in by_host[member.name]
        ]

    results, failures = fleet.each_settled(stop, members)
    stopped = [s for host in by_host if host in results for s in results[host]]
    return stopped, failures


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

    Returns False when no host knows the run (or the task). `tail` N starts each task's log at
    the N-th last line (0: print only what comes next), never in the middle of a line.
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
                    start = tail is not None and first
                    offsets[key] = _tail_start(member, run_id, s, tail) if start else 0
                    assemblers[key] = LineAssembler()
            for label, lines in _read_logs(member, run_id, wanted, offsets, assemblers).items():
                for line in lines:
                    emit(label, line)
            seen = seen or bool(wanted)
            active = active or any(not s.finished for s in wanted)
        first = False
        if not follow or not active:
            return seen
        time.sleep(interval)


def sync_archive(fleet: Fleet, run_id: str, archive: LogArchive) -> bool:
    """Fills the local archive with what the hosts wrote since it was last filled (a detached
    run, or one `up` lost sight of); False when no host knows the run."""
    seen = False
    for member in fleet.members:
        for status in _statuses(member, run_id) or []:
            seen = True
            offset = archive.size(status.name)
            while offset < status.log_bytes:
                end = min(status.log_bytes, offset + READ_CHUNK)
                data = _read_range(member, run_id, status.name, offset, end)
                if not data:
                    break
                archive.write(status.name, member.name, offset, data)
                offset += len(data)
    return seen


def archived_lines(run_id: str, task: str | None, tail: int | None) -> list[tuple[str, str]]:
    """The archive's lines of a run (or one task); with `tail`, each task's last `tail`."""
    if tail is None:
        return list(read_lines(run_id, task))
    last: dict[str, deque[tuple[str, str]]] = {}
    for label, line in read_lines(run_id, task):
        last.setdefault(label, deque(maxlen=tail)).append((label, line))
    return [item for lines in last.values() for item in lines]


def _statuses(member: Member, run_id: str) -> list[TaskStatus] | None:
    _ensure_agent(member)
    for r in member.agent.runs():
        if r["run_id"] == run_id:
            return [TaskStatus.from_json(t) for t in r.get("tasks", [])]
    return None


NEWLINE = re.compile(b"\n")
TAIL_WINDOW = 4096  # bytes read back from a log's end at first; grows until N lines fit
READ_CHUNK = 4 << 20  # bytes per poll


def _tail_start(member: Member, run_id: str, status: TaskStatus, tail: int | None) -> int:
    """Where the last `tail` lines of a task's log begin: reads back from the end, in growing
    windows, only as much as those lines take (a log may be gigabytes)."""
    size = status.log_bytes
    if not tail:
        return size
    window = max(TAIL_WINDOW, 128 * tail)
    while True:
        start = max(0, size - window)
        data = _read_range(member, run_id, status.name, start, size)
        # A line starts after each newline (not after the last byte), and at 0; the window's
        # own first byte is not known to start a line unless it is the log's first.
        starts = [m.end() for m in NEWLINE.finditer(data, 0, max(0, len(data) - 1))]
        starts = [0, *starts] if start == 0 else starts
        if len(starts) >= tail or start == 0:
            return start + starts[-tail] if len(starts) >= tail else 0
        window *= 4


def _read_range(member: Member, run_id: str, name: str, start: int, end: int) -> bytes:
    chunks, offset = [], start
    while offset < end:
        want = min(end - offset, READ_CHUNK)
        poll = member.agent.poll(run_id, {name: offset}, max_bytes=want, heartbeat=False)
        new, data = poll.logs.get(name, (offset, b""))
        if new <= offset:
            break  # the log shrank: what was read is all there is
        chunks.append(data[: end - offset])
        offset = new
    return b"".join(chunks)


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
        poll = member.agent.poll(run_id, request, max_bytes=READ_CHUNK, heartbeat=False)
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
