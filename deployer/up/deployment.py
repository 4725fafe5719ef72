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
from deployer.core.errors import HostsFailed, Interrupted
from deployer.core.secrets import Masker
from deployer.core.text import plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpus import GpuMonitor
from deployer.results.archive import LogArchive
from deployer.results.metricsync import OFFSETS
from deployer.results.state import new_run_id
from deployer.results.tunnel import Tunnel, forward_sidecar
from deployer.up import firewall, resume
from deployer.up.artifacts import ArtifactsPull
from deployer.up.handover import hand_over, keeper_alive, kept, kept_attached
from deployer.up.notifying import RunNotifier
from deployer.up.prepare import Preparation
from deployer.up.records import Journal, archive_warning, run_facts
from deployer.up.recovery import Recovery
from deployer.up.start import StartPhase
from deployer.up.teardown import Teardown
from deployer.watch.board import TaskBoard
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
        self.began = time.time()
        self.resumed: list[dict[str, float]] = []  # `up --resume`: the run's resumes, kept
        self.dashboard: Tunnel | None = None  # the local end of [job.tensorboard]
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
        self.let_go = False  # detached (or handed to a keeper) and returned: the run goes on
        self.watching = Watch(
            self.poller,
            view,
            restart=self._restart_task,
            sleep=sleep,
            interval=options.poll_interval,
            lease=self._lease(),
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
            lease=self._lease(),
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
            on_start=self._started,
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
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (errors.Terminated)
            self.outcome = {"outcome": "stopped", "why": "interrupted"}
            self._tell_end("finished", "stopped", "interrupted")
            raise self._interrupted(int(getattr(exc, "signum", signal.SIGINT))) from None
        except BaseException as exc:
            self.outcome = {"outcome": "failed", "why": self.hide(str(exc)).partition("\n")[0]}
            self._tell_end("failed", "failed", str(self.outcome["why"]))
            self._view.steady = True
            self.teardown()
            self.recovery.arm_idle_stop_anyway()
            self.pull_artifacts.after_failure()
            raise
        finally:
            self._view.steady = True
            self._close()
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C again: leave at once
                self.notifier.close()

    def _tell_end(self, event: str, outcome: str, why: str = "") -> None:
        """[job.notify] of the run's end, when this `up` ends it: not a run it let go
        (detached, or handed to its keeper, which then tells its own end), but a run this
        `up` stops (Ctrl-C, a failure it judged, a kept run's keeper ended by its teardown)."""
        if self.let_go or self.watching.holder_ended_run or "started" not in self.notifier.sent:
            return
        self.notifier.tell(event, outcome=outcome, why=why, attempt=self.board.attempt)

    def _await_keeper(self) -> None:
        """A kept run whose awaited tasks succeeded is ended by its keeper (the evaluators'
        grace, the servers' stop, its end told) before this `up` tears down what is left."""
        if self.watching.keeper_alive is not None:
            job = self.plan.job
            self.watching.await_holder_end(job.evaluator_grace + 2 * job.stop_grace + 10)

    def _phases(self) -> int:
        found = self._resumable()
        # The push's first request stops the network check's stand-ins on each host (and a
        # stop of the run does, should it fail before): one round trip less.
        findings = self.prepare.preflight(keep_stand_ins=True, resume=found is not None)
        if found is not None:
            self._resume(found, findings.facts)
        self.contacted_hosts.update(m.name for m in self.members)  # teardown reaches them
        self.prepare.push(findings.manifest, findings.workdir_groups, findings.empty_stores)
        self.prepare.install_environment()
        self.prepare.setup(findings.manifest)
        self.recovery.arm_idle_stop()
        self.firewall_up()
        self.start_and_watch()
        if self.options.detach and kept(self.plan):
            where = hand_over(self.fleet, self.members, self.plan, self.run_id, self.board.attempt)
            self.view.step(
                f"run {self.run_id} is running detached, kept by its keeper on {where}: its "
                f'failure policy (on_failure = "{self.plan.job.on_failure}") goes on without '
                "this machine"
            )
        elif self.options.detach:
            self.detach()
            self.view.step(f"run {self.run_id} is running detached")
        if self.options.detach:
            self.let_go = True
            for line in next_steps(self.run_id, self.plan.job.artifacts, detached=True):
                self.view.step(line)
            return 0
        self._await_keeper()
        self.teardown()
        self.pull_artifacts()
        note = self.watching.evaluator_note()
        if note:  # the job's outcome is said last but for the next steps
            self.view.step(f"the job succeeded{note}")
        for line in next_steps(self.run_id, self.plan.job.artifacts, detached=False):
            self.view.step(line)
        return 0

    def _resumable(self) -> resume.Resumable | None:
        """`up --resume RUN`: the run found on the hosts and checked before any preflight (a
        refusal starts nothing, changes nothing); None for a new run."""
        if self.options.resume is None:
            return None
        self.view.step(f"looking for run {self.run_id} on the hosts, to resume it")
        found = resume.find(self.fleet, self.plan, self.run_id)
        warning = resume.copy_earlier_logs(self.fleet, found, self.archive)
        if warning:
            self.view.step(f"warning: {warning}; `tfdeploy logs {self.run_id}` reads the hosts")
        return found

    def _resume(self, found: resume.Resumable, facts: Mapping[str, Mapping[str, object]]) -> None:
        """The hosts reopened the run: its tasks start again in their folders with the next
        attempt, its log and local history go on (one run, first begun when it was)."""
        attempt = resume.next_attempt(facts)
        resume.carry_on(self.board, found, attempt)
        self.began = found.began
        self.resumed = resume.resumes(self.run_id, attempt)
        self.archive.reopen()  # `logs` asks the hosts again until this `up` ends it
        self.start.resuming = True
        self.view.step(
            f"resuming run {self.run_id} at attempt {attempt} (TFDEPLOY_ATTEMPT={attempt}): "
            "every task starts again in its own folder of the run"
        )

    def _interrupted(self, signum: int) -> Interrupted:
        """Teardown after Ctrl-C or a signal; the error to raise, naming the signal."""
        by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
        self._view.steady = True  # a terminal closed (SIGHUP) fails each print: words only
        if not self.pull_artifacts.tried:  # else every task had stopped before the pull
            self.fleet.interrupt()  # abandon calls in flight (a push): the stop goes first
            self.poller.abandon()
            self.view.step(
                f"interrupted{by}: stopping every task that was started "
                "(Ctrl-C again to kill at once)"
            )
            self.teardown()
            self.recovery.arm_idle_stop_anyway()
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C skips the pull
                self.pull_artifacts()
        return Interrupted(f"interrupted{by}; run {self.run_id} was stopped", signum=signum)

    def _close(self) -> None:
        """The tunnel, the archive's end and the view's: each runs whatever the one before did."""
        try:
            if self.dashboard is not None:
                self.dashboard.close()
        finally:
            try:
                if self.contacted_hosts:  # the run reached its hosts: `runs` lists it
                    self._keep_facts()
                if self.archive.files and self.contacted_hosts and not self.options.detach:
                    self.archive.end()  # `logs RUN_ID` reads it from here, hosts or not
            finally:
                self.view.close()

    def _keep_facts(self) -> None:
        """The run's facts, journal and outcome beside its archive (results/metricstore.py):
        what `tfdeploy runs` and `tfdeploy report` read once the hosts are gone."""
        facts = run_facts(self.plan, self.run_id, self.began, self.hide)
        if self.resumed:
            facts["resumed"] = self.resumed
        facts["exits"] = {
            w.task.name: w.status.outcome() if w.status and w.status.finished else None
            for w in self.board.watches.values()
        }
        facts["started_at"] = {
            w.task.name: w.status.started for w in self.board.watches.values() if w.status
        }
        facts["ended_at"] = {
            w.task.name: w.status.ended for w in self.board.watches.values() if w.status
        }
        self.archive.keep("facts.json", facts)
        for entry in self.journal.entries:
            self.archive.note(entry[1], entry[2], at=entry[0])
        self.archive.keep("outcome.json", {**self.outcome, "ended": time.time()})
        offsets = {n: w.series.offset for n, w in self.board.watches.items()}
        self.archive.keep(OFFSETS, offsets)  # what `down` need not read again

    def detach(self) -> None:
        """Every task started: the run now outlives this controller on every host (its lease
        is dropped). A host that cannot be told fails the `up`, and teardown stops the run:
        half of a run, left to lapse on one host, is no detached run."""
        _, failures = self.fleet.each_settled(lambda m: m.agent.detach(self.run_id), self.members)
        if failures:  # raised before the teardown that stops them: `up` prints it after
            tasks, hosts = plural(len(self.plan.tasks), "task"), plural(len(self.members), "host")
            started = f"{tasks} of run {self.run_id} had started on {hosts}, and were stopped"
            why = "a run detached on only some hosts is no detached run"
            raise HostsFailed(failures, what="detach failed", outcome=f"{started} ({why})")

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

    def firewall_up(self) -> None:
        """With job.firewall: TF ports accept only the cluster's addresses, before any start."""
        if not self.plan.job.firewall:
            return
        self.teardown.firewalled = [m.name for m in self.members]  # a partial add is cleaned up too
        firewall.add(self.fleet, self.members, self.plan, self.run_id)
        self.view.step(
            f"firewall: TF ports accept only {', '.join(firewall.allowed_addresses(self.plan))}"
        )

    def start_and_watch(self) -> None:
        """Starts the job and streams logs until every awaited task has exited (detached: only
        starts). Under on_failure = "restart-job" a failure worth it starts it all again."""
        cause = ""
        while True:
            try:
                self.start(self.members)
                event = "recovered" if "started" in self.notifier.sent else "started"
                self.notifier.tell(event, outcome="running", why=cause, attempt=self.board.attempt)
                self._forward_tensorboard()
                if not self.options.detach:
                    self._keep_attached()
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

    def _keep_attached(self) -> None:
        """An attached run whose policy restarts, on the inventory's own hosts, is handed to a
        keeper as a detached one is (handover.py): its policy, lease and end go on when this
        machine sleeps, loses its network or `up` is killed; `up` watches and shows it, and
        Ctrl-C, SIGTERM, a closed terminal and `down` still stop it all (a whole-run stop ends
        the keeper first). Until here (preflight, push, start) the lease is `up`'s alone."""
        if not kept_attached(self.plan) or self.watching.keeper_alive is not None:
            return
        where = hand_over(self.fleet, self.members, self.plan, self.run_id, self.board.attempt)
        self.watching.keeper_alive = keeper_alive(self.fleet.member(where), self.run_id)
        self.view.step(
            f"run {self.run_id} is kept by its keeper on {where}: its failure policy (on_failure "
            f'= "{self.plan.job.on_failure}") and lease go on if this machine sleeps or this '
            "`up` dies; Ctrl-C stops it"
        )

    def _forward_tensorboard(self) -> None:
        """[job.tensorboard]: a local port forwarded to it for as long as `up` watches."""
        if self.dashboard is None:
            self.dashboard, said = forward_sidecar(
                self.fleet, self.plan, self.run_id, detached=self.options.detach
            )
            if said:
                self.view.step(said)

    def _started(self) -> None:
        self.pull_artifacts.started = True  # tasks may leave artifacts from here on

    def _archive_failed(self, why: str) -> None:
        self.view.step(archive_warning(self.run_id, why))

    def _lease(self) -> float:
        return self.options.lease_seconds or self.plan.job.lease_seconds


def run_masker(plan: Plan, forwarded: Mapping[str, str]) -> Masker:
    """Every secret value the run's tasks are given: the job's and tasks' env tables, and what
    forward_env copies from this machine (names under the secret patterns or secret_env)."""
    envs = [plan.job.env, forwarded, *(t.env for t in plan.tasks)]
    return Masker.of(envs, plan.job.secret_env)
