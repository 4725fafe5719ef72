"""A handle on one run: its tasks' states, its logs, its files, waiting for it, stopping it.

Every method opens connections to the run's hosts and closes them before it returns: a handle
holds nothing open and keeps nothing alive, so it may be pickled away, dropped, or made again
from the run id alone (`attach`) in another process, as a pipeline's next step would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deployer.api.actions import (
    Say,
    discovered,
    inventory_masker,
    pull_files,
    stop,
    unknown_run,
    with_run,
)
from deployer.api.inventories import InventoryLike, load
from deployer.api.logs import read_logs
from deployer.api.views import View, events_to
from deployer.config.inventory import Inventory
from deployer.config.plan import Plan, make_plan
from deployer.config.roles import ROLES
from deployer.core.errors import HostsFailed, JobFailed, TfdeployError, UsageError
from deployer.core.text import task_order
from deployer.hosts.fleet import DEFAULT_CONCURRENCY, Fleet
from deployer.hosts.reply_types import TaskStatus
from deployer.results.metricsync import keep_ended
from deployer.results.pull import PullResult
from deployer.results.runs import (
    HostRun,
    Target,
    resolve,
    survey_runs,
)
from deployer.results.state import load_if_readable
from remote import protocol

UNREACHABLE_S = 60.0  # `wait` gives up on hosts that cannot be asked for this long, in a row


def _nothing(_: str) -> None:
    pass


@dataclass(frozen=True)
class TaskState:
    """One task of a run as its host reports it."""

    task: str  # role:index, e.g. "worker:1"
    host: str
    state: str  # "starting", "running", "exited" or "lost"; "pending" before its host said
    pid: int | None = None
    exit_code: int | None = None
    outcome: str = ""  # "exit code 0", "stopped by tfdeploy", ... once finished; "" before
    restarts: int = 0
    succeeded: bool = False  # exited 0 by itself (a spot notice's exit 0 does not count)
    # The job ends when every awaited task has: chief and workers, unless one runs the built-in
    # server (ParameterServerStrategy's workers); a ps or an evaluator never is.
    awaited: bool = False

    @property
    def label(self) -> str:
        """`task@host`, as the views and `tfdeploy logs` prefix its lines."""
        return f"{self.task}@{self.host}"

    @property
    def finished(self) -> bool:
        return self.state in (protocol.STATE_EXITED, protocol.STATE_LOST)

    @classmethod
    def of(cls, host: str, status: TaskStatus | None, task: str, awaited: bool) -> TaskState:
        if status is None:
            return cls(task, host, "pending", awaited=awaited)
        return cls(
            task=status.name,
            host=host,
            state=status.state,
            pid=status.pid,
            exit_code=status.exit_code,
            outcome=status.outcome() if status.finished else "",
            restarts=status.restarts,
            succeeded=status.succeeded,
            awaited=awaited,
        )


@dataclass(frozen=True)
class LogLine:
    """One line a task printed, with secrets of the run masked as the CLI shows them."""

    label: str  # task@host
    text: str


@dataclass(frozen=True)
class Result:
    """How a run ended: every task's last state. `up` (attached) and `Run.wait` return one only
    when the job succeeded; a failure is raised (JobFailed) instead."""

    run_id: str
    tasks: tuple[TaskState, ...]
    run: Run = field(compare=False, repr=False)  # for its logs and files afterwards

    @property
    def succeeded(self) -> bool:
        """Every awaited task exited 0 by itself."""
        awaited = [t for t in self.tasks if t.awaited]
        return bool(awaited) and all(t.succeeded for t in awaited)


class Run:
    """A started run, found on its hosts by its id. Made by `up(..., detach=True)`, by an
    attached `up`'s Result, or by `attach(run_id)`."""

    def __init__(
        self,
        target: Target,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        awaited: frozenset[str] | None = None,
    ) -> None:
        if target.run_id is None:
            raise UsageError("a Run needs a run id")
        self._target = target
        self._concurrency = concurrency
        self._awaited = awaited  # the awaited tasks' names; None: from the inventory's plan

    @property
    def id(self) -> str:
        assert self._target.run_id is not None  # checked in __init__
        return self._target.run_id

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    def status(self) -> tuple[TaskState, ...]:
        """Every task of the run as its host reports it now.

        Raises HostsFailed when a host cannot be asked, UsageError when no host has the run.
        """
        target = self._discovered()
        with self._fleet(target) as fleet:
            survey = survey_runs(fleet, target)
            keep_ended(fleet, survey.runs, survey.failures)  # the history learns its end
        if survey.failures:
            raise HostsFailed(survey.failures, what="listing runs failed", outcome=None)
        if not survey.runs:
            raise unknown_run(self._target, survey)
        return _states(survey.runs, self._awaited_tasks(target))

    def logs(
        self, *, task: str | None = None, tail: int | None = None, say: Say | None = None
    ) -> list[LogLine]:
        """What the run's tasks (or `task`, e.g. "worker:0") printed so far; with `tail`, each
        task's last `tail` lines. Read from this machine's archive once `up` saw the run end
        (the hosts may be gone), else from the hosts, and from the archive when they cannot be
        asked (`read_logs` has the rule). `say` receives notes on a damaged or cut archive."""
        got: list[LogLine] = []
        self._read_logs(
            lambda label, texts: got.extend(LogLine(label, t) for t in texts), task, tail, say
        )
        return got

    def follow(
        self,
        on_line: Callable[[LogLine], None],
        *,
        task: str | None = None,
        tail: int | None = None,
    ) -> None:
        """Calls `on_line` for each line the tasks print, from the start (or each task's last
        `tail` lines), until every task of the run has ended."""

        def each(label: str, texts: list[str]) -> None:
            for text in texts:
                on_line(LogLine(label, text))

        self._read_logs(each, task, tail, None, follow=True)

    def watch(self, view: View | None = None) -> None:
        """What `tfdeploy attach` shows, as events to `view` (None: quiet), until the run ends:
        returns once every awaited task exited 0; raises JobFailed when the job failed. It owns
        nothing: no lease renewed, no restart made (its keeper's or its `up`'s are watched)."""
        from deployer.api.attaching import watch_run  # the watch machinery: for this call only

        shown = events_to(view)
        try:
            watch_run(self._target, shown, concurrency=self._concurrency)
        finally:
            shown.close()

    def _read_logs(
        self,
        emit: Callable[[str, list[str]], None],
        task: str | None,
        tail: int | None,
        say: Say | None,
        *,
        follow: bool = False,
    ) -> None:
        read_logs(
            self.id,
            emit,
            task=task,
            tail=tail,
            follow=follow,
            say=say,
            target=lambda: self._target,
            hide=inventory_masker(self._target.inventory),
        )

    def pull(
        self,
        patterns: Sequence[str],
        to: str | os.PathLike[str] = ".",
        *,
        tasks: Sequence[str] | None = None,
    ) -> PullResult:
        """Files the tasks wrote (glob patterns relative to each task's directory) into
        `to/<run id>/<role>-<index>/`; only contents missing here travel.

        Raises UsageError when no host has the run, LocalError when `to` cannot be written,
        Interrupted on Ctrl-C (what arrived is kept; the hint says how to fetch the rest)."""
        return pull_files(self._target, patterns, to, tasks=tasks, concurrency=self._concurrency)

    def down(self, *, terminate: bool = False, say: Say | None = None) -> tuple[str, ...]:
        """Stops the run's tasks on every host (even finished ones' escaped processes) and
        returns the hosts where something was stopped; `terminate` also ends the machines
        its host sources created. `say` receives what `tfdeploy down` prints."""
        stopped = stop(self._target, terminate=terminate, say=say or _nothing)
        return tuple(sorted(set(stopped)))

    def wait(self, *, timeout: float | None = None, interval: float = 2.0) -> Result:
        """Blocks until every awaited task (chief, workers; not a worker running the built-in
        server) has ended; returns the Result when they all succeeded. A ps server or an
        evaluator may still run then: `down()` stops it. A kept run is waited for until its
        keeper is done with it: through its restarts' backoffs (every task exited, the next
        attempt to come) and its end (the evaluators' grace, the servers' stop).

        Raises JobFailed when an awaited task failed, or `timeout` seconds passed (the run goes
        on); HostsFailed when hosts could not be asked for UNREACHABLE_S in a row."""
        deadline = None if timeout is None else time.monotonic() + timeout
        unreachable_since: float | None = None
        target = self._discovered()  # once: an [aws] source asks EC2 each time
        with self._fleet(target) as fleet:
            while True:
                survey = survey_runs(fleet, target)
                now = time.monotonic()
                if survey.failures:
                    unreachable_since = unreachable_since or now
                    if now - unreachable_since >= UNREACHABLE_S:
                        raise with_run(
                            HostsFailed(survey.failures, what="waiting failed", outcome=None),
                            self.id,
                        )
                else:
                    unreachable_since = None
                    if not survey.runs:
                        raise unknown_run(self._target, survey)
                    states = _states(survey.runs, self._awaited_tasks(target))
                    # A kept run in its keeper's backoff has every task exited and goes on.
                    kept = any(r.kept for r in survey.runs)
                    if not kept and all(t.finished for t in states if t.awaited):
                        keep_ended(fleet, survey.runs, survey.failures)
                        return self._result(states)
                if deadline is not None and now >= deadline:
                    raise with_run(
                        JobFailed(
                            f"run {self.id} still runs after {timeout:g} s",
                            hint="Run.down() stops it; Run.wait() again waits on",
                        ),
                        self.id,
                    )
                time.sleep(interval)

    def _result(self, states: tuple[TaskState, ...]) -> Result:
        failed = [t for t in states if t.awaited and not t.succeeded]
        if failed:
            first = failed[0]
            raise with_run(
                JobFailed(
                    f"{first.label} of run {self.id} failed ({first.outcome})",
                    hint=f"Run.logs(task={first.task!r}) shows its output",
                ),
                self.id,
            )
        return Result(self.id, states, self)

    def _awaited_tasks(self, target: Target) -> frozenset[str] | None:
        """Which tasks the job ends with, from the plan of the run's inventory (a worker running
        the built-in server is not one); None when it no longer plans: by role then."""
        if self._awaited is None:
            try:
                plan = make_plan(target.inventory)
            except TfdeployError:
                return None
            self._awaited = frozenset(t.name for t in plan.tasks if t.awaited)
        return self._awaited

    def _fleet(self, target: Target) -> Fleet:
        return Fleet(target.hosts, concurrency=self._concurrency)

    def _discovered(self) -> Target:
        return discovered(self._target)


def attach(
    run_id: str,
    *,
    inventory: InventoryLike | None = None,
    base: str | os.PathLike[str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Run:
    """A handle on a run started earlier (here or by `tfdeploy up --detach`).

    Without `inventory`, the run must have been started on this machine from an inventory file
    (its local record names it). A run started from a dict needs that dict (or a file) again.
    Raises UsageError for a run this machine does not know, InventoryError for a bad inventory.
    """
    if inventory is None:
        return Run(resolve(run_id), concurrency=concurrency)
    record = load_if_readable(run_id)  # the inventory says where the run is
    recorded = tuple(h.host() for h in record.hosts) if record is not None else ()
    return Run(Target(load(inventory, base=base), run_id, recorded), concurrency=concurrency)


def started(plan: Plan, run_id: str, inventory: Inventory) -> Run:
    """The handle `up` returns: the run's own hosts and tasks, as its local record has them."""
    awaited = frozenset(t.name for t in plan.tasks if t.awaited)
    return Run(Target(inventory, run_id, plan.hosts), awaited=awaited)


def _states(runs: Sequence[HostRun], awaited: frozenset[str] | None) -> tuple[TaskState, ...]:
    states = [
        TaskState.of(r.host, t, t.name, _is_awaited(t.name, awaited)) for r in runs for t in r.tasks
    ]
    return tuple(sorted(states, key=_task_order))


def _is_awaited(task: str, awaited: frozenset[str] | None) -> bool:
    if awaited is not None:
        return task in awaited
    role = ROLES.get(task.split(":", 1)[0])
    return role is not None and role.awaited


def _task_order(state: TaskState) -> tuple[tuple[str, int], str]:
    return task_order(state.task), state.host
