"""The end of every `up` that started anything: the run stopped on every host that may hold it,
its firewall rules removed, whatever the stop managed.

Teardown runs once per `up`, from any failure, Ctrl-C or signal, and must not be stopped by what
it prints: from its first step the view is steady (a closed terminal loses words, not the stop).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from deployer.core.text import plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpureport import GpuReport
from deployer.hosts.reply_types import StopReport
from deployer.up import firewall
from deployer.up.gpucheck import gpus_left, task_pids
from deployer.up.restarts import stop_lines
from deployer.watch.loop import Watch
from deployer.watch.poller import Poller
from deployer.watch.progress import StopCountdown
from deployer.watch.runstate import RunState
from deployer.watch.view import SteadyView
from remote import protocol


class Teardown:
    """Stops the run where it may be: `contacted` (hosts that were sent anything of the run,
    shared with the deployment, which adds to it) and the hosts the poller watches, less those
    declared lost. `firewalled` is set by the phase that makes the rules."""

    def __init__(
        self,
        fleet: Fleet,
        run: RunState,
        poller: Poller,
        watching: Watch,
        view: SteadyView,
        hide: Callable[[str], str],
        contacted: set[str],
    ) -> None:
        self.fleet, self.run, self.poller, self.watching = fleet, run, poller, watching
        self.view, self.hide, self.contacted = view, hide, contacted
        self.firewalled: list[str] = []  # hosts that may hold this run's firewall rules
        self.gpus_before: Mapping[str, GpuReport] = {}  # what preflight saw of each GPU host
        self._done = False

    def __call__(self) -> None:
        """Stops the run on every host that may hold it; reports what it could not.

        The stop also ends a setup command still running (Ctrl-C during setup). A host already
        declared lost is not waited for: its supervisors stop its tasks when the lease lapses.
        """
        self.view.steady = True  # from here on, what cannot be printed is lost, not the stop
        lost = self.poller.contact.lost
        hosts = sorted((self.contacted | self.poller.hosts) - set(lost))
        members = [self.fleet.member(h) for h in hosts]
        if not members or self._done:
            self.firewall_down()
            return
        self._done = True
        for host in sorted(lost):
            self.view.step(
                f"host {host} was lost: its tasks stop by themselves once the controller's "
                f"lease lapses ({self.watching.lease:g} s without a heartbeat)"
            )
        try:  # each step runs whatever the one before did: the firewall always goes
            self._stop(members)
        finally:
            self.firewall_down()

    def _stop(self, members: list[Member]) -> None:
        run_id = self.run.run_id
        self.view.phase(f"teardown: stopping run {run_id} on {plural(len(members), 'host')}")
        grace = self.run.plan.job.stop_grace
        running = {
            w.task.name: w.task.host
            for w in self.run.board.watches.values()
            if w.status is not None and w.status.state == protocol.STATE_RUNNING
        }
        with StopCountdown(self.view, running, grace) as countdown:
            lines = list(
                stop_everywhere(self.fleet, members, run_id, grace, self.hide, countdown.done)
            )
        for line in lines:
            self.view.step(line)
        pids = task_pids(self.run.board)  # the GPUs' teardown proof (up/gpucheck.py)
        for line in gpus_left(self.fleet, members, run_id, self.gpus_before, pids):
            self.view.step(line)
        with contextlib.suppress(KeyboardInterrupt):  # only the final states are left to read
            self.watching.tick(heartbeat=False, tolerate=True)

    def firewall_down(self) -> None:
        members = [self.fleet.member(h) for h in self.firewalled]
        self.firewalled = []
        for failure in firewall.remove(self.fleet, members, self.run.run_id):
            self.view.step(f"could not remove the firewall rules on {failure.message}")


def stop_everywhere(
    fleet: Fleet,
    members: list[Member],
    run_id: str,
    grace: float,
    hide: Callable[[str], str],
    on_host: Callable[[str], None] = lambda host: None,
) -> Iterator[str]:
    """Stops the run on `members`; yields what to report (escaped processes, failed stops).

    A second Ctrl-C (or signal) during the graceful stop kills at once, on fresh threads: the
    graceful stops still hold the fleet's usual slots.
    """
    try:

        def stop(member: Member) -> StopReport:
            report = member.agent.stop(run_id, grace=grace)
            on_host(member.name)
            return report

        reports, failures = fleet.each_settled(stop, members)
    except KeyboardInterrupt:
        yield "second Ctrl-C: killing every task now (SIGKILL)"
        reports, failures = fleet.each_settled(
            lambda m: m.agent.stop(run_id, grace=0), members, urgent=True
        )
    yield from stop_lines(reports, failures, hide)
