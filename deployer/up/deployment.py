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
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from deployer.config.inventory import Host
from deployer.config.plan import Plan, Task, make_plan
from deployer.core.errors import Interrupted
from deployer.core.secrets import mask_text
from deployer.core.text import plural
from deployer.hosts.agent import TaskStatus
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpus import GpuMonitor
from deployer.push import fanout
from deployer.push.summary import push_summary
from deployer.push.sync import Manifest, push_all, run_setup
from deployer.results.archive import LogArchive
from deployer.results.pull import artifacts_home
from deployer.results.state import RunRecord, controller_name, new_run_id, save
from deployer.results.tunnel import Tunnel, forward_sidecar
from deployer.up import firewall
from deployer.up.launch import by_host, start_group, start_groups
from deployer.up.preflight import Claim, Settled, preflight
from deployer.up.restarts import backoff_s, restart_task, stop_attempt, stop_lines
from deployer.watch.board import TaskBoard, server_like
from deployer.watch.loop import RestartJob, Watch
from deployer.watch.poller import POLL_WAIT_S, Poller
from deployer.watch.view import View

# A new machine in place of `host` (lost, or preempted), told through `say`; None: not possible.
HostReplacer = Callable[[Host, Callable[[str], None]], Host | None]


@dataclass(frozen=True)
class UpOptions:
    detach: bool = False
    poll_interval: float = 0.25
    # A controller silent this long makes hosts stop the run; None: the inventory's
    # job.lease_seconds (default 60).
    lease_seconds: float | None = None
    poll_wait: float = POLL_WAIT_S  # how long a tick waits for slow hosts
    netcheck: bool = True  # False: skip preflight's TF connection check (--no-netcheck)


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
        replace_host: HostReplacer | None = None,
    ) -> None:
        self.fleet = fleet
        self.replace_host = replace_host  # under "restart-job": a new machine for a gone one
        self.view = view
        self.options = options
        self.clock = clock
        self.sleep = sleep
        self.run_id = new_run_id(plan.job.name)
        self.members = [fleet.member(h.name) for h in plan.hosts]
        self.contacted_hosts: set[str] = set()  # hosts that may hold the run: teardown's list
        self.firewalled: list[str] = []  # hosts that may hold this run's firewall rules
        self._torn_down = False
        environ = os.environ if environ is None else environ
        # job.forward_env: only the names listed there, never the controller's env implicitly.
        self.forwarded = {n: environ[n] for n in plan.job.forward_env if n in environ}
        self.archive = LogArchive(self.run_id)
        self.dashboard: Tunnel | None = None  # the local end of [job.tensorboard]
        self._follow(plan, frozenset())

    def _follow(self, plan: Plan, gpu_hosts: frozenset[str]) -> None:
        """The plan the run carries out, and the board and poller that watch its tasks."""
        self.plan = plan
        self.board = TaskBoard(plan.tasks)
        self.gpu_monitor = GpuMonitor(set(gpu_hosts), clock=self.clock)
        self.poller = Poller(
            self.fleet,
            plan,
            self.board,
            self.run_id,
            clock=self.clock,
            gpu_monitor=self.gpu_monitor,
            wait_s=self.options.poll_wait,
            archive=self.archive,
        )
        self.watching = Watch(
            plan,
            self.poller,
            self.view,
            restart=self._restart,
            clock=self.clock,
            sleep=self.sleep,
            interval=self.options.poll_interval,
            lease=self._lease(),
        )

    # ---- phases -------------------------------------------------------------------------

    def run(self) -> int:
        try:
            settled = self.preflight()
            self._follow(settled.plan, settled.gpu_hosts)
            self.push(settled.manifest, settled.workdir_groups)
            self.setup(settled.manifest)
            self.arm_idle_stop()
            self.firewall_up()
            self.start_and_watch()
            if self.options.detach:
                self.view.step(
                    f"run {self.run_id} is running detached; stop it with "
                    f"`tfdeploy down {self.run_id}`"
                )
                return 0
            self.teardown()
            self.pull_artifacts()
            return 0
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (errors.Terminated)
            signum = int(getattr(exc, "signum", signal.SIGINT))
            by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
            self.view.step(
                f"interrupted{by}: stopping every task that was started "
                "(Ctrl-C again to kill at once)"
            )
            self.fleet.interrupt()  # abandon calls in flight (a push) so the stop is not queued
            self.poller.abandon()
            self.teardown()
            self._arm_idle_stop_anyway()
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C skips the pull
                self.pull_artifacts()
            raise Interrupted(
                f"interrupted{by}; run {self.run_id} was stopped", signum=signum
            ) from None
        except BaseException:
            self.teardown()
            self._arm_idle_stop_anyway()
            self.pull_artifacts()  # a failed job's checkpoints are what debugging needs
            raise
        finally:
            if self.dashboard is not None:
                self.dashboard.close()
            if self.archive.files and not self.options.detach:
                self.archive.end()  # `logs RUN_ID` reads it from here, hosts or not
            self.view.close()

    def check(self) -> int:
        """`tfdeploy check`: preflight alone. Its port reservations are given back at once."""
        try:
            self.preflight()
            self.fleet.each_settled(lambda m: m.agent.release(self.run_id), self.members)
            tasks, hosts = plural(len(self.plan.tasks), "task"), plural(len(self.members), "host")
            self.view.step(f"check ok: nothing was started (up would start {tasks} on {hosts})")
        finally:
            self.view.close()
        return 0

    def preflight(self) -> Settled:
        names = ", ".join(m.name for m in self.members)
        self.view.step(f"preflight of {plural(len(self.members), 'host')}: {names}")
        claim = Claim(self.run_id, self._lease())
        settled = preflight(
            self.plan,
            self.fleet,
            claim,
            forwarded=list(self.forwarded),
            network=self.options.netcheck,
        )
        for warning in settled.warnings:
            self.view.step(f"warning: {warning}")
        self.view.step(f"preflight ok: {settled.summary}")
        return settled

    def push(
        self,
        manifest: Manifest,
        groups: Sequence[Sequence[str]] = (),
        *,
        only: Sequence[Member] | None = None,
    ) -> None:
        """Code to every host (or `only` to these); hosts sharing a workdir get each content
        once, via the first."""
        members = self.members if only is None else list(only)
        save(RunRecord.of(self.plan, self.run_id, detached=self.options.detach))
        # From here on a host may hold the run (and soon its setup processes): teardown asks them.
        self.contacted_hosts.update(m.name for m in members)
        fields = {
            "run_id": self.run_id,
            "job": self.plan.job.name,
            "detached": self.options.detach,
            "lease_seconds": None if self.options.detach else self._lease(),
            "controller": controller_name(),
        }
        shared = [g for g in groups if len(g) > 1]
        later = {h for g in shared for h in g[1:]}  # they find what their group's first stored
        spread = None
        if self.plan.job.fanout:
            firsts = [m for m in members if m.name not in later]
            spread = fanout.spread(self.fleet, firsts, self.plan, manifest, self.run_id, fields)
        results = push_all(self.fleet, members, manifest, fields, shared)
        for line in push_summary(results, manifest, self.run_id, shared, spread):
            self.view.step(line)

    def setup(self, manifest: Manifest, *, only: Sequence[Member] | None = None) -> None:
        job = self.plan.job
        if not job.setup:
            return
        members = self.members if only is None else list(only)
        commands = plural(len(job.setup), "command")
        self.view.step(f"setup ({commands}) on {plural(len(members), 'host')}")
        ran = self.fleet.each(
            lambda m: run_setup(m, self.run_id, job, manifest), members, what="setup failed"
        )
        skipped = [n for n, r in ran.items() if not r]
        if skipped:
            self.view.step(f"setup unchanged, skipped on {', '.join(skipped)}")

    def arm_idle_stop(self) -> None:
        """Machines tfdeploy launched shut down after idle_minutes without a running task."""
        armed = [m for m in self.members if m.host.idle_minutes > 0]
        if not armed:
            return
        self.fleet.each(
            lambda m: m.agent.arm_idle_stop(m.host.idle_minutes, m.host.idle_command),
            armed,
            what="arming idle stop failed",
        )
        minutes = sorted({m.host.idle_minutes for m in armed})
        after = " or ".join(f"{n:g}" for n in minutes)
        self.view.step(
            f"idle stop: {plural(len(armed), 'launched host')} shut down after {after} min "
            "without a running task"
        )

    def _arm_idle_stop_anyway(self) -> None:
        """An `up` that failed before its idle stop was armed (preflight found no TensorFlow on
        a new AMI, say) must not leave launched GPU machines running forever: arm it on every
        launched host that answers, and say nothing of those that do not."""
        armed = [m for m in self.members if m.host.idle_minutes > 0 and m.agent.home]
        with contextlib.suppress(KeyboardInterrupt):
            self.fleet.each_settled(
                lambda m: m.agent.arm_idle_stop(m.host.idle_minutes, m.host.idle_command),
                armed,
                urgent=True,
            )

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
        for group in start_groups(self.plan):
            self._start_group(group)
            servers = [t for t in group if server_like(t) and t.port is not None]
            if servers:
                self.watching.wait_listening(servers, deadline)
        # Started tasks hold their ports now. A reservation left to its lease could outlive
        # the run: a heartbeat stuck in a cut link arrives when the link heals and renews it.
        self.fleet.each_settled(lambda m: m.agent.release(self.run_id), self.members)
        count = len(self.plan.tasks)
        self.view.step("the task started" if count == 1 else f"all {count} tasks started")

    def _start_group(self, tasks: list[Task]) -> None:
        for host in by_host(tasks):
            self.poller.watch_host(host)
        self.view.step(f"starting {', '.join(t.name for t in tasks)}")

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
                self._restart_job(decision)

    def _restart_job(self, decision: RestartJob) -> None:
        """Stops every task of this attempt (and what escaped them), replaces a host that is
        gone when one can, waits the backoff, and leaves the board at the next attempt. Ctrl-C
        or a signal meanwhile ends `up` as usual."""
        cause, job = decision.cause, self.plan.job
        attempt = self.board.attempt + 1
        delay = backoff_s(job, attempt)
        self.view.step(
            f"{cause}: restarting the whole job (restart {attempt} of {job.max_restarts}, "
            f"TFDEPLOY_ATTEMPT={attempt}) in {delay:g} s, after stopping every task"
        )
        lines = stop_attempt(self.fleet, self.board, self.poller.contact.lost, self.run_id, job)
        for line in lines:
            self.view.step(line)
        self.watching.tick(tolerate=True)  # the attempt's last words, under its own labels
        self.watching.drain()
        if decision.gone and self.replace_host is not None:
            self._replace(decision.host)
        self.board.next_attempt()
        deadline = self.clock() + delay
        while self.clock() < deadline:
            self.sleep(min(self.options.poll_interval, deadline - self.clock()))

    def _replace(self, name: str) -> None:
        """A new machine takes the gone host's place in the host order, so every task keeps
        its role and index; the cluster is checked again, and only the new host gets the code."""
        old = self.fleet.member(name).host
        new = self.replace_host(old, self.view.step) if self.replace_host else None
        if new is None:
            return
        self.fleet.add(new)
        hosts = tuple(new if h.name == name else h for h in self.plan.inventory.hosts)
        previous = self.board
        self.plan = make_plan(dataclasses.replace(self.plan.inventory, hosts=hosts))
        self.members = [self.fleet.member(h.name) for h in self.plan.hosts]
        self.contacted_hosts.discard(name)  # terminated: nothing left there to stop
        settled = self.preflight()
        self._follow(settled.plan, settled.gpu_hosts)
        self.board.carry_over(previous, moved={t.name for t in self.plan.tasks_on(new.name)})
        joined = self.fleet.member(new.name)
        self.push(settled.manifest, (), only=[joined])
        self.setup(settled.manifest, only=[joined])
        self.arm_idle_stop()
        self.view.step(f"{new.name} replaces {name}: same tasks, same indices")

    def _forward_tensorboard(self) -> None:
        """[job.tensorboard]: a local port forwarded to it for as long as `up` watches."""
        if self.dashboard is None:
            self.dashboard, said = forward_sidecar(
                self.fleet, self.plan, self.run_id, detached=self.options.detach
            )
            if said:
                self.view.step(said)

    def pull_artifacts(self) -> None:
        """job.artifacts home, once the tasks are stopped (never raises: see artifacts_home)."""
        for line in artifacts_home(self.fleet, self.plan.job, self.run_id, self.contacted_hosts):
            self.view.step(line)

    def _hide(self, text: str) -> str:
        """Log text with the job's secret values masked."""
        return mask_text(text, self.plan.job.env, self.plan.job.secret_env)

    def teardown(self) -> None:
        """Stops the run on every host that may hold it; reports what it could not.

        The stop also ends a setup command still running (Ctrl-C during setup). A host already
        declared lost is not waited for: its supervisors stop its tasks when the lease lapses.
        """
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
        for line in stop_everywhere(self.fleet, members, self.run_id, job.stop_grace, self._hide):
            self.view.step(line)
        with contextlib.suppress(KeyboardInterrupt):  # only the final states are left to read
            self.watching.tick(heartbeat=False, tolerate=True)
        self.firewall_down()

    def _lease(self) -> float:
        return self.options.lease_seconds or self.plan.job.lease_seconds

    # ---- acting on what the rules decided ------------------------------------------------

    def _restart(self, name: str) -> None:
        restart_task(
            self.fleet, self.board, self.view, self.plan, self.run_id, self.forwarded, name
        )


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
