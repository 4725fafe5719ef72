"""Acting on runs after `up` has returned: find them on the hosts, show, follow logs, stop.

The hosts' run directories are the truth for what runs. Which hosts a run has is the run's own
record of them, written when its code was pushed: this machine's run record (with how each
host was reached, so a host the inventory dropped since is still asked) and, on every host, the
run's list of host names (so a shell without that record can name the hosts its inventory
lacks instead of leaving their tasks running unseen). See docs/failures.md.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from deployer.config.inventory import Inventory
from deployer.config.model import Host
from deployer.config.roles import LEAD_TASKS
from deployer.core.errors import HostError, HostsFailed, UsageError
from deployer.core.lines import MAX_LINE, Assembler, LineAssembler
from deployer.core.text import join_names, plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpureport import TaskGpu
from deployer.hosts.replies import Edge, text
from deployer.hosts.reply_types import Escaped, TaskStatus
from deployer.results.archive import LogArchive, read_runs
from deployer.results.state import RUN_ID, RunRecord, load, load_if_readable
from deployer.sources import load_inventory
from remote import protocol


@dataclass(frozen=True)
class Recovery:
    """One restart by the run's keeper, as its host recorded it (remote/keeper.py)."""

    attempt: int
    cause: str  # "worker:1 was killed by signal 9"
    task: str | None = None  # a task restarted alone; None: the whole job
    backoff: float | None = None
    started_after_s: float | None = None  # failure seen -> every restarted task running
    stepping_after_s: float | None = None  # failure seen -> the first new step record

    @classmethod
    def from_json(cls, raw: object, edge: Edge) -> Recovery:
        r = edge.obj(raw, "a recovery")
        task = r.get("task")
        return cls(
            attempt=edge.count(r.get("attempt", 0), "a recovery's attempt"),
            cause=text(r.get("cause") or ""),
            task=edge.task(task, "a recovery's task") if task is not None else None,
            backoff=edge.number(r.get("backoff"), "a recovery's backoff"),
            started_after_s=edge.number(r.get("started_after_s"), "started_after_s"),
            stepping_after_s=edge.number(r.get("stepping_after_s"), "stepping_after_s"),
        )

    def line(self) -> str:
        """`restart 1 (worker:1 was killed by signal 9): running again 3.1 s later, training
        again 5.2 s later`, as `status` shows it."""
        what = f"{self.task} restarted" if self.task else f"restart {self.attempt}"
        said = [f"{what} ({self.cause})"]
        if self.started_after_s is not None:
            said.append(f"running again {self.started_after_s:.1f} s later")
        if self.stepping_after_s is not None:
            said.append(f"training again {self.stepping_after_s:.1f} s later")
        return said[0] + (": " + ", ".join(said[1:]) if len(said) > 1 else "")


@dataclass(frozen=True)
class HostRun:
    """One run as one host reports it."""

    host: str
    run_id: str
    job: str
    created: float
    detached: bool
    tasks: tuple[TaskStatus, ...]
    hosts: tuple[tuple[str, str], ...] = ()  # the run's own list: (name, address) of each host
    hosts_at: float = 0.0  # when that list was written (a replaced host gets a newer one)
    gpu_use: tuple[TaskGpu, ...] = ()  # running tasks' GPU use (`status`: results/gpuuse.py)
    # No task yet (or `up --resume`: none running): its `up` is preparing it (pushing,
    # installing, setting up, starting). A run from its preflight's reservation on: `down`
    # stops it, and the host then refuses the rest.
    starting: bool = False
    # Its keeper or warden lives there: a kept run between two attempts (every task exited,
    # the next about to start) is not over (docs/up.md, "A kept run").
    kept: bool = False
    # Not detached and its `up`'s lease is live there: an `up` holds the run (`attach` waits for
    # that `up`'s restarts while it does).
    leased: bool = False
    recoveries: tuple[Recovery, ...] = ()  # its keeper's newest restarts, on the keeper's host
    restarts: int = 0  # how many restarts its keeper made in all (recoveries: the newest 20)
    guard_stop: str | None = None  # why its keeper's guard stopped it, on the keeper's host

    @property
    def active(self) -> bool:
        return self.starting or self.kept or any(not t.finished for t in self.tasks)


@dataclass(frozen=True)
class Target:
    """What a `down/status/logs` argument resolves to: an inventory, maybe one run id, and
    the hosts this machine recorded for that run."""

    inventory: Inventory
    run_id: str | None
    recorded: tuple[Host, ...] = ()

    @property
    def hosts(self) -> tuple[Host, ...]:
        """Whom to ask: a recorded run's own hosts, whatever the inventory lists now (reached
        as the inventory says while it still names them), else the inventory's hosts."""
        if not self.recorded:
            return self.inventory.hosts
        current = {h.name: h for h in self.inventory.hosts}
        return tuple(current.get(h.name, h) for h in self.recorded)

    @property
    def sought(self) -> str:
        """What is looked for, in words: `run ID`, or `runs of job 'NAME'`."""
        if self.run_id is not None:
            return f"run {self.run_id}"
        return f"runs of job {self.inventory.job.name!r}"

    def matches(self, run: HostRun) -> bool:
        if self.run_id is not None:
            return run.run_id == self.run_id
        return run.job == self.inventory.job.name


def resolve(target: str, inventory: str | None = None) -> Target:
    """TARGET is an inventory file, or a run id found in the local state (or via --inventory).

    A run id this machine started also brings the hosts the run was pushed to, even when
    --inventory names an inventory that no longer lists them all.
    """
    if Path(target).is_file():
        return Target(load_inventory(target), None)
    if inventory:  # told where the run is: a record only adds hosts, and a broken one none
        return Target(load_inventory(inventory), target, _recorded(load_if_readable(target)))
    record = load(target)
    if record is None:
        raise UsageError(
            f"{target!r} is neither an inventory file nor a run known on this machine",
            hint="name the inventory too: --inventory FILE (runs are found on the hosts)",
        )
    return Target(load_inventory(record.inventory), record.run_id, _recorded(record))


def _recorded(record: RunRecord | None) -> tuple[Host, ...]:
    return tuple(h.host() for h in record.hosts) if record is not None else ()


@dataclass(frozen=True)
class Survey:
    """What the hosts said: the target's runs, the other runs beside them (to say what was
    there when nothing matched), and the hosts that could not be asked or were not known."""

    runs: list[HostRun]
    others: list[HostRun]
    failures: list[HostError]
    asked: tuple[str, ...]

    def nothing_found(self, target: Target) -> str:
        """No run of the target: what was looked for, where, and what is there instead (a
        renamed job's runs are still on the hosts under the old name)."""
        where = join_names(list(self.asked)) or "no host"
        said = f"no {target.sought} on {where}"
        if target.run_id is None and self.others:
            jobs: dict[str, list[str]] = {}
            for r in self.others:
                ids = jobs.setdefault(r.job or "(unknown job)", [])
                if r.run_id not in ids:
                    ids.append(r.run_id)
            listed = "; ".join(
                f"{job!r}: {plural(len(ids), 'run')} (newest {ids[0]})" for job, ids in jobs.items()
            )
            said += f"; runs of other jobs there: {listed}"
        return said


def find_runs(fleet: Fleet, target: Target, *, outcome: str | None = None) -> list[HostRun]:
    """Every run of the inventory's job (or the one run id) on every host, newest first.

    Raises HostsFailed if a host cannot be asked; `outcome` says what that meant for the verb.
    """
    survey = survey_runs(fleet, target)
    if survey.failures:
        raise HostsFailed(survey.failures, what="listing runs failed", outcome=outcome)
    return survey.runs


def task_host(runs: list[HostRun], task: str | None) -> tuple[str, str]:
    """(host, task) of `task` in a run, or of its chief (else worker:0) when None."""
    where = {t.name: r.host for r in runs for t in r.tasks}
    wanted = task or next((n for n in LEAD_TASKS if n in where), None)
    if wanted is None or wanted not in where:
        known = ", ".join(sorted(where)) or "none"
        raise UsageError(f"the run has no task {task or ' or '.join(LEAD_TASKS)} (tasks: {known})")
    return where[wanted], wanted


def survey_runs(fleet: Fleet, target: Target) -> Survey:
    """Every run on every host of the fleet, split into the target's and the others, newest
    first; the hosts that could not be asked, and the target's hosts the fleet does not know
    (see `unknown_hosts`), come back as failures instead of raising."""

    lists = _HostLists()

    def runs_on(member: Member) -> list[HostRun]:
        # runs() asks in the hello when there was none yet: read-only, like look()
        runs = member.agent.runs(hosts_of=target.run_id)
        return [_host_run(member.name, r, lists) for r in runs]

    results, failures = fleet.each_settled(runs_on)
    found = [r for host_runs in results.values() for r in host_runs]
    found.sort(key=lambda r: (-r.created, r.run_id, r.host))
    runs = [r for r in found if target.matches(r)]
    others = [r for r in found if not target.matches(r)]
    known = {m.name for m in fleet.members}
    failures += unknown_hosts(runs, known, all_runs=target.run_id is not None)
    return Survey(runs, others, failures, tuple(m.name for m in fleet.members))


def task_ended(runs: list[HostRun], task: str) -> str | None:
    """How `task` of the run ended ("stopped by tfdeploy", "exit code 0"), None while it runs."""
    for r in runs:
        for t in r.tasks:
            if t.name == task and t.finished:
                return t.outcome()
    return None


class _HostLists:
    """Every host of a run reports the run's whole host list: N lists of N hosts. Parsed in
    Python for each host that is N² work (a tenth of `down`'s CPU at 128 hosts); a list equal
    to one already parsed (compared in C) is reused instead."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[list[object], tuple[tuple[str, str], ...]]] = {}

    def pairs(self, run_id: str, listed: object) -> tuple[tuple[str, str], ...]:
        if not isinstance(listed, list):
            return ()
        hit = self._parsed.get(run_id)
        if hit is not None and hit[0] == listed:
            return hit[1]
        pairs = tuple(
            (text(item[0]), text(item[1]))  # printed when a host is not in the inventory
            for item in listed
            if isinstance(item, list) and len(item) == 2
        )
        self._parsed[run_id] = (listed, pairs)  # one dict store: safe across the fleet's threads
        return pairs


def _host_run(host: str, raw: object, lists: _HostLists) -> HostRun:
    """One run of a host's `runs` reply, checked at the edge (deployer/hosts/replies.py): its
    run id is printed and named in later requests, its task names become archive files."""
    edge = Edge(host, "runs")
    r = edge.obj(raw, "a run")
    run_id = _run_id(edge, r)
    pairs = lists.pairs(run_id, r.get("hosts"))
    tasks = r.get("tasks")
    created, hosts_at = r.get("created"), r.get("hosts_at")
    recoveries = tuple(
        Recovery.from_json(x, edge) for x in edge.items(r.get("recoveries") or [], "recoveries")
    )
    restarts = edge.integer(r.get("restarts"), "a run's restarts", optional=True, name="restarts")
    return HostRun(
        host=host,
        run_id=run_id,
        job=text(r.get("job") or ""),
        created=edge.number(created, "a run's created", "created") or 0.0,
        detached=bool(r.get("detached")),
        tasks=tuple(TaskStatus.from_json(t, edge) for t in edge.items(tasks or [], "tasks")),
        hosts=pairs,
        hosts_at=edge.number(hosts_at, "a run's hosts_at", "hosts_at") or 0.0,
        starting=r.get("starting") is True,
        kept=r.get("kept") is True,
        leased=r.get("leased") is True,
        recoveries=recoveries,
        restarts=max(restarts or 0, len(recoveries)),
        guard_stop=text(r["guard_stop"])[:300] if isinstance(r.get("guard_stop"), str) else None,
    )


def unknown_hosts(runs: list[HostRun], known: set[str], *, all_runs: bool) -> list[HostError]:
    """The hosts a run says it has that are not among `known`: their tasks cannot be seen or
    stopped from here, and saying nothing would report a partial run as the whole.

    Each run's newest list counts (a host replaced under restart-job leaves the run). With
    `all_runs` False (every run of a job) only runs still active somewhere are checked: an
    old finished run of a host since retired is no news.
    """
    newest: dict[str, HostRun] = {}
    for r in runs:
        if r.hosts and (r.run_id not in newest or r.hosts_at > newest[r.run_id].hosts_at):
            newest[r.run_id] = r
    active = {r.run_id for r in runs if r.active}
    missing: dict[str, HostError] = {}
    for run_id, r in newest.items():
        if not all_runs and run_id not in active:
            continue
        for name, address in r.hosts:
            if name not in known and name not in missing:
                missing[name] = HostError(
                    name,
                    f"run {run_id} also has this host ({address}), which the inventory does not "
                    "list: its tasks were not reached",
                    hint="add the host back to the inventory (or name the inventory the run "
                    "started from with -i), or run this on the machine that started the run: "
                    "its record of the run lists every host",
                )
    return list(missing.values())


def _ensure_agent(member: Member) -> None:
    member.agent.look()  # these verbs create nothing on a host


@dataclass(frozen=True)
class Stopped:
    """One run stopped on one host, with the processes that had left their task's group."""

    run: HostRun
    escaped: tuple[Escaped, ...]

    @property
    def pids(self) -> frozenset[int]:
        """Its tasks' and escaped processes' pids (GPU processes are matched against them)."""
        tasks = {t.pid for t in self.run.tasks if t.pid is not None}
        return frozenset(tasks | {e.pid for e in self.escaped})

    @property
    def anything(self) -> bool:
        """Whether the stop ended something: a running task, or an escaped process."""
        return self.run.active or bool(self.escaped)


def stop_runs(
    fleet: Fleet,
    runs: list[HostRun],
    grace: float,
    *,
    finished_too: bool = False,
    on_host: Callable[[str], None] = lambda host: None,
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
        done = [
            Stopped(r, member.agent.stop(r.run_id, grace=grace).escaped)
            for r in by_host[member.name]
        ]
        on_host(member.name)  # its stops returned: none of its tasks is in its grace now
        return done

    results, failures = fleet.each_settled(stop, members)
    stopped = [s for host in by_host if host in results for s in results[host]]
    return stopped, failures


def follow_logs(
    fleet: Fleet,
    run_id: str,
    emit: Callable[[str, list[str]], None],
    *,
    task: str | None = None,
    tail: int | None = None,
    follow: bool = False,
    interval: float = 0.5,
    assembler: Callable[[], Assembler] = LineAssembler,
    final: list[TaskStatus] | None = None,
) -> bool:
    """Prints a run's logs by byte offset; with follow, until every task has finished (then
    `final`, when given, receives the tasks' last statuses: how the run ended).

    Returns False when no host knows the run (or the task). `tail` N starts each task's log at
    the N-th last line (0: print only what comes next), never in the middle of a line.
    `assembler` makes the lines (the output filter; RawLines for `logs --raw`).
    """
    offsets: dict[tuple[str, str], int] = {}
    assemblers: dict[tuple[str, str], Assembler] = {}
    first, seen = True, False
    while True:
        active = False
        last: list[TaskStatus] = []
        for member in fleet.members:
            statuses, kept = _statuses(member, run_id)
            wanted = [s for s in statuses or [] if task is None or s.name == task]
            last += wanted
            for s in wanted:
                key = (member.name, s.name)
                if key not in offsets:
                    start = tail is not None and first
                    offsets[key] = _tail_start(member, run_id, s, tail) if start else 0
                    assemblers[key] = assembler()
            for label, lines in _read_logs(member, run_id, wanted, offsets, assemblers).items():
                if lines:
                    emit(label, lines)
            seen = seen or bool(wanted)
            # A kept run between two attempts has every task exited, and goes on (its keeper's
            # backoff): followed until its keeper is done with it too.
            active = active or kept or any(not s.finished for s in wanted)
        first = False
        if not follow or not active:
            if final is not None:
                final[:] = last
            return seen
        time.sleep(interval)


def ended_line(run_id: str, statuses: Sequence[TaskStatus]) -> str:
    """`logs -f`'s last line: how the run ended, counted by outcome ('run X ended: 2 exited 0'),
    the first failure named."""
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status.outcome()] = counts.get(status.outcome(), 0) + 1
    said = ", ".join(f"{n} {what}" for what, n in sorted(counts.items(), key=lambda c: -c[1]))
    own = [s for s in statuses if s.reason != protocol.REASON_STOPPED]  # not stopped by us
    failed = sorted(
        (s for s in own if s.finished and not s.succeeded), key=lambda s: s.ended or 0.0
    )
    first = f"; first failure: {failed[0].name} ({failed[0].outcome()})" if failed else ""
    by_itself = bool(statuses) and len(own) == len(statuses)
    verdict = "succeeded" if by_itself and all(s.succeeded for s in statuses) else "ended"
    return f"run {run_id} {verdict}: {said or 'no task'}{first}"


def sync_archive(fleet: Fleet, run_id: str, archive: LogArchive) -> bool:
    """Fills the local archive with what the hosts wrote since it was last filled (a detached
    run, or one `up` lost sight of); a task whose archive is damaged is fetched again whole.
    Of a log larger than the archive keeps, only the part it keeps travels: the rest would be
    let go as it rotated (a week's 10 GB log over a laptop's link took its whole size in time).
    False when no host knows the run."""
    seen = False
    for member in fleet.members:
        for status in _statuses(member, run_id)[0] or []:
            seen = True
            if archive.damage(status.name):
                archive.reset(status.name)
            offset = archive.size(status.name)
            if status.log_bytes - offset > archive.kept():  # copy only what it would keep
                offset = _line_after(member, run_id, status.name, status.log_bytes - archive.kept())
                archive.skip_to(status.name, member.name, offset)
            while offset < status.log_bytes:
                with _Appending(archive, status.name, member.name, offset) as into:
                    end = member.agent.read_log(run_id, status.name, offset, READ_CHUNK, into)
                if end <= offset:
                    break  # the log shrank: what was read is all there is
                offset = end
            if status.finished and offset >= status.log_bytes:
                archive.seal(status.name)
    return seen


def archived_runs(
    run_id: str,
    task: str | None,
    tail: int | None,
    assembler: Callable[[], Assembler] = LineAssembler,
) -> Iterator[tuple[str, list[str]]]:
    """The archive's lines of a run (or one task) as (label, lines) runs, read as they are
    wanted; with `tail`, each task's last `tail`."""
    if tail is None:
        yield from read_runs(run_id, task, assembler)
        return
    if tail == 0:
        return  # nothing to print: no need to read it
    last: dict[str, deque[str]] = {}
    for label, lines in read_runs(run_id, task, assembler):
        last.setdefault(label, deque(maxlen=tail)).extend(lines)
    for label, kept in last.items():
        if kept:
            yield label, list(kept)


def _statuses(member: Member, run_id: str) -> tuple[list[TaskStatus] | None, bool]:
    """The run's tasks on the host (None: it has no such run), and whether its keeper or
    warden lives there."""
    _ensure_agent(member)
    edge = Edge(member.name, "runs")
    for raw in member.agent.runs():
        r = edge.obj(raw, "a run")
        if _run_id(edge, r) == run_id:
            tasks = [TaskStatus.from_json(t, edge) for t in edge.items(r.get("tasks", []), "tasks")]
            return tasks, r.get("kept") is True
    return None, False


def _run_id(edge: Edge, r: dict[str, object]) -> str:
    """A run id as the hosts' run folders are named (RUN_ID): it is printed, and a local run
    folder is named by the one the user gave."""
    run_id = edge.get(r, "run_id", "a run's run_id")
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise edge.error("a run's run_id", f"{run_id!r:.60} is not a run id")
    return run_id


NEWLINE = re.compile(b"\n")
TAIL_WINDOW = 4096  # bytes read back from a log's end at first; grows until N lines fit
# Bytes per poll into the archive. A round bounds no memory (bytes go to the archive as they
# arrive) and no wait (the timeout is per read), but each costs a round trip and a new start of
# the host's reads: in 4 alternating runs of bench.dataplane's 100 MB cell, 32 MB rounds took
# 0.76-0.80 s, one round 0.65-0.77 s.
READ_CHUNK = 128 << 20
PRINT_CHUNK = 8 << 20  # bytes per poll of lines to print (held here as bytes, text and lines)


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


def _line_after(member: Member, run_id: str, name: str, at: int) -> int:
    """Where the first line that begins at or after `at` begins (`at` itself when none ends
    within a line's bound: MAX_LINE cuts such a line anyway)."""
    if at <= 0:
        return 0
    data = _read_range(member, run_id, name, at - 1, at - 1 + 4 * MAX_LINE + 1)
    newline = data.find(b"\n")
    return at if newline < 0 else at + newline


def _read_range(member: Member, run_id: str, name: str, start: int, end: int) -> bytes:
    got: list[bytes] = []
    offset = start
    while offset < end:
        new = member.agent.read_log(run_id, name, offset, min(end - offset, READ_CHUNK), got.append)
        if new <= offset:
            break  # the log shrank: what was read is all there is
        offset = new
    return b"".join(got)[: end - start]


class _Appending:
    """A sink that writes a task's log bytes into the archive as they arrive, a MB at a time
    (each write of the archive opens its file)."""

    def __init__(self, archive: LogArchive, task: str, host: str, offset: int) -> None:
        self.archive, self.task, self.host, self.offset = archive, task, host, offset
        self.pending: list[bytes] = []
        self.size = 0

    def __enter__(self) -> _Appending:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()

    def __call__(self, data: bytes) -> None:
        self.pending.append(data)
        self.size += len(data)
        if self.size >= 1 << 20:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            data = b"".join(self.pending)
            self.archive.write(self.task, self.host, self.offset, data)
            self.offset += len(data)
            self.pending, self.size = [], 0


def _read_logs(
    member: Member,
    run_id: str,
    statuses: list[TaskStatus],
    offsets: dict[tuple[str, str], int],
    assemblers: dict[tuple[str, str], Assembler],
) -> dict[str, list[str]]:
    """Reads every task's log up to its current end; returns the complete lines per label."""
    out: dict[str, list[str]] = {}
    finished = {s.name for s in statuses if s.finished}
    while statuses:
        request = {s.name: offsets[(member.name, s.name)] for s in statuses}
        poll = member.agent.poll(run_id, request, max_bytes=PRINT_CHUNK, heartbeat=False)
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
