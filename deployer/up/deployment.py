"""One `up`: preflight every host, push, set up, start in TF's order, watch, and always tear down.

Whatever ends the job (success, a failed task, a missed deadline, Ctrl-C, a signal, an error of
tfdeploy's own), every task that was started is stopped before `up` returns, unless the user asked
to detach. This module only sequences the phases; the rules it applies live in watch.py (tasks),
contact.py (hosts) and preflight.py, and each tick of I/O is poller.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from deployer.config.model import NetcheckMode
from deployer.config.plan import Plan, Task
from deployer.core.errors import Interrupted
from deployer.core.fold import fold_names
from deployer.core.secrets import Masker
from deployer.core.statedir import state_dir
from deployer.core.text import plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpus import GpuMonitor
from deployer.hosts.reply_types import TaskStatus
from deployer.push.deliver import deliver
from deployer.push.sync import Manifest, run_setup
from deployer.results.archive import LogArchive
from deployer.results.pull import KEPT, artifacts_home, resume_command
from deployer.results.state import RunRecord, controller_name, new_run_id, save
from deployer.results.tunnel import Tunnel, forward_sidecar
from deployer.up import firewall
from deployer.up.environment import Environments, uses_requirements, with_extras
from deployer.up.launch import by_host, start_group, start_groups
from deployer.up.preflight import Claim, Settled, preflight
from deployer.up.recovery import Recovery
from deployer.up.restarts import stop_lines
from deployer.watch.board import TaskBoard
from deployer.watch.loop import RestartJob, Watch
from deployer.watch.poller import POLL_WAIT_S, Poller
from deployer.watch.run import Run
from deployer.watch.view import SteadyView, View, masked_view


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


class Deployment:
    """Carries one run from plan to teardown; `run` returns the exit status."""

    def __init__(
        self,
        plan: Plan,
        fleet: Fleet,
        view: View,
        options: UpOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.fleet = fleet
        self.options = options
        self.run_state = Run(new_run_id(plan.job.name), plan, clock)
        self.run_id = self.run_state.run_id
        self.members = [fleet.member(h.name) for h in plan.hosts]
        self.contacted_hosts: set[str] = set()  # hosts that may hold the run: teardown's list
        self.firewalled: list[str] = []  # hosts that may hold this run's firewall rules
        self._torn_down = False
        self.started = False  # a start was sent: from here on tasks may have left artifacts
        self._artifacts_pulled = False  # tried: one pull per `up`, even when it was cut short
        environ = os.environ if environ is None else environ
        # job.forward_env: only the names listed there, never the controller's env implicitly.
        self.forwarded = {n: environ[n] for n in plan.job.forward_env if n in environ}
        self.hide = run_masker(plan, self.forwarded)
        self._view = SteadyView(masked_view(view, self.hide))  # steady once teardown begins
        view = self.view = self._view
        self.archive = LogArchive(self.run_id, on_failure=self._archive_failed)
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
        self.environment = Environments(plan)  # resolved after preflight (environment.py)
        self.watching = Watch(
            self.poller,
            view,
            restart=lambda name: self.recovery.restart_task(name),
            sleep=sleep,
            interval=options.poll_interval,
            lease=self._lease(),
            hide=self.hide,
        )
        self.recovery = Recovery(
            self,
            fleet,
            self.run_state,
            self.watching,
            view,
            forwarded=self.forwarded,
            sleep=sleep,
            interval=options.poll_interval,
        )

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
            # The push's first request stops the network check's stand-ins on each host (and a
            # stop of the run does, should it fail before): one round trip less.
            settled = self.preflight(keep_stand_ins=True)
            self.contacted_hosts.update(m.name for m in self.members)  # teardown reaches them
            self.push(settled.manifest, settled.workdir_groups, settled.empty_stores)
            self.install_environment()
            self.setup(settled.manifest)
            self.recovery.arm_idle_stop()
            self.firewall_up()
            self.start_and_watch()
            if self.options.detach:
                self.detach()
                self.view.step(
                    f"run {self.run_id} is running detached; stop it with "
                    f"`tfdeploy down {self.run_id}`"
                )
                return 0
            self.teardown()
            self.pull_artifacts()
            note = self.watching.evaluator_note()
            if note:  # the last line says it, whatever teardown and the pull printed after
                self.view.step(f"the job succeeded{note}")
            return 0
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (errors.Terminated)
            signum = int(getattr(exc, "signum", signal.SIGINT))
            by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
            self._view.steady = True  # a terminal closed (SIGHUP) fails each print: words only
            if not self._artifacts_pulled:  # else every task had stopped before the pull
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
            raise Interrupted(
                f"interrupted{by}; run {self.run_id} was stopped", signum=signum
            ) from None
        except BaseException:
            self._view.steady = True
            self.teardown()
            self.recovery.arm_idle_stop_anyway()
            self._pull_after_failure()
            raise
        finally:
            self._view.steady = True
            self._close()

    def _close(self) -> None:
        """The tunnel, the archive's end and the view's: each runs whatever the one before did."""
        try:
            if self.dashboard is not None:
                self.dashboard.close()
        finally:
            try:
                if self.archive.files and not self.options.detach:
                    self.archive.end()  # `logs RUN_ID` reads it from here, hosts or not
            finally:
                self.view.close()

    def detach(self) -> None:
        """Every task started: the run now outlives this controller on every host (its lease
        is dropped). A host that cannot be told fails the `up`, and teardown stops the run:
        half of a run, left to lapse on one host, is no detached run."""
        self.fleet.each(lambda m: m.agent.detach(self.run_id), self.members, what="detach failed")

    def check(self) -> int:
        """`tfdeploy check`: preflight alone. Its port reservations are given back at once."""
        try:
            self.preflight(keep_stand_ins=True)  # the release stops them: one round trip less
            self.fleet.each_settled(lambda m: m.agent.release(self.run_id), self.members)
            tasks, hosts = plural(len(self.plan.tasks), "task"), plural(len(self.members), "host")
            self.view.step(f"check ok: nothing was started (up would start {tasks} on {hosts})")
        finally:
            self.view.close()
        return 0

    def preflight(self, *, keep_stand_ins: bool = False) -> Settled:
        names = fold_names([m.name for m in self.members], join=", ".join)
        self.view.step(f"preflight of {plural(len(self.members), 'host')}: {names}")
        claim = Claim(self.run_id, self._lease())
        settled = preflight(
            self.plan,
            self.fleet,
            claim,
            forwarded=list(self.forwarded),
            network=self.options.netcheck,
            keep_stand_ins=keep_stand_ins,
        )
        self.run_state.adopt(settled.plan)  # GPU counts learnt from the hosts (gpus = "auto")
        self.gpu_monitor.hosts = set(settled.gpu_hosts)
        for warning in settled.warnings:
            self.view.step(f"warning: {warning}")
        self.view.step(f"preflight ok: {settled.summary}")
        return self._resolve_environment(settled)

    def _resolve_environment(self, settled: Settled) -> Settled:
        """The job's environment resolved for the hosts' platforms, its wheels added to the
        push (environment.py); nothing is sent when it fails, and the hosts drop the run."""
        self.environment = Environments(self.plan, refresh=self.options.refresh_env)
        if not uses_requirements(self.plan):
            return settled
        self.view.phase("resolving the job's environment")
        try:
            lines = self.environment.resolve(settled.facts)
        except BaseException:
            self.fleet.each_settled(lambda m: m.agent.release(self.run_id), self.members)
            raise
        for line in lines:
            self.view.step(line)
        manifest = with_extras(settled.manifest, self.environment.extras())
        return dataclasses.replace(settled, manifest=manifest)

    def install_environment(self) -> None:
        """The `env` op on every host with requirements (a built env is reused at once): each
        task's interpreter from then on."""
        if self.environment.any:
            hosts = [m for m in self.members if m.name in self.environment.envs]
            self.view.phase(f"installing the job's environment on {plural(len(hosts), 'host')}")
            done, warnings = self.environment.install(self.fleet, hosts, self.run_id)
            for line in [*(f"warning: {w}" for w in warnings), *self.environment.lines(done)]:
                self.view.step(line)
        self.run_state.interpreters = {t.name: self.environment.where(t) for t in self.plan.tasks}

    def push(
        self,
        manifest: Manifest,
        groups: Sequence[Sequence[str]] = (),
        empty_stores: Collection[str] = (),
        *,
        only: Sequence[Member] | None = None,
    ) -> None:
        """Code to every host (or `only` to these); hosts sharing a workdir get each content
        once, via the first; hosts with `empty_stores` are not asked what they lack."""
        members = self.members if only is None else list(only)
        self._keep_record()
        # From here on a host may hold the run (and soon its setup processes): teardown asks them.
        self.contacted_hosts.update(m.name for m in members)
        fields = {
            "run_id": self.run_id,
            "job": self.plan.job.name,
            # Detached too: the lease holds until every task started and `up` returns
            # (detach()), so an `up --detach` killed half-way leaves nothing running.
            "detached": False,
            "lease_seconds": self._lease(),
            "controller": controller_name(),
            # The run's own list of its hosts: `down`/`status` from a shell whose inventory
            # dropped one can name it (results/runs.py).
            "hosts": [[h.name, h.address] for h in self.plan.hosts],
            "hosts_at": time.time(),
            **manifest.fields(),  # the job's wheels: stored with the code, placed nowhere
        }
        self.view.phase(f"pushing the code to {plural(len(members), 'host')}")
        pushing = deliver(self.fleet, members, self.plan, manifest, fields, groups, empty_stores)
        for line in pushing:
            self.view.step(line)

    def setup(self, manifest: Manifest, *, only: Sequence[Member] | None = None) -> None:
        job = self.plan.job
        if not job.setup:
            return
        members = self.members if only is None else list(only)
        commands = plural(len(job.setup), "command")
        self.view.step(f"setup ({commands}) on {plural(len(members), 'host')}")
        ran = self.fleet.each(
            lambda m: run_setup(
                m, self.run_id, job, manifest, self.environment.setup_where(m.host)
            ),
            members,
            what="setup failed",
        )
        skipped = [n for n, r in ran.items() if not r]
        if skipped:
            self.view.step(f"setup unchanged, skipped on {', '.join(skipped)}")

    def firewall_up(self) -> None:
        """With job.firewall: TF ports accept only the cluster's addresses, before any start."""
        if not self.plan.job.firewall:
            return
        self.firewalled = [m.name for m in self.members]  # a partial add is cleaned up too
        firewall.add(self.fleet, self.members, self.plan, self.run_id)
        self.view.step(
            f"firewall: TF ports accept only {', '.join(firewall.allowed_addresses(self.plan))}"
        )

    def firewall_down(self) -> None:
        members = [self.fleet.member(h) for h in self.firewalled]
        self.firewalled = []
        for failure in firewall.remove(self.fleet, members, self.run_id):
            self.view.step(f"could not remove the firewall rules on {failure.message}")

    def start(self) -> None:
        deadline = self.clock() + self.plan.job.start_timeout
        groups = start_groups(self.plan)
        released = _released_with_start(groups)
        for group in groups:
            self._start_group(group, released)
            servers = [t for t in group if t.serves and t.port is not None]
            if servers:
                self.watching.wait_listening(servers, deadline)
        # Started tasks hold their ports now. A reservation left to its lease could outlive
        # the run: a heartbeat stuck in a cut link arrives when the link heals and renews it.
        # Most hosts dropped theirs with their last start; the others (a ps waited on) now.
        rest = [m for m in self.members if m.name not in released]
        self.fleet.each_settled(lambda m: m.agent.release(self.run_id), rest)
        count = len(self.plan.tasks)
        self.view.step("the task started" if count == 1 else f"all {count} tasks started")

    def _start_group(self, tasks: list[Task], released: Collection[str] = ()) -> None:
        self.started = True
        for host in by_host(tasks):
            self.poller.watch_host(host)
        self.view.step(f"starting {fold_names([t.name for t in tasks], join=', '.join)}")

        def started(host: str, statuses: list[TaskStatus]) -> None:
            self.poller.contact.reached(host, self.clock())
            self.board.update(statuses)

        start_group(
            self.fleet,
            tasks,
            self.run_id,
            self.forwarded,
            grace=self.plan.job.stop_grace,
            on_started=started,
            attempt=self.board.attempt,
            release=released,
            where=self.run_state.interpreters,
        )

    def start_and_watch(self) -> None:
        """Starts the job and streams logs until every awaited task has exited (detached: only
        starts). Under on_failure = "restart-job" a failure worth it starts it all again."""
        while True:
            try:
                self.start()
                self._forward_tensorboard()
                if not self.options.detach:
                    self.watching.until_done()
                return
            except RestartJob as decision:
                self.recovery.restart_job(decision)

    def _forward_tensorboard(self) -> None:
        """[job.tensorboard]: a local port forwarded to it for as long as `up` watches."""
        if self.dashboard is None:
            self.dashboard, said = forward_sidecar(
                self.fleet, self.plan, self.run_id, detached=self.options.detach
            )
            if said:
                self.view.step(said)

    def pull_artifacts(self) -> None:
        """job.artifacts home, once the tasks are stopped (a failure is a line: see
        artifacts_home). Nothing to say when no task was started (Ctrl-C during the push or
        setup). Once per `up`: Ctrl-C or a signal during the pull stops it, keeping what
        arrived, says how to fetch the rest and is raised; it never starts it again."""
        if not self.started or self._artifacts_pulled:
            return
        self._artifacts_pulled = True
        job = self.plan.job
        try:
            lines = artifacts_home(self.fleet, job, self.run_id, self.contacted_hosts)
        except KeyboardInterrupt:
            again = resume_command(self.run_id, job.artifacts, job.artifacts_to)
            self.view.step(f"artifacts pull interrupted: {KEPT}: {again}")
            raise
        for line in lines:
            self.view.step(line)

    def _pull_after_failure(self) -> None:
        """A failed job's checkpoints are what debugging needs; Ctrl-C (or a signal) during
        their pull skips it, and the failure being raised still says which task failed."""
        try:
            self.pull_artifacts()
        except KeyboardInterrupt:
            patterns = " ".join(shlex.quote(p) for p in self.plan.job.artifacts)
            to = shlex.quote(self.plan.job.artifacts_to)
            self.view.step(
                f"artifacts: the pull was interrupted; `tfdeploy pull {self.run_id} {patterns} "
                f"--to {to}` fetches them later"
            )

    def teardown(self) -> None:
        """Stops the run on every host that may hold it; reports what it could not.

        The stop also ends a setup command still running (Ctrl-C during setup). A host already
        declared lost is not waited for: its supervisors stop its tasks when the lease lapses.
        """
        self._view.steady = True  # from here on, what cannot be printed is lost, not the stop
        lost = self.poller.contact.lost
        hosts = sorted((self.contacted_hosts | self.poller.hosts) - set(lost))
        members = [self.fleet.member(h) for h in hosts]
        if not members or self._torn_down:
            self.firewall_down()
            return
        self._torn_down = True
        for host in sorted(lost):
            self.view.step(
                f"host {host} was lost: its tasks stop by themselves once the controller's "
                f"lease lapses ({self._lease():g} s without a heartbeat)"
            )
        job = self.plan.job
        try:  # each step runs whatever the one before did: the firewall always goes
            self.view.phase(
                f"teardown: stopping run {self.run_id} on {plural(len(members), 'host')}"
            )
            for line in stop_everywhere(
                self.fleet, members, self.run_id, job.stop_grace, self.hide
            ):
                self.view.step(line)
            with contextlib.suppress(KeyboardInterrupt):  # only the final states are left to read
                self.watching.tick(heartbeat=False, tolerate=True)
        finally:
            self.firewall_down()

    def _keep_record(self) -> None:
        """The run's record, for `status`/`logs`/`down RUN_ID` in any shell: a convenience, so
        a disk that cannot take it is a warning (the inventory finds the run as well)."""
        try:
            save(RunRecord.of(self.plan, self.run_id, detached=self.options.detach))
        except OSError as exc:
            self.view.step(
                f"warning: cannot keep the run's record ({exc.filename or state_dir()}: "
                f"{exc.strerror or exc}); the job goes on; `status`, `logs` and `down` of it "
                f"need the inventory: `tfdeploy down {self.run_id} -i INVENTORY`"
            )

    def _archive_failed(self, why: str) -> None:
        self.view.step(
            f"warning: cannot keep the local log archive ({why}); the job goes on, its log "
            f"stays on the hosts: `tfdeploy logs {self.run_id}` reads it there"
        )

    def _lease(self) -> float:
        return self.options.lease_seconds or self.plan.job.lease_seconds


def run_masker(plan: Plan, forwarded: Mapping[str, str]) -> Masker:
    """Every secret value the run's tasks are given: the job's and tasks' env tables, and what
    forward_env copies from this machine (names under the secret patterns or secret_env)."""
    envs = [plan.job.env, forwarded, *(t.env for t in plan.tasks)]
    return Masker.of(envs, plan.job.secret_env)


def stop_everywhere(
    fleet: Fleet, members: list[Member], run_id: str, grace: float, hide: Callable[[str], str]
) -> Iterator[str]:
    """Stops the run on `members`; yields what to report (escaped processes, failed stops).

    A second Ctrl-C (or signal) during the graceful stop kills at once, on fresh threads: the
    graceful stops still hold the fleet's usual slots.
    """
    try:
        reports, failures = fleet.each_settled(lambda m: m.agent.stop(run_id, grace=grace), members)
    except KeyboardInterrupt:
        yield "second Ctrl-C: killing every task now (SIGKILL)"
        reports, failures = fleet.each_settled(
            lambda m: m.agent.stop(run_id, grace=0), members, urgent=True
        )
    yield from stop_lines(reports, failures, hide)


def _released_with_start(groups: Sequence[Sequence[Task]]) -> set[str]:
    """The hosts that may drop their port reservations with their last start request: those
    whose last group serves no port that a later step waits on (wait_listening)."""
    last_serving: dict[str, bool] = {}  # host -> its last group serves a port on it
    for group in groups:
        serving = {t.host for t in group if t.serves and t.port is not None}
        for task in group:
            last_serving[task.host] = task.host in serving
    return {host for host, serves in last_serving.items() if not serves}
