"""One `up`: preflight every host, push, set up, start in TF's order, watch, and always tear down.

Whatever ends the job (success, a failed task, a missed deadline, Ctrl-C, a signal, an error of
tfdeploy's own), every task that was started is stopped before `up` returns, unless the user asked
to detach. This module only sequences the phases; the rules it applies live in board.py (tasks),
contact.py (hosts) and preflight.py, and each tick of I/O is poller.py's.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from deployer.config.model import NetcheckMode
from deployer.config.plan import Plan
from deployer.config.sources import Holdings
from deployer.core.secrets import Masker
from deployer.core.text import plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpus import GpuMonitor
from deployer.results.archive import LogArchive
from deployer.results.state import new_run_id
from deployer.up import resume
from deployer.up.artifacts import ArtifactsPull
from deployer.up.cutshort import CutShort
from deployer.up.dashboard import Dashboard
from deployer.up.guards import arm
from deployer.up.letgo import LetGo
from deployer.up.notifying import RunNotifier
from deployer.up.prepare import Preparation
from deployer.up.records import Journal, Lineage, archive_warning, keep_facts
from deployer.up.recovery import Recovery
from deployer.up.start import StartPhase
from deployer.up.teardown import Teardown
from deployer.watch.board import TaskBoard
from deployer.watch.guards import GuardStopped
from deployer.watch.loop import RestartJob, Watch
from deployer.watch.poller import POLL_WAIT_S, Poller
from deployer.watch.runstate import RunState
from deployer.watch.view import Display, SteadyView, masked_view


def next_steps(run_id: str, artifacts: Sequence[str], *, detached: bool) -> list[str]:
    """`up`'s last lines: the run id again (it scrolled off with the push) and the commands
    that look at the run later, from any shell of this machine."""
    patterns = " ".join(shlex.quote(p) for p in artifacts) or "'PATTERN'"
    steps = [
        f"  logs:  tfdeploy logs {run_id}",
        f"  files: tfdeploy pull {run_id} {patterns}    (into ./tfdeploy-runs/{run_id}/)",
    ]
    if detached:
        kept = ", then pulls its artifacts" if artifacts else ""
        steps.append(f"  stop:  tfdeploy down {run_id}    (stops it{kept})")
    return [f"next, for run {run_id}:", *steps]


@dataclass(frozen=True)
class UpOptions:
    detach: bool = False
    poll_interval: float = 0.25
    # A controller silent this long makes hosts stop the run; None: the inventory's
    # job.lease_seconds (default 60).
    lease_seconds: float | None = None
    poll_wait: float = POLL_WAIT_S  # how long a tick waits for slow hosts
    # Which TF connections preflight tries (--netcheck, --no-netcheck); None: job.netcheck.
    netcheck: NetcheckMode | None = None
    refresh_env: bool = False  # resolve the job's environment afresh (--refresh-env)
    resume: str | None = None  # `up --resume RUN`: that run goes on instead of a new one


class Deployment:
    """Carries one run from plan to teardown; `run` returns the exit status.

    `holdings`: what the host sources hold for this `up` (a Slurm allocation), which recovery
    asks to give the hosts back after a requeue; the caller that provisioned them ends them.
    """

    def __init__(
        self,
        plan: Plan,
        fleet: Fleet,
        view: Display,
        options: UpOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        environ: Mapping[str, str] | None = None,
        holdings: Holdings | None = None,
    ) -> None:
        self.fleet = fleet
        self.options = options
        self.run_state = RunState(options.resume or new_run_id(plan.job.name), plan, clock)
        self.run_id = self.run_state.run_id
        self.contacted_hosts: set[str] = set()  # hosts that may hold the run: teardown's list
        environ = os.environ if environ is None else environ
        # job.forward_env: only the names listed there, never the controller's env implicitly.
        self.forwarded = {n: environ[n] for n in plan.job.forward_env if n in environ}
        self.hide = run_masker(plan, self.forwarded)
        # The run's archive keeps none of its secrets (results/archive.py masks with hide).
        self.archive = LogArchive(self.run_id, on_failure=self._archive_failed, hide=self.hide)
        self.journal = Journal(masked_view(view, self.hide))  # up's phases, for `report`
        self._view = SteadyView(self.journal)  # steady once teardown begins
        view = self.view = self._view
        self.outcome: dict[str, object] = {"outcome": "unknown"}
        self.lineage = Lineage(began=time.time())  # `up --resume`: the run's, kept
        self.dashboard = Dashboard(fleet, self.run_state, view, detached=options.detach)
        self.gpu_monitor = GpuMonitor(set(), clock=clock)
        self.poller = Poller(
            fleet,
            self.run_state,
            gpu_monitor=self.gpu_monitor,
            wait_s=options.poll_wait,
            archive=self.archive,
        )
        self.recovery: Recovery
        self.notifier = RunNotifier(plan.job.notify, self.run_id, plan.job.name, view.step)
        lease = options.lease_seconds or plan.job.lease_seconds
        self.watching = Watch(
            self.poller,
            view,
            restart=self._restart_task,
            sleep=sleep,
            interval=options.poll_interval,
            lease=lease,
            hide=self.hide,
            deadlines=plan.inventory.deadlines,
        )
        self.teardown = Teardown(
            fleet,
            self.run_state,
            self.poller,
            self.watching,
            self._view,
            self.hide,
            self.contacted_hosts,
        )
        self.prepare = Preparation(
            fleet,
            self.run_state,
            view,
            self.teardown,
            self.gpu_monitor,
            self.forwarded,
            lease=lease,
            netcheck=options.netcheck,
            detached=options.detach,
            refresh_env=options.refresh_env,
        )
        self.pull_artifacts = ArtifactsPull(fleet, self.run_state, view, self.contacted_hosts)
        self.start = StartPhase(
            fleet,
            self.run_state,
            self.poller,
            self.watching,
            view,
            self.forwarded,
            on_start=self.pull_artifacts.tasks_started,
        )
        self.recovery = Recovery(
            self.prepare,
            fleet,
            self.run_state,
            self.watching,
            view,
            forwarded=self.forwarded,
            sleep=sleep,
            interval=options.poll_interval,
            holdings=holdings or Holdings(),
        )
        self.letgo = LetGo(fleet, self.run_state, self.watching, view, self.prepare)
        self.cut_short = CutShort(
            self.run_id,
            fleet,
            self.poller,
            self._view,
            teardown=self.teardown,
            recovery=self.recovery,
            pull=self.pull_artifacts,
        )

    @property
    def members(self) -> list[Member]:
        return self.prepare.members  # recovery replaces a gone host's

    @property
    def plan(self) -> Plan:
        return self.run_state.plan

    @property
    def board(self) -> TaskBoard:
        return self.run_state.board

    def clock(self) -> float:
        return self.run_state.clock()

    # ---- phases -------------------------------------------------------------------------

    def run(self) -> int:
        try:
            code = self._phases()
            self.outcome = {"outcome": "running" if self.options.detach else "succeeded"}
            self._tell_end("finished", "succeeded")
            return code
        except GuardStopped as exc:  # stopped on purpose: max_cost, gpu_idle_stop (guards.py)
            self.outcome = {"outcome": "stopped", "why": exc.why}
            self._tell_end("finished", "stopped", exc.why)
            self.cut_short.after_failure()
            raise
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (errors.Terminated)
            self.outcome = {"outcome": "stopped", "why": "interrupted"}
            self._tell_end("finished", "stopped", "interrupted")
            signum = int(getattr(exc, "signum", signal.SIGINT))
            raise self.cut_short.after_interrupt(signum) from None
        except BaseException as exc:
            self.outcome = {"outcome": "failed", "why": self.hide(str(exc)).partition("\n")[0]}
            self._tell_end("failed", "failed", str(self.outcome["why"]))
            self.cut_short.after_failure()
            raise
        finally:
            self._view.steady = True
            self._close()
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C again: leave at once
                self.notifier.close()

    def _tell_end(self, event: str, outcome: str, why: str = "") -> None:
        """[job.notify] of the run's end, if this `up` holds it (notifying.py says when)."""
        attempt, held = self.board.attempt, self.letgo.held_here
        self.notifier.tell_end(event, outcome=outcome, why=why, attempt=attempt, held=held)

    def _phases(self) -> int:
        found = None
        if self.options.resume is not None:  # `up --resume RUN`: the run, found (resume.py)
            found = resume.look_for(self.fleet, self.plan, self.run_id, self.archive, self.view)
        # max_cost priced and gpu_idle_stop armed, or refused, before anything starts.
        began = self.lineage.began if found is None else found.began
        self.watching.guards = arm(self.plan, began, self.clock(), detached=self.options.detach)
        # The push's first request stops the network check's stand-ins on each host (and a
        # stop of the run does, should it fail before): one round trip less.
        findings = self.prepare.preflight(keep_stand_ins=True, resume=found is not None)
        if found is not None:
            self.lineage = resume.go_on(found, findings.facts, self.board, self.archive)
            self.start.resuming = True
            self.view.step(resume.resuming(self.run_id, self.board.attempt))
        self.contacted_hosts.update(m.name for m in self.members)  # teardown reaches them
        self.prepare.push(findings.manifest, findings.workdir_groups, findings.empty_stores)
        self.prepare.install_environment()
        self.prepare.setup(findings.manifest)
        self.recovery.arm_idle_stop()
        self.prepare.firewall_up()
        self.start_and_watch()
        if self.options.detach:
            self.letgo.detach()
            for line in next_steps(self.run_id, self.plan.job.artifacts, detached=True):
                self.view.step(line)
            return 0
        self.letgo.await_keeper()
        self.teardown()
        self.pull_artifacts()
        note = self.watching.evaluator_note()
        if note:  # the job's outcome is said last but for the next steps
            self.view.step(f"the job succeeded{note}")
        for line in next_steps(self.run_id, self.plan.job.artifacts, detached=False):
            self.view.step(line)
        return 0

    def _close(self) -> None:
        """The tunnel, the archive's end and the view's: each runs whatever the one before did."""
        try:
            self.dashboard.close()
        finally:
            try:
                if self.contacted_hosts:  # the run reached its hosts: `runs` lists it
                    keep_facts(
                        self.archive,
                        self.run_state,
                        self.journal,
                        self.lineage,
                        self.outcome,
                        self.hide,
                    )
                if self.archive.files and self.contacted_hosts and not self.options.detach:
                    self.archive.end()  # `logs RUN_ID` reads it from here, hosts or not
            finally:
                self.view.close()

    def check(self) -> int:
        """`tfdeploy check`: preflight alone. Its port reservations are given back at once."""
        try:
            # keep_stand_ins: the release stops them, one round trip less
            findings = self.prepare.preflight(keep_stand_ins=True)
            self.fleet.each_settled(lambda m: m.agent.release(self.run_id), self.members)
            for line in findings.gpu_lines:
                self.view.step(line)
            tasks, hosts = plural(len(self.plan.tasks), "task"), plural(len(self.members), "host")
            self.view.step(f"check ok: nothing was started (up would start {tasks} on {hosts})")
        finally:
            self.view.close()
        return 0

    def start_and_watch(self) -> None:
        """Starts the job and streams logs until every awaited task has exited (detached: only
        starts). Under on_failure = "restart-job" a failure worth it starts it all again."""
        cause = ""
        while True:
            try:
                self.start(self.members)
                event = "recovered" if "started" in self.notifier.sent else "started"
                self.notifier.tell(event, outcome="running", why=cause, attempt=self.board.attempt)
                self.dashboard.forward()
                if not self.options.detach:
                    self.letgo.keep_attached()
                    self.watching.until_done()
                return
            except RestartJob as decision:
                self.recovery.restart_job(decision)
                cause = decision.cause

    def _restart_task(self, name: str) -> None:
        """Policy "restart", held by this `up`: the task started again, and told."""
        self.recovery.restart_task(name)
        label = self.board[name].label
        self.notifier.tell("recovered", outcome="running", why=f"{label} restarted")

    def _archive_failed(self, why: str) -> None:
        self.view.step(archive_warning(self.run_id, why))


def run_masker(plan: Plan, forwarded: Mapping[str, str]) -> Masker:
    """Every secret value the run's tasks are given: the job's and tasks' env tables, and what
    forward_env copies from this machine (names under the secret patterns or secret_env)."""
    envs = [plan.job.env, forwarded, *(t.env for t in plan.tasks)]
    return Masker.of(envs, plan.job.secret_env)
