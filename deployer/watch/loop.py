"""The watch phase of `up`: poll, show, and act on what the rules say, until the job ends.

Each tick's I/O is the poller's and each judgment is a pure rule's (board.py, contact.py); this
class only loops over them, writes to the view and raises the job's failure. Restarting a task
needs the start phase, so the deployment hands it in.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from deployer.config.model import EvaluatorFailure, FailurePolicy
from deployer.config.plan import Task
from deployer.config.roles import role
from deployer.config.sources import Deadline
from deployer.core.errors import JobFailed
from deployer.core.fold import fold_names
from deployer.core.secrets import Masker
from deployer.core.text import join_names, plural
from deployer.hosts.gpus import GpuMonitor
from deployer.watch.board import may_restart, retryable
from deployer.watch.contact import Loss
from deployer.watch.deadlines import DeadlineNotes
from deployer.watch.guards import GuardStopped, holder_words, verdict
from deployer.watch.poller import Poller, Tick
from deployer.watch.runstate import OnRun
from deployer.watch.view import Display
from remote import protocol
from remote.guards import Guards


class RestartJob(Exception):
    """Policy "restart-job" decided the whole job starts again (the deployment does it)."""

    def __init__(self, cause: str, host: str, *, gone: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause  # "worker:1@h2 was killed by signal 9"
        self.host = host  # where the first failure happened
        self.gone = gone  # the host itself is lost or being taken away: replace it if one can


class Watch(OnRun):
    """Ticks over one run's started hosts; `until_done` returns when the awaited tasks exit."""

    def __init__(
        self,
        poller: Poller,
        view: Display,
        *,
        restart: Callable[[str], None],
        sleep: Callable[[float], None],
        interval: float,
        lease: float,
        hide: Callable[[str], str] | None = None,
        deadlines: tuple[Deadline, ...] = (),
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.poller = poller
        self.hide = hide or Masker()  # masks the run's secret values in a failure's log lines
        self.longest_pause = 0.0  # the longest this controller went between two looks
        self.run = poller.run  # plan, board, run id and clock: shared, never copied
        self.view = view
        self.restart = restart
        self.sleep = sleep
        self.interval = interval
        self.lease = lease
        self.wall = wall  # Unix seconds: a deadline is a time of day, not a run's clock
        self.deadline_notes = DeadlineNotes(deadlines, wall())
        # Set once the run is handed to its keeper (deployer/up/handover.py): the policy is then
        # the keeper's, and this asks whether it still lives (None: its host cannot be asked).
        self.keeper_alive: Callable[[], bool | None] | None = None
        self.holder = "its keeper"  # who restarts once keeper_alive is set (attach: "its `up`")
        self.beats = True  # polls renew the run's lease (attach's never do: it owns nothing)
        self._out_of_touch: set[str] = set()  # kept: hosts lost to this controller, said once
        self._failure_seen = 0.0  # kept: when this watch saw the failure being restarted
        self.holder_ended_run = False  # kept: the keeper ended the run itself (it told its end)
        # The run's guards (up/guards.py), applied here while no keeper holds the run; then
        # `holder_guard` asks the keeper's host why it stopped the run (watch/guards.py).
        self.guards: Guards | None = None
        self.holder_guard: Callable[[], str | None] | None = None

    @property
    def gpu_monitor(self) -> GpuMonitor | None:
        return self.poller.gpu_monitor

    def wait_listening(self, servers: list[Task], deadline: float) -> None:
        waiting = {t.name for t in servers}
        while waiting:
            polls = self.tick().polls
            for poll in polls.values():
                for status in poll.tasks:
                    if status.name in waiting and status.finished:
                        raise self.failure(status.name, "stopped before it served its port")
            for host, poll in polls.items():
                waiting -= {t.name for t in self.plan.tasks_on(host) if t.port in poll.listening}
            if waiting and self.clock() > deadline:
                late = ", ".join(sorted(waiting))
                raise JobFailed(
                    f"{late} did not accept connections on its TF port within "
                    f"{self.plan.job.start_timeout:g} s (start_timeout)",
                    hint="check its log with `tfdeploy logs`, or raise job.start_timeout",
                )
            if waiting:
                self.sleep(self.interval)

    def until_done(self) -> None:
        """Streams logs until every awaited task has exited; fails fast on the first failure."""
        awaited = [t.name for t in self.plan.tasks if t.awaited]
        verb = "exits" if len(awaited) == 1 else "exit"
        self.view.step(f"watching; the job ends when {fold_names(awaited)} {verb}")
        self.board.start_stall_clock(self.clock())
        looked = self.clock()
        while True:
            # A controller stopped (SIGSTOP, Ctrl-Z) or asleep longer than the lease finds its
            # tasks stopped by their hosts: the failure must say why, not only "lease expired".
            now = self.clock()
            self.longest_pause, looked = max(self.longest_pause, now - looked), now
            self.tick()
            self._guard()
            if self.keeper_alive and self._all_succeeded(awaited):
                break  # the keeper then stops the servers: their stop is the job's end, no failure
            failed = self.board.first_failure(awaited, self.plan.job)
            if failed and may_restart(self.board[failed], self.plan.job):
                if self.keeper_alive:
                    self._keeper_restarts_task(failed, awaited)
                else:
                    self.restart(failed)
                continue
            if failed and self.plan.job.on_failure == FailurePolicy.RESTART_JOB:
                try:
                    self._restart_job_or_fail(failed)
                except RestartJob as decision:
                    if not self.keeper_alive:
                        raise
                    self._keeper_restarts_job(decision, failed, awaited)
                    continue
            if failed:
                restarts = self.board[failed].restarts
                after = f" after {plural(restarts, 'restart')}" if restarts else ""
                status = self.board[failed].status
                if status and status.time_limited:
                    raise self.failure(failed, self._time_limit_end())
                what = "was preempted" if status and status.preempted else f"failed{after}"
                raise self.failure(failed, what)
            self._judge_evaluators()
            if all(self.board.finished(n) for n in awaited):
                break
            stalled = self.board.stalled(awaited, self.plan.job.stall_timeout, self.clock())
            if stalled:
                raise JobFailed(
                    stalled,
                    hint="a frozen or hung peer blocks TensorFlow without an error; every task "
                    f"was stopped. Logs: tfdeploy logs {self.run_id}",
                )
            if not self.board.behind():  # a backlog is read at once: waiting only adds latency
                self.sleep(self.interval)
        self.drain()
        self._judge_evaluators()
        self._grace_for_evaluators()
        rest = ""
        if len(self.plan.tasks) > len(awaited):
            rest = "; stopping the rest" if self.beats else f"; {self.holder} stops the rest"
        note = self.evaluator_note()
        self.view.step(f"job succeeded: {fold_names(awaited)} exited 0{note}{rest}")

    # ---- a kept run: the keeper restarts (remote/keeper.py, the same rules and counts) -------

    def _keeper_restarts_task(self, name: str, awaited: list[str]) -> None:
        """Policy "restart" of a kept run: the keeper starts the task again, this `up` says so
        and watches it run again (it never starts it itself: one policy, one restart)."""
        watch = self.board[name]
        outcome = watch.status.outcome() if watch.status else "failed"
        before = self._started([name])
        self._failure_seen = self.clock()
        watch.restarts += 1
        self.view.step(
            f"restarting {watch.label} ({outcome}): restart {watch.restarts} of "
            f"{self.plan.job.max_restarts}, by {self.holder}"
        )
        self._until_restarted(name, before, awaited)

    def _keeper_restarts_job(self, decision: RestartJob, failed: str, awaited: list[str]) -> None:
        """Policy "restart-job" of a kept run: the keeper stops every task, waits its backoff
        and starts them all again; this `up` says so and watches every task start anew."""
        before = self._started([t.name for t in self.plan.tasks])
        self._failure_seen = self.clock()
        attempt = self.board.next_attempt()
        self.view.step(
            f"{decision.cause}: restarting the whole job (restart {attempt} of "
            f"{self.plan.job.max_restarts}, TFDEPLOY_ATTEMPT={attempt}), by {self.holder}, after "
            "stopping every task"
        )
        self._until_restarted(failed, before, awaited)

    def _started(self, names: list[str]) -> dict[str, float | None]:
        return {n: (s.started if (s := self.board[n].status) else None) for n in names}

    def _until_restarted(
        self, failed: str, before: dict[str, float | None], awaited: list[str]
    ) -> None:
        """Ticks until every task of `before` runs as a new process (its start time changed),
        or the job is done; fails the job once the keeper ended the run without that restart,
        or its host cannot be asked for longer than a host may be silent."""
        assert self.keeper_alive is not None
        unknown_since: float | None = None
        while True:
            self.sleep(self.interval)
            self.tick()
            if self._all_succeeded(awaited):
                return
            now_started = self._started(list(before))
            if all(now_started[n] not in (None, before[n]) for n in before):
                after = self.clock() - self._failure_seen
                self.view.step(
                    f"running again {after:.1f} s after the failure was seen: {self.holder} "
                    "restarted it"
                )
                return
            alive = self.keeper_alive()
            now = self.clock()
            unknown_since = None if alive is not None else (unknown_since or now)
            lost = (
                unknown_since is not None and now - unknown_since > self.poller.contact.loss_after
            )
            if alive is False or lost:
                self._holder_stopped()
                self.holder_ended_run = alive is False  # and said so ([job.notify])
                self.tick(heartbeat=True, tolerate=True)
                who = self.holder
                why = f"{who}'s host cannot be asked" if lost else f"{who} ended the run"
                raise self.failure(failed, f"failed; {why} without restarting it")

    def _guard(self) -> None:
        """The run's guards (remote/guards.py): this watch's own while it holds the run; once a
        keeper holds it, what the keeper said when one of its guards stopped the run."""
        if self.keeper_alive is not None:
            self._holder_stopped()
        elif self.guards is not None:
            why = verdict(self.guards, self.clock(), self.gpu_monitor, self.plan)
            if why is not None:
                self.view.step(f"{why}: stopping the run")
                raise GuardStopped(self.run_id, why)

    def _holder_stopped(self) -> None:
        why = holder_words(self.board, self.holder_guard)
        if why is not None:
            self.holder_ended_run = True  # the keeper told the run's end
            self.tick(heartbeat=True, tolerate=True)  # the tasks' last lines
            self.view.step(f"{self.holder} stopped the run: {why}")
            raise GuardStopped(self.run_id, why, by=self.holder)

    def await_holder_end(self, within: float) -> bool:
        """A kept run whose awaited tasks succeeded: until its keeper ended it (evaluators'
        grace, the servers stopped, its end told), at most `within` s; whether it did."""
        assert self.keeper_alive is not None
        deadline = self.clock() + within
        while self.clock() < deadline:
            if self.keeper_alive() is False:
                self.holder_ended_run = True
                return True
            self.sleep(self.interval)
            self.tick(tolerate=True)
        return False

    def _all_succeeded(self, awaited: list[str]) -> bool:
        return all((s := self.board[n].status) is not None and s.succeeded for n in awaited)

    def evaluator_note(self) -> str:
        """', but the evaluator failed (...)' when one did: the job's success is not the whole
        story (evaluator_failure = "report"; with "fail" the job failed instead)."""
        failed = self.board.failed_evaluators()
        if not failed:
            return ""
        outcomes = []
        for name in failed:
            status = self.board[name].status
            outcomes.append(f"{self.board[name].label}: {status.outcome() if status else 'lost'}")
        noun = "the evaluator" if len(failed) == 1 else f"{len(failed)} evaluators"
        return f", but {noun} failed ({'; '.join(outcomes)})"

    def _judge_evaluators(self) -> None:
        """An evaluator's failure is shown when it happens, as any failure is. Under
        evaluator_failure = "report" the job goes on; under "fail" it fails the job (while the
        training runs, first_failure has it first, so that on_failure applies)."""
        failed = self.board.failed_evaluators()
        if failed and self.plan.job.evaluator_failure == EvaluatorFailure.FAIL:
            raise self.failure(failed[0], "failed after the training succeeded")
        for name in failed:
            watch = self.board[name]
            if watch.reported:
                continue
            watch.reported = True
            self.drain()  # its last log lines
            report = self.board.report(name, "failed", hide=self.hide)
            self.view.step(
                f'{report}\nthe job goes on without it (evaluator_failure = "report"; '
                f'"fail" makes a failed evaluator fail the job). Full log: '
                f"tfdeploy logs {self.run_id} --task {name}"
            )

    def _restart_job_or_fail(self, failed: str) -> None:
        """Raises RestartJob when the first failure is worth it and attempts remain."""
        job, watch = self.plan.job, self.board[failed]
        outcome = watch.status.outcome() if watch.status else "lost"
        if not retryable(watch.status, job):
            if watch.status is not None and watch.status.time_limited:
                raise self.failure(failed, self._time_limit_end())
            codes = (
                f"signals, exit codes 128+ and retry_exit_codes = {list(job.retry_exit_codes)} "
                "are retried"
                if job.retry_exit_codes
                else "only signals and exit codes 128+ are retried"
            )
            raise self.failure(failed, f"failed with a permanent error, not restarted ({codes})")
        if self.board.attempt >= job.max_restarts:
            left = f"failed; no restart left (max_restarts = {job.max_restarts})"
            raise self.failure(failed, left)
        gone = watch.status is None or watch.status.preempted
        raise RestartJob(f"{watch.label} {outcome}", watch.task.host, gone=gone)

    def _time_limit_end(self) -> str:
        """A task ended at its allocation's time-limit warning: the run ends (a restart inside
        an ending allocation would be cut again); what the next run resumes from."""
        where = (
            "`tfdeploy up` again resumes from the checkpoint in TFDEPLOY_CHECKPOINT_DIR"
            if self.plan.job.checkpoint_dir is not None
            else "set [job] checkpoint_dir so that the next `tfdeploy up` resumes from it"
        )
        return f"ended at its allocation's time-limit warning, not restarted; {where}"

    def drain(self) -> None:
        """Reads what finished tasks wrote after the last poll: every line is shown, even a
        backlog larger than one poll carries."""
        while self.board.behind():
            before = self.board.bytes_read()
            self.tick()
            if self.board.bytes_read() == before:
                return  # no progress (a log shrank or vanished): nothing more to show

    def _grace_for_evaluators(self) -> None:
        """Evaluators still running get job.evaluator_grace to evaluate the last checkpoint;
        one that ended already is not waited for (nor spoken of: its end was reported)."""
        evaluators = [t.name for t in self.plan.tasks if role(t.role).finishes_after]
        running = [n for n in evaluators if not self.board.finished(n)]
        if not running:
            return
        grace = self.plan.job.evaluator_grace
        verb = "finishes" if len(running) == 1 else "finish"
        self.view.step(
            f"waiting up to {grace:g} s (evaluator_grace) until {join_names(running)} {verb}"
        )
        deadline = self.clock() + grace
        while self.clock() < deadline and not all(self.board.finished(n) for n in running):
            self.sleep(self.interval)
            self.tick()
            self._judge_evaluators()
        late = [n for n in running if not self.board.finished(n)]
        if late:
            them = "it" if len(late) == 1 else "them"
            self.view.step(
                f"{join_names(late)} still running after {grace:g} s (evaluator_grace): "
                f"stopping {them} with the rest"
            )

    def tick(self, *, heartbeat: bool = True, tolerate: bool = False) -> Tick:
        """One poll of every started host, shown; a lost host fails the job."""
        tick = self.poller.tick(heartbeat=heartbeat and self.beats, tolerate=tolerate)
        self._out_of_touch -= set(tick.polls)  # answered: a later silence is said again
        for host in tick.recovered:
            self.view.step(f"contact with {host} is back; logs resume where they stopped")
        for label, lines in tick.lines:
            self.view.lines(label, lines)
        for outage in tick.outages:
            self.view.step(
                f"no answer from {outage.host} ({outage.cause}); retrying for up to "
                f"{self.poller.contact.loss_after:g} s"
            )
        self.view.tasks(self.board.rows(self._gpu_use))
        for note in self.deadline_notes.due(self.wall()):
            self.view.step(note)
        if tick.loss is not None:
            self._host_lost(tick.loss)
        return tick

    def _host_lost(self, loss: Loss) -> None:
        if self.keeper_alive is not None:  # the run is its keeper's, which watches the host
            if loss.host not in self._out_of_touch:
                self._out_of_touch.add(loss.host)
                self.view.step(
                    f"no contact with {loss.host} for {loss.since:.1f} s; {self.holder} "
                    "holds the run's policy: this controller keeps trying"
                )
            self.poller.rewatch(loss.host)
            return
        self.view.step(f"host {loss.host} lost after {loss.since:.1f} s without contact")
        job = self.plan.job
        if job.on_failure == FailurePolicy.RESTART_JOB and self.board.attempt < job.max_restarts:
            raise RestartJob(f"host {loss.host} was lost ({loss.cause})", loss.host, gone=True)
        tasks = [t.name for t in self.plan.tasks_on(loss.host)]
        raise loss.error(tasks, lease=self.lease, status_command=self._status_command())

    def _status_command(self) -> str:
        return f"tfdeploy status {self.run_id} -i {self.plan.inventory.path}"

    def failure(self, name: str, what: str) -> JobFailed:
        self.tick(heartbeat=True, tolerate=True)  # drain the last log lines of the task
        return self.board.failure(
            name, what, run_id=self.run_id, hide=self.hide, why=self._why(name)
        )

    def _why(self, name: str) -> str | None:
        """Why a task's lease expired, when this controller itself was the silent one."""
        status = self.board[name].status
        if status is None or status.reason != protocol.REASON_LEASE_EXPIRED:
            return None
        if self.longest_pause < self.lease:
            return None
        return (
            f"this controller was paused for {self.longest_pause:.0f} s (SIGSTOP, Ctrl-Z, a "
            f"suspended machine?), longer than the lease ({self.lease:g} s without a heartbeat), "
            "so the hosts stopped the run themselves"
        )

    def _gpu_use(self, task: Task) -> str:
        return self.gpu_monitor.usage(task) if self.gpu_monitor else ""
