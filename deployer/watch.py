"""What the controller knows while a run goes on: each task's state and log position, and when
each host last answered.

Kept apart from the phases in lifecycle.py so that the rules (which failure counts first, when a
job is stalled, when a slow host becomes a lost one) read in one place and take no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from deployer.agent import TaskStatus
from deployer.errors import HostError, JobFailed
from deployer.lines import LineAssembler
from deployer.plan import Task
from deployer.secrets import mask_text
from deployer.view import TaskRow

TAIL_LINES = 20
# A host is declared lost when no poll has succeeded for this long. Shorter outages (a reset
# connection that is re-opened, a slow reply under load) are retried every poll tick. A crashed
# host refuses connections at once, a cut link leaves its poll unanswered; either way the window
# runs from the last good contact, so both are seen within HOST_LOSS_S + a tick (< 10 s), never
# after the kernel's ~15-minute retransmission timeout.
HOST_LOSS_S = 6.0


def server_like(task: Task) -> bool:
    """Tasks that must be serving before anyone else starts (TF clients block on them)."""
    return task.is_server or task.role == "ps"


@dataclass
class TaskWatch:
    """What the controller knows of one task while the job runs."""

    task: Task
    offset: int = 0
    status: TaskStatus | None = None
    lines: LineAssembler = field(default_factory=LineAssembler)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    restarts: int = 0  # restarts decided by this controller (failure policy "restart")
    mark: tuple[object, ...] = ()  # (log bytes, state, restarts) at the last observed change
    active_at: float = 0.0  # controller clock at that change: the stall watchdog's input

    @property
    def label(self) -> str:
        return f"{self.task.name}@{self.task.host}"

    @property
    def finished(self) -> bool:
        return self.status is not None and self.status.finished


class TaskBoard:
    """Every task of the run, as the hosts last reported it."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self.watches = {t.name: TaskWatch(t) for t in tasks}

    def __getitem__(self, name: str) -> TaskWatch:
        return self.watches[name]

    def update(self, statuses: Sequence[TaskStatus]) -> None:
        for status in statuses:
            if status.name in self.watches:
                self.watches[status.name].status = status

    def feed(self, name: str, offset: int, data: bytes) -> list[str]:
        """Log bytes read up to `offset`; returns the complete lines to show."""
        watch = self.watches[name]
        watch.offset = offset
        lines = watch.lines.feed(data)
        if watch.status is not None and watch.status.finished and offset >= watch.status.log_bytes:
            lines += watch.lines.flush()
        watch.tail.extend(lines)
        return lines

    def offsets(self, host: str) -> dict[str, int]:
        """Where to read on for each started task of a host."""
        return {
            w.task.name: w.offset
            for w in self.watches.values()
            if w.task.host == host and w.status is not None
        }

    def behind(self) -> bool:
        """Some task's log holds more than the last poll could carry (max_bytes per host)."""
        return any(
            w.status is not None and w.offset < w.status.log_bytes for w in self.watches.values()
        )

    def bytes_read(self) -> int:
        return sum(w.offset for w in self.watches.values())

    def finished(self, name: str) -> bool:
        return self.watches[name].finished

    def first_failure(self, awaited: Sequence[str]) -> str | None:
        """The task that failed first: an awaited task, or a server the others depend on."""
        failed = [
            w
            for w in self.watches.values()
            if w.status is not None
            and w.status.finished
            and not w.status.succeeded
            and (w.task.name in awaited or server_like(w.task))
        ]
        failed.sort(key=lambda w: (w.status.ended or 0.0) if w.status else 0.0)
        return failed[0].task.name if failed else None

    def rows(self, gpu_use: Callable[[Task], str]) -> list[TaskRow]:
        rows = []
        for w in self.watches.values():
            s = w.status
            rows.append(
                TaskRow(
                    name=w.task.name,
                    host=w.task.host,
                    state=s.state if s else "pending",
                    pid=s.pid if s else None,
                    gpus=",".join(map(str, w.task.gpus)) or "-",
                    gpu_use=gpu_use(w.task),
                    started=s.started if s else None,
                    ended=s.ended if s else None,
                    restarts=max(w.restarts, s.restarts if s else 0),
                    outcome=s.outcome() if s and s.finished else "",
                    last_line=w.tail[-1] if w.tail else "",
                )
            )
        return rows

    def failure(self, name: str, what: str, *, run_id: str, secret_env: Sequence[str]) -> JobFailed:
        """The report of a failed task: who, how it ended, and its last log lines."""
        watch = self.watches[name]
        outcome = watch.status.outcome() if watch.status else "unknown"
        tail = "\n".join(f"    {line}" for line in watch.tail) or "    (no output)"
        message = f"{watch.label} {what} ({outcome}); its last {len(watch.tail)} log lines:\n{tail}"
        return JobFailed(
            mask_text(message, watch.task.env, secret_env),
            hint=f"the other tasks were stopped; full log: tfdeploy logs {run_id} --task {name}",
        )

    # ---- the stall watchdog's input and verdict ---------------------------------------------

    def start_stall_clock(self, now: float) -> None:
        """The stall clock starts when watching starts, not when the tasks did."""
        for w in self.watches.values():
            w.active_at = max(w.active_at, now)

    def note_activity(self, now: float) -> None:
        """Remembers when each task last wrote a byte, changed state or was restarted."""
        for w in self.watches.values():
            s = w.status
            mark = (s.log_bytes, s.state, s.restarts, w.restarts) if s else ()
            if mark != w.mark:
                w.mark, w.active_at = mark, now

    def stall(self, awaited: Sequence[str], limit: float | None, now: float, run_id: str) -> None:
        """stall_timeout: a job whose awaited tasks all stay silent is hung, not working.

        A ParameterServerStrategy chief waits forever, without a word, for a frozen worker; only
        a watchdog outside TensorFlow can end that.
        """
        if limit is None:
            return
        last = max(self.watches[n].active_at for n in awaited)
        if now - last < limit:
            return
        running = [w for w in self.watches.values() if w.status and not w.status.finished]
        frozen = [w.label for w in running if w.status and w.status.frozen]
        silent = [w.label for w in running if now - w.active_at >= limit and w.label not in frozen]
        report = f"silent for {limit:g} s or more: {', '.join(silent) or 'none'}"
        if frozen:
            report += f"; frozen (stopped by a signal, e.g. SIGSTOP): {', '.join(frozen)}"
        raise JobFailed(
            f"job stalled: no awaited task ({', '.join(awaited)}) wrote output or exited for "
            f"{now - last:.0f} s (stall_timeout = {limit:g} s); {report}",
            hint="a frozen or hung peer blocks TensorFlow without an error; every task was "
            f"stopped. Logs: tfdeploy logs {run_id}",
        )


@dataclass(frozen=True)
class Loss:
    host: str
    since: float  # seconds without contact
    cause: str


class HostContact:
    """Tells a slow or briefly unreachable host from a lost one.

    A failed or unanswered poll is an outage until HOST_LOSS_S pass without contact; then the
    host is lost. Each retry reconnects if the connection died, so a reset connection costs one
    tick and the logs go on from the same byte offsets.
    """

    def __init__(self) -> None:
        self.last: dict[str, float] = {}  # host -> clock of its last successful call
        self.lost: dict[str, str] = {}  # host -> why it was declared lost
        self.outages: set[str] = set()  # hosts whose last poll failed, not yet lost

    def reached(self, host: str, now: float) -> bool:
        """Records contact; True when it ends an outage (worth telling the user)."""
        self.last[host] = now
        if host in self.outages:
            self.outages.discard(host)
            return True
        return False

    def judge(
        self,
        failures: Sequence[HostError],
        silent: Sequence[str],
        now: float,
        on_outage: Callable[[HostError], None],
    ) -> Loss | None:
        """The first host past HOST_LOSS_S without contact, if any; reports new outages."""
        waiting = [HostError(h, "its poll is still unanswered") for h in silent]
        for failure in [*failures, *waiting]:
            since = now - self.last.setdefault(failure.host, now)
            if failure in waiting and since < HOST_LOSS_S:
                continue  # slow, not (yet) failed: no message
            if since < HOST_LOSS_S:
                if failure.host not in self.outages:
                    self.outages.add(failure.host)
                    on_outage(failure)
                continue
            self.lost[failure.host] = failure.cause
            return Loss(failure.host, since, failure.cause)
        return None
