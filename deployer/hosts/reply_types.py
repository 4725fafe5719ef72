"""The typed values the control side reads from agents' replies: task statuses, polls, setup
results, collected files, stop reports. Each is built from a reply that the edge
(deployer/hosts/replies.py) checked against its shape in remote/protocol.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from deployer.hosts.replies import Edge, metric_record, mode, text
from remote import protocol


@dataclass(frozen=True)
class Usage:
    """A running task's resources as its host measured them (remote/taskmetrics.py)."""

    cpu: float  # percent of one core: 250.0 is two and a half cores busy
    rss: int  # bytes
    procs: int  # processes in the task's group

    @classmethod
    def from_json(cls, raw: object, edge: Edge, name: str) -> Usage | None:
        if raw is None:
            return None
        d = edge.obj(raw, f"{name}'s usage")
        cpu = edge.number(d.get("cpu"), f"{name}'s usage.cpu")
        if cpu is None or not 0 <= cpu <= 1e6:
            raise edge.error(f"{name}'s usage.cpu", f"is {cpu!r}, not a CPU percent")
        return cls(
            cpu=cpu,
            rss=edge.count(d.get("rss"), f"{name}'s usage.rss"),
            procs=edge.count(d.get("procs"), f"{name}'s usage.procs"),
        )


@dataclass(frozen=True)
class TaskStatus:
    """One task as the host's agent reports it."""

    name: str
    state: str  # one of protocol.TASK_STATES
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # one of protocol.EXIT_REASONS, once exited
    started: float | None = None
    ended: float | None = None
    log_bytes: int = 0
    restarts: int = 0  # how often the task was started again after it ended
    frozen: bool = False  # running, but stopped by a signal (SIGSTOP): it will never progress
    disk_full: str | None = None  # the host's file system that was full when it ended
    notice: str | None = None  # what it was told before it ended: a spot action, "time-limit"
    usage: Usage | None = None  # running tasks, in poll and runs replies
    last: tuple[dict[str, float], ...] = ()  # runs replies: its newest metrics records

    @classmethod
    def from_json(cls, raw: object, edge: Edge, known: Collection[str] | None = None) -> TaskStatus:
        """One task of a host's reply, checked (deployer/hosts/replies.py): its name becomes
        file names here and its texts are printed. `known`: the task names the run asked for."""
        d = edge.obj(raw, "a task")
        name = edge.task(edge.get(d, "name", "a task's name"), "a task's name", known)
        reason, disk_full, notice = d.get("reason"), d.get("disk_full"), d.get("notice")
        action = edge.obj(notice, f"{name}'s notice").get("action") if notice else None
        return cls(
            name=name,
            state=edge.choice(
                edge.get(d, "state", f"{name}'s state"), "state", protocol.TASK_STATES
            ),
            pid=edge.integer(d.get("pid"), f"{name}'s pid", optional=True, name="pid"),
            exit_code=edge.integer(
                d.get("exit_code"), f"{name}'s exit_code", optional=True, name="exit_code"
            ),
            signal=edge.integer(d.get("signal"), f"{name}'s signal", optional=True, name="signal"),
            reason=None if reason is None else text(reason),
            started=edge.number(d.get("started"), f"{name}'s started", "started"),
            ended=edge.number(d.get("ended"), f"{name}'s ended", "ended"),
            log_bytes=edge.count(d.get("log_bytes") or 0, f"{name}'s log_bytes"),
            restarts=edge.count(d.get("restarts") or 0, f"{name}'s restarts"),
            frozen=bool(d.get("frozen")),
            # printed by status, both views of `up` and the final error: cleaned like any text
            disk_full=text(disk_full) if isinstance(disk_full, str) else None,
            notice=text(action)[:40] if isinstance(action, str) else None,  # printed
            usage=Usage.from_json(d.get("usage"), edge, name),
            last=tuple(
                r for r in map(metric_record, edge.items(d.get("last") or [], "last")[:16]) if r
            ),
        )

    @property
    def finished(self) -> bool:
        return self.state in (protocol.STATE_EXITED, protocol.STATE_LOST)

    @property
    def succeeded(self) -> bool:
        """Exited 0 by itself: a task that saved a checkpoint on a spot notice and exited 0 has
        not finished its work."""
        return self.state == protocol.STATE_EXITED and self.exit_code == 0 and not self.preempted

    @property
    def preempted(self) -> bool:
        """Stopped because its machine is being taken away (a spot interruption notice), or
        ended after its allocation's time-limit warning (Slurm's signal, passed on)."""
        return self.reason == protocol.REASON_PREEMPTED

    @property
    def time_limited(self) -> bool:
        """Ended after the scheduler's time-limit warning: its allocation is ending, so no
        restart inside it can help; the next run resumes from the checkpoint it saved."""
        return self.preempted and self.notice == protocol.NOTICE_TIME_LIMIT

    def outcome(self) -> str:
        """'exit 1', 'signal 9', 'lost': how a finished task ended, for reports; and that the
        host's disk was full when it ended (the likely cause of a failure then)."""
        if self.disk_full is None:
            return self._ended()
        return f"{self._ended()}; the host's disk was full ({self.disk_full})"

    def _ended(self) -> str:
        if self.state == protocol.STATE_LOST:
            return "lost (its supervisor vanished: host crash or kill -9)"
        if self.time_limited:
            return "ended at its allocation's time-limit warning (Slurm's signal)"
        if self.reason == protocol.REASON_PREEMPTED:
            return "preempted: its spot instance got an interruption notice"
        if self.reason == protocol.REASON_STOPPED:
            return f"{self.reason} by tfdeploy"
        if self.reason == protocol.REASON_LEASE_EXPIRED:
            return self.reason
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        if self.exit_code is not None and 128 < self.exit_code <= 128 + 64:
            # A shell running the command reports a child killed by signal N as 128+N.
            return f"exit code {self.exit_code}: a process killed by signal {self.exit_code - 128}?"
        return f"exit code {self.exit_code}"


@dataclass(frozen=True)
class Poll:
    tasks: tuple[TaskStatus, ...]
    logs: dict[str, tuple[int, bytes]]  # task name -> (new offset, bytes read)
    listening: frozenset[int]
    # task name -> (new offset in its metrics file, the records read; bad lines dropped)
    metrics: dict[str, tuple[int, tuple[dict[str, float], ...]]] = field(default_factory=dict)


@dataclass(frozen=True)
class SetupResult:
    """The setup op on one host: `ran` is False when the fingerprint's marker was there."""

    code: int  # 0 ok, else the failing command's status (128+N: killed by signal N)
    ran: bool
    tail: tuple[str, ...]  # the last lines this setup wrote


@dataclass(frozen=True)
class RemoteFile:
    """A file a task left on its host, as `collect` lists it."""

    path: str  # relative to the task's directory, or absolute (an absolute pattern's match)
    size: int
    mode: int  # permission bits only (0o777): a host never sets setuid here
    sha256: str | None  # None: listed unhashed, the fetch hashes (Agent.collect's `hashed`)


@dataclass(frozen=True)
class Collected:
    files: tuple[RemoteFile, ...]
    refused: tuple[str, ...]  # patterns or matches not pulled, and why
    unread: int = 0  # of those, files or folders there that could not be read: pull exits 4

    @classmethod
    def from_json(cls, raw: object, edge: Edge, task: str) -> Collected:
        """A task's listing, checked: each path stays inside its task's folder (or is one
        absolute pattern's match), each mode keeps its permission bits, each refusal is text."""
        d = edge.obj(raw, task)
        files = []
        for entry in edge.items(edge.get(d, "files", f"{task}'s files"), f"{task}'s files"):
            if not isinstance(entry, list) or len(entry) != 4:
                raise edge.error(
                    f"{task}'s files", f"hold {entry!r:.60}, not [path, size, mode, sha]"
                )
            path = edge.path(entry[0], f"{task}'s file", absolute=True)
            field = f"{task}'s file {path!r}"
            files.append(
                RemoteFile(
                    path,
                    edge.count(entry[1], f"{field} size"),
                    mode(edge.count(entry[2], f"{field} mode")),
                    edge.sha256(entry[3], f"{field} sha256"),
                )
            )
        refused = edge.texts(d.get("refused", []), f"{task}'s refused")
        return cls(tuple(files), refused, edge.count(d.get("unread", 0), f"{task}'s unread"))


@dataclass(frozen=True)
class Escaped:
    """A process of the run that had left its task's process group, stopped with the run."""

    pid: int
    cmd: str
    signal: int | None  # the last signal it got (None: it was gone before one was sent)


def escaped_text(escaped: Sequence[Escaped], mask: Callable[[str], str]) -> str:
    """The escaped processes a stop killed, for the user: pid, command (masked), last signal."""

    def one(e: Escaped) -> str:
        how = "gone before a signal" if e.signal is None else _signal_name(e.signal)
        return f"pid {e.pid} ({mask(e.cmd)}): {how}"

    what = "process" if len(escaped) == 1 else "processes"
    listed = "; ".join(one(e) for e in escaped)
    left = "of the run that had left its task's process group"
    return f"also stopped {len(escaped)} {what} {left}: {listed}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class StopReport:
    tasks: tuple[TaskStatus, ...]
    escaped: tuple[Escaped, ...] = ()
