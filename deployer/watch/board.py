"""What the controller knows of each task while a run goes on, and the rules that judge it.

Pure: no I/O and no clock of its own. The rules (which failure counts first, whether a failed
task is restarted, when a job is stalled, what a failure report says) read in one place and are
tested as tables; loop.py acts on their answers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from deployer.config.model import EvaluatorFailure, FailurePolicy, Job
from deployer.config.plan import Task
from deployer.config.roles import ROLES, role
from deployer.core.errors import JobFailed
from deployer.core.lines import LineAssembler
from deployer.hosts.reply_types import TaskStatus
from deployer.watch.convention import convention_hint
from deployer.watch.series import TaskProgress, TaskSeries
from remote import protocol

TAIL_LINES = 20


@dataclass(frozen=True)
class TaskRow:
    """One line of the task table: what a view shows of a task, as plain values."""

    name: str  # role:index
    host: str
    state: str
    pid: int | None = None
    gpus: str = "-"
    gpu_use: str = ""  # "87% 20.1/22.5 GiB" of the task's GPUs, when the host has nvidia-smi
    started: float | None = None
    ended: float | None = None
    restarts: int = 0
    outcome: str = ""  # "exit code 0", "killed by signal 9" once finished
    last_line: str = ""
    failed: bool = False  # ended without success by itself (lost, preempted, exit code not 0)
    progress: TaskProgress | None = None  # its step, rate, loss, CPU, RSS (series.py)

    @property
    def label(self) -> str:
        return f"{self.name}@{self.host}"


@dataclass
class TaskWatch:
    """What the controller knows of one task while the job runs."""

    task: Task
    offset: int = 0
    status: TaskStatus | None = None
    lines: LineAssembler = field(default_factory=LineAssembler)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    restarts: int = 0  # restarts decided by this controller (failure policy "restart")
    attempt: int = 0  # the whole job's attempt (policy "restart-job"), TFDEPLOY_ATTEMPT
    mark: tuple[object, ...] = ()  # (log bytes, state, restarts) at the last observed change
    active_at: float = 0.0  # controller clock at that change: the stall watchdog's input
    reported: bool = False  # its failure was reported while the job went on (an evaluator's)
    series: TaskSeries = field(default_factory=TaskSeries)  # its metrics and resources

    @property
    def label(self) -> str:
        again = f" [attempt {self.attempt}]" if self.attempt else ""
        return f"{self.task.name}@{self.task.host}{again}"

    @property
    def finished(self) -> bool:
        return self.status is not None and self.status.finished


class TaskBoard:
    """Every task of the run, as the hosts last reported it."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self.watches = {t.name: TaskWatch(t) for t in tasks}

    def __getitem__(self, name: str) -> TaskWatch:
        return self.watches[name]

    @property
    def attempt(self) -> int:
        return max((w.attempt for w in self.watches.values()), default=0)

    def carry_over(self, previous: TaskBoard, *, moved: set[str]) -> None:
        """After a host was replaced: each task goes on from where `previous` saw it (its log
        offset on its host, its attempt), except the `moved` ones, whose log starts afresh."""
        for name, watch in self.watches.items():
            old = previous.watches.get(name)
            if old is None:
                continue
            watch.attempt, watch.restarts = old.attempt, old.restarts
            watch.series = old.series
            if name not in moved:
                watch.offset, watch.lines = old.offset, old.lines
            else:
                watch.series.offset = 0  # its metrics file starts afresh too

    def next_attempt(self) -> int:
        """A whole-job restart: every task starts afresh; its log goes on where it was."""
        attempt = self.attempt + 1
        for watch in self.watches.values():
            watch.attempt, watch.status, watch.reported = attempt, None, False
            watch.tail.clear()
        return attempt

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

    def metric_offsets(self, host: str) -> dict[str, int]:
        """Where to read on in each started task's metrics file on `host`."""
        return {
            w.task.name: w.series.offset
            for w in self.watches.values()
            if w.task.host == host and w.status is not None
        }

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

    def first_failure(self, awaited: Sequence[str], job: Job | None = None) -> str | None:
        """The task that failed first: an awaited task, or a server the others depend on, or,
        with job.evaluator_failure = "fail", an evaluator."""
        judged = set(awaited)
        if job is not None and job.evaluator_failure == EvaluatorFailure.FAIL:
            judged.update(w.task.name for w in self.watches.values() if ends_after(w.task))
        failed = [
            w
            for w in self.watches.values()
            if w.status is not None
            and w.status.finished
            and not w.status.succeeded
            and (w.task.name in judged or w.task.serves)
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
                    failed=s is not None and evaluation_failed(s),
                    progress=w.series.progress()
                    if w.series.records or w.series.resources
                    else None,
                )
            )
        return rows

    def failed_evaluators(self) -> list[str]:
        """Evaluators that ended by themselves without success (not stopped by tfdeploy), in
        the order they ended: under evaluator_failure = "report" the job goes on without them."""
        failed = [
            w
            for w in self.watches.values()
            if ends_after(w.task) and w.status is not None and evaluation_failed(w.status)
        ]
        failed.sort(key=lambda w: (w.status.ended or 0.0) if w.status else 0.0)
        return [w.task.name for w in failed]

    def report(
        self, name: str, what: str, *, hide: Callable[[str], str], why: str | None = None
    ) -> str:
        """Who failed, how it ended (and `why`, when the controller knows better than the
        outcome), and its last log lines; `hide` masks the run's secrets."""
        watch = self.watches[name]
        outcome = watch.status.outcome() if watch.status else "unknown"
        lines = len(watch.tail)
        tail = "\n".join(f"    {line}" for line in watch.tail) or "    (no output)"
        noun = "log line" if lines == 1 else "log lines"
        because = f": {why}" if why else ""
        return hide(f"{watch.label} {what} ({outcome}){because}; its last {lines} {noun}:\n{tail}")

    def failure(
        self,
        name: str,
        what: str,
        *,
        run_id: str,
        hide: Callable[[str], str],
        why: str | None = None,
    ) -> JobFailed:
        """The report of a failed task, as the error that ends the job."""
        watch = self.watches[name]
        status = watch.status
        outcome = status.outcome() if status else "unknown"
        message = self.report(name, what, hide=hide, why=why)
        if status is not None and status.reason == protocol.REASON_STOPPED:
            # This controller had not stopped anything yet: `down` (or another controller) did.
            message = (
                f"run {run_id} was stopped from elsewhere (`tfdeploy down` or another "
                f"controller): {watch.label} was {outcome}"
            )
        others = "the other tasks were stopped; " if len(self.watches) > 1 else ""
        convention = convention_hint(watch.tail, watch.task.framework)
        return JobFailed(
            hide(message),
            hint=(f"{convention}; " if convention else "")
            + f"{others}full log: tfdeploy logs {run_id} --task {name}",
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

    def stalled(self, awaited: Sequence[str], limit: float | None, now: float) -> str | None:
        """stall_timeout: why the job counts as hung at `now`, or None while it is working.

        A job whose awaited tasks all stay silent is hung: a ParameterServerStrategy chief waits
        forever, without a word, for a frozen worker; only a watchdog outside TensorFlow ends it.
        """
        if limit is None:
            return None
        last = max(self.watches[n].active_at for n in awaited)
        if now - last < limit:
            return None
        running = [w for w in self.watches.values() if w.status and not w.status.finished]
        frozen = [w.label for w in running if w.status and w.status.frozen]
        silent = [w.label for w in running if now - w.active_at >= limit and w.label not in frozen]
        report = f"silent for {limit:g} s or more: {', '.join(silent) or 'none'}"
        if frozen:
            report += f"; frozen (stopped by a signal, e.g. SIGSTOP): {', '.join(frozen)}"
        return (
            f"job stalled: no awaited task ({', '.join(awaited)}) wrote output or exited for "
            f"{now - last:.0f} s (stall_timeout = {limit:g} s); {report}"
        )


def ends_after(task: Task) -> bool:
    """An evaluator: not awaited, but expected to end by itself (roles.py, finishes_after)."""
    return role(task.role).finishes_after


def failed_evaluator(status: TaskStatus) -> bool:
    """For runs read back from the hosts (`status`): an evaluator task (by its name,
    role:index) whose evaluation failed."""
    kind = ROLES.get(status.name.partition(":")[0])
    return kind is not None and kind.finishes_after and evaluation_failed(status)


def evaluation_failed(status: TaskStatus) -> bool:
    """It ended without success by itself: not stopped by tfdeploy (after evaluator_grace, at
    teardown) nor by its lease. A lost supervisor or a spot notice counts: no evaluation."""
    stopped = status.reason in (protocol.REASON_STOPPED, protocol.REASON_LEASE_EXPIRED)
    return status.finished and not status.succeeded and not stopped


def retryable(status: TaskStatus | None, job: Job) -> bool:
    """Policy "restart-job", judged on the first failure (the root cause): a signal or an exit
    code of 128+ (preemption, OOM kill, a lost host) is worth a restart; 1-127 is the program's
    own verdict (a bug) and restarting will not help. `retry_exit_codes` lists codes to retry
    besides (a program's own "try again", e.g. 75): never fewer than signals and 128+. A lost
    host (no status) is retryable: it may come back, or be replaced.
    """
    if status is None or status.state == protocol.STATE_LOST:
        return True
    if status.time_limited:
        return False  # its allocation is ending: a restart inside it would be cut again
    if status.preempted or status.signal is not None:
        return True
    code = status.exit_code
    if code is None or code >= 128:
        return True
    return code in (job.retry_exit_codes or ())


# Ends policy "restart" leaves alone: tfdeploy stopped the task or its lease expired (on purpose),
# or its machine is going away (preempted: it would be started again there in vain).
NOT_RESTARTED = (protocol.REASON_STOPPED, protocol.REASON_LEASE_EXPIRED, protocol.REASON_PREEMPTED)


def may_restart(watch: TaskWatch, job: Job) -> bool:
    """Policy "restart": a failed worker or ps is started again, at most max_restarts times.

    Not a task that tfdeploy itself stopped or whose lease expired: those ended on purpose.
    """
    status = watch.status
    return (
        job.on_failure == FailurePolicy.RESTART
        and role(watch.task.role).restartable_alone
        and watch.restarts < job.max_restarts
        and status is not None
        and status.reason not in NOT_RESTARTED
    )
