"""Recovery: what `up` does when something fails, kept apart from the happy path's sequence.

A failed task under on_failure = "restart" (start it again), a failure worth a whole-job restart
under "restart-job" (stop the attempt, replace a gone host when its source can, wait the
backoff), and machines tfdeploy launched that must not outlive a failed `up` (the idle stop).
The deployment hands itself in as `Phases`: recovery re-runs its phases for a new host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from deployer.config.inventory import Inventory
from deployer.config.model import Host
from deployer.config.sources import Holdings, Regained, Say
from deployer.core.errors import JobFailed
from deployer.core.text import join_names, plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.reply_types import StopReport
from deployer.push.sync import Manifest
from deployer.up.preflight import Findings
from deployer.up.restarts import StopFailed, backoff_s, restart_task, stop_attempt
from deployer.watch.deadlines import DeadlineNotes
from deployer.watch.loop import RestartJob, Watch
from deployer.watch.poller import POLL_TIMEOUT_S
from deployer.watch.runstate import RunState
from deployer.watch.view import Display

# How often a lost host is tried again while a restart waits for it: each try is one agent call
# (a new connection once the old one died), bounded by the transport's own connect timeout.
LOST_RETRY_S = 1.0


class Phases(Protocol):
    """What recovery needs of the deployment it serves."""

    members: list[Member]
    contacted_hosts: set[str]

    def preflight(self) -> Findings: ...

    def push(
        self, manifest: Manifest, groups: Sequence[Sequence[str]] = (), *, only: Sequence[Member]
    ) -> None: ...

    def setup(self, manifest: Manifest, *, only: Sequence[Member]) -> None: ...

    def install_environment(self) -> None: ...


class Recovery:
    def __init__(
        self,
        phases: Phases,
        fleet: Fleet,
        run: RunState,
        watching: Watch,
        view: Display,
        *,
        forwarded: Mapping[str, str],
        sleep: Callable[[float], None],
        interval: float,
        holdings: Holdings,
    ) -> None:
        self.phases = phases
        self.fleet = fleet
        self.run = run
        self.watching = watching
        self.view = view
        self.forwarded = forwarded
        self.sleep = sleep
        self.interval = interval
        self.holdings = holdings  # what the sources hold for this up: regain asks them

    # ---- on_failure = "restart": one task again --------------------------------------------

    def restart_task(self, name: str) -> None:
        run = self.run
        runtime = run.runtimes.get(name)
        restart_task(
            self.fleet, run.board, self.view, run.plan, run.run_id, self.forwarded, name, runtime
        )

    # ---- on_failure = "restart-job": every task again ------------------------------------------

    def restart_job(self, decision: RestartJob) -> None:
        """Stops every task of this attempt (and what escaped them), replaces a host that is
        gone when one can, or regains every host when their source gives them back (a requeued
        Slurm allocation, waited for until it runs again), waits the backoff, and leaves the
        board at the next attempt. Ctrl-C or a signal meanwhile ends `up` as usual."""
        run, job = self.run, self.run.plan.job
        attempt = run.board.attempt + 1
        delay = backoff_s(job, attempt)
        self.view.step(
            f"{decision.cause}: restarting the whole job (restart {attempt} of "
            f"{job.max_restarts}, TFDEPLOY_ATTEMPT={attempt}) in {delay:g} s, after stopping "
            "every task"
        )
        if not (decision.gone and self.regain()):
            self.end_attempt(decision)
        run.board.next_attempt()
        self.wait_for_lost_hosts(run.clock() + delay)

    def wait_for_lost_hosts(self, deadline: float) -> None:
        """The backoff, spent trying the hosts the attempt lost that are still the run's (none
        replaced them): a host whose link comes back is watched again, once what is left of
        the last attempt there is stopped. One still silent when the backoff ends takes the
        next restart's backoff too, saying so, until max_restarts are used up: then the job
        fails on it. No attempt starts on a host `up` cannot reach, nor goes unwatched."""
        run, job, contact = self.run, self.run.plan.job, self.watching.poller.contact
        planned = {h.name for h in run.plan.hosts}
        absent = sorted(h for h in contact.lost if h in planned)
        beat = run.clock()
        while True:
            if run.clock() - beat >= job.lease_seconds / 3:
                self.renew_lease(planned - set(absent))
                beat = run.clock()
            absent = [h for h in absent if h not in self.back(absent)]
            if run.clock() >= deadline and absent:
                if run.board.attempt >= job.max_restarts:
                    raise self.still_lost(absent)
                attempt = run.board.next_attempt()
                wait = max(backoff_s(job, attempt), contact.loss_after)
                deadline = run.clock() + wait
                self.view.step(
                    f"{join_names(absent)} still unreachable: restart {attempt} of "
                    f"{job.max_restarts} waits up to {wait:g} s more for "
                    f"{'it' if len(absent) == 1 else 'them'}"
                )
            if run.clock() >= deadline:
                return
            self.sleep(min(max(self.interval, LOST_RETRY_S), max(0.0, deadline - run.clock())))

    def renew_lease(self, hosts: set[str]) -> None:
        """A backoff longer than the lease must not let the run's lease lapse on its hosts:
        this `up` still holds the run (`runs` says `leased`, attach waits for the restart, and
        a prune elsewhere leaves the run's folder alone). A heartbeat alone, nothing read."""
        run_id = self.run.run_id

        def heartbeat(member: Member) -> object:
            return member.agent.poll(run_id, {}, heartbeat=True, timeout=POLL_TIMEOUT_S)

        self.fleet.each_settled(heartbeat, [self.fleet.member(h) for h in sorted(hosts)])

    def back(self, absent: Sequence[str]) -> set[str]:
        """The lost hosts that answer now: each one's tasks of the run (what the lease left of
        the last attempt) stopped, then watched again from a clean slate."""
        if not absent:
            return set()
        run, poller = self.run, self.watching.poller
        members = [self.fleet.member(h) for h in absent]

        def settle(member: Member) -> StopReport:
            names = [t.name for t in run.plan.tasks_on(member.name)]
            return member.agent.stop(
                run.run_id, grace=run.plan.job.stop_grace, tasks=names, escaped=True
            )

        reports, _ = self.fleet.each_settled(settle, members)
        for host in sorted(reports):
            poller.rewatch(host)
            self.view.step(f"contact with {host} is back: its tasks start with the next attempt")
        return set(reports)

    def still_lost(self, absent: Sequence[str]) -> JobFailed:
        names = join_names(list(absent))
        return JobFailed(
            f"{names} did not answer again before the last restart (max_restarts = "
            f"{self.run.plan.job.max_restarts}); the job was not restarted there",
            hint="every task that started was stopped; check the host and its network, then "
            f"`tfdeploy status {self.run.run_id} -i {self.run.plan.inventory.path}`",
        )

    def end_attempt(self, decision: RestartJob) -> None:
        """Stops every task of the attempt and replaces a gone host. A stop that fails because
        the source took every host at once (a preempted allocation, first seen as a failed
        task) regains them instead: nothing of the attempt is left there to stop."""
        run = self.run
        lost = self.watching.poller.contact.lost
        try:
            lines = stop_attempt(self.fleet, run.board, lost, run.run_id, run.plan.job)
        except StopFailed:
            if self.regain():
                return
            raise
        for line in lines:
            self.view.step(line)
        self.watching.tick(tolerate=True)  # the attempt's last words, under its own labels
        self.watching.drain()
        gone = decision.host if decision.gone else self.noticed_host()
        if gone is not None:
            self.replace(gone)

    def noticed_host(self) -> str | None:
        """The host of a task of the attempt its spot notice ended, when the first failure was
        another task's: TF's PreemptionCheckpointHandler saves on every worker, and a peer that
        saved with the noticed task and exited (143) may end first. That machine goes anyway."""
        for watch in self.run.board.watches.values():
            status = watch.status
            if status is not None and status.preempted and not status.time_limited:
                return watch.task.host
        return None

    def replace(self, name: str) -> None:
        """A new machine takes the gone host's place in the host order, so every task keeps
        its role and index; the cluster is checked again, and only the new host gets the code."""
        old = self.fleet.member(name).host
        new = new_machine(self.run.plan.inventory, old, self.view.step)
        if new is None:
            return
        self.fleet.add(new)
        hosts = [new if h.name == name else h for h in self.run.plan.inventory.hosts]
        self.run.replan(hosts, moved=[new.name])
        self.watching.poller.forget(name)
        self.phases.members = [self.fleet.member(h.name) for h in self.run.plan.hosts]
        self.phases.contacted_hosts.discard(name)  # terminated: nothing left there to stop
        findings = self.phases.preflight()
        joined = self.fleet.member(new.name)
        self.phases.push(findings.manifest, (), only=[joined])
        self.phases.install_environment()  # the new host's built; the others' reused
        self.phases.setup(findings.manifest, only=[joined])
        self.arm_idle_stop()
        self.view.step(f"{new.name} replaces {name}: same tasks, same indices")

    def regain(self) -> bool:
        """Every host of a source was taken at once and what the source holds for this `up`
        gives them back (a requeued Slurm allocation that runs again): the same places, each
        host connected afresh, checked and made ready again. False: nothing does, and the
        restart goes on as usual."""
        back = self.holdings.regain(self.view.step)
        if back is None:
            return False
        self.rejoin(back)
        return True

    def rejoin(self, back: Regained) -> None:
        """Nothing of the attempt outlived the hosts' loss (Slurm ended every step): the old
        names are forgotten, and every regained host gets the code, environment and setup (an
        unchanged node's copy is current, so its push sends next to nothing)."""
        for name in back.hosts:
            self.watching.poller.forget(name)
            self.phases.contacted_hosts.discard(name)
        joined = [self.fleet.renew(new) for new in back.hosts.values()]
        hosts = [back.hosts.get(h.name, h) for h in self.run.plan.inventory.hosts]
        moved = [new.name for old, new in back.hosts.items() if new.name != old]
        self.run.replan(hosts, moved=moved)  # on the same node, a task's log goes on
        self.phases.members = [self.fleet.member(h.name) for h in self.run.plan.hosts]
        findings = self.phases.preflight()
        self.phases.push(findings.manifest, (), only=joined)
        self.phases.install_environment()
        self.phases.setup(findings.manifest, only=joined)
        self.watching.deadline_notes = DeadlineNotes(back.deadlines, self.watching.wall())
        names = join_names([h.name for h in back.hosts.values()])
        self.view.step(f"{names} back: same tasks, same indices")

    # ---- machines tfdeploy launched ---------------------------------------------------------

    def arm_idle_stop(self) -> None:
        """Machines tfdeploy launched shut down after idle_minutes without a running task."""
        armed = [m for m in self.phases.members if m.host.idle_minutes > 0]
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

    def arm_idle_stop_anyway(self) -> None:
        """An `up` that failed before its idle stop was armed (preflight found no TensorFlow on
        a new AMI, say) must not leave launched GPU machines running forever: arm it on every
        launched host that answers, and say nothing of those that do not."""
        armed = [m for m in self.phases.members if m.host.idle_minutes > 0 and m.agent.home]
        with contextlib.suppress(KeyboardInterrupt):
            self.fleet.each_settled(
                lambda m: m.agent.arm_idle_stop(m.host.idle_minutes, m.host.idle_command),
                armed,
                urgent=True,
            )


def new_machine(inventory: Inventory, gone: Host, say: Say) -> Host | None:
    """A new machine in place of `gone` (lost, or preempted) from the source that can make one;
    None: no source can, and the job restarts on the hosts it has."""
    for source in inventory.sources:
        new = source.replace(str(inventory.path), gone, say)
        if new is not None:
            return new
    return None
