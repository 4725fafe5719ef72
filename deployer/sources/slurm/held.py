"""The allocation one `up` holds, from `provision` to that `up`'s end (config.sources.Held).

`provision` makes one per `up` and hands it over; that `up` keeps it and ends it, and nothing
else does: no table of allocations by job name, no release at exit (two inventories of one job
in one process hold two allocations, or refuse, as two processes do). It owns the connection it
opened to the login node (its Cluster's), which the lease keeper and every node's job steps
share (`connect`), and closes it when it ends.

Its end is one of three: released (`scancel`, `up`'s end or a failed provisioning), kept for
the next `up` (`keep_allocation`: its keeper tells the body "keep"), or handed to a detached run
(the keeper tells the body "detached": the body ends the allocation once no task is left).
"""

from __future__ import annotations

import contextlib
import time

from deployer.config.model import Host
from deployer.config.sources import Deadline, Discovered, Regained, Say
from deployer.core.errors import TfdeployError
from deployer.hosts.step_transport import StepTransport
from deployer.hosts.transport import Transport
from deployer.sources.slurm import allocation, nodes
from deployer.sources.slurm.allocation import Keeper, Running
from deployer.sources.slurm.cluster import Cluster
from deployer.sources.slurm.outputs import QueuedJob, say_duration
from deployer.sources.slurm.settings import SlurmSettings

KEPT = "kept the allocation for the next up (keep_allocation; `tfdeploy down` releases it)"
DETACHED = "the allocation stays while the run's tasks run (`tfdeploy down` ends it)"


class HeldAllocation:
    """One `up`'s allocation: its cluster (the login connection), its id once submitted or
    found, where it last ran, and its lease keeper. Not shared between threads: `up`'s main
    thread provisions, regains and ends it."""

    def __init__(self, cluster: Cluster, settings: SlurmSettings) -> None:
        self.cluster = cluster
        self.settings = settings
        self.job_id: str | None = None  # once submitted, or the kept one found
        self.running: Running | None = None  # once it runs
        self._keeper: Keeper | None = None
        self._ended = False

    # ---- provisioning --------------------------------------------------------------------

    def take(self, job: QueuedJob) -> Discovered:
        """The running allocation's nodes as hosts; its lease keeper started on the first."""
        found = nodes.allocated(self.cluster, self.settings, job)
        names = tuple(h.name for h in found.hosts)
        self.job_id = job.id
        self.running = Running(job.id, names, time.time() - (job.elapsed or 0))
        self._keeper = allocation.start_keeper(self.cluster, job.id, names[0])
        return found

    def keep(self) -> None:
        """A kept allocation taken again: its body goes on holding it past this `up`'s lease."""
        assert self._keeper is not None, "take() starts the keeper"
        self._keeper.tell("keep")

    def release(self) -> str | None:
        """Cancelled now (a provisioning that failed: the bound, Ctrl-C, a lost allocation), and
        every connection closed; the id cancelled, None when none was submitted yet."""
        self._ended = True
        try:
            self._close_keeper()
            if self.job_id is not None:
                self.cluster.cancel(self.job_id)
            return self.job_id
        finally:
            self.cluster.close()

    # ---- config.sources.Held ---------------------------------------------------------------

    def connect(self, host: Host) -> Transport | None:
        """A node of this allocation reached as job steps launched over the allocation's own
        login connection, the one its Slurm commands and lease keeper use: one connection to
        the login node for the whole run (more only past its sshd's MaxSessions) instead of
        one per node. None for any other host, or a node whose group reaches the login node
        with other [ssh] settings (it keeps a connection of its own, as before)."""
        running = self.running
        if host.via is None or running is None or host.name not in running.nodes:
            return None
        if host.ssh != self.cluster.login.ssh:
            return None
        return StepTransport(host.name, self.cluster.steps_on(host.name), host.via.launcher)

    def regain(self, say: Say) -> Regained | None:
        """With on_failure = "restart-job" (the allocation asked with --requeue): once Slurm
        requeued it (a preemption, a failed node), waits for the same allocation to run again,
        as `up` waited for it first (the bound, Ctrl-C), and gives its nodes in the old ones'
        places. Slurm ended every step of it, the keeper's too: a new keeper holds it."""
        running = self.running
        if running is None or not self.settings.requeue or self._ended:
            return None
        job = allocation.requeued(self.cluster, running)
        if job is None:
            return None
        said = allocation.what_slurm_did(self.cluster, running.job_id, running.nodes)
        say(f"{said or f'Slurm requeued allocation {job.id}'}: waiting for it to run again")
        self._close_keeper()
        job = allocation.wait_running(self.cluster, self.settings, job.id, say)
        found = self.take(job)
        say(runs_on(self.settings, job, found, again=" again"))
        places = dict(zip(running.nodes, found.hosts, strict=True))
        return Regained(places, deadlines(self.settings, job))

    def hand_over(self, say: Say) -> None:
        """A detached run's from now on: the body ends the allocation once no task of the run
        is left on any node (`down` at once). Without a keeper to tell, nothing was handed
        over, and `end` releases it as after any failed `up`."""
        if self._ended or self._keeper is None:
            return
        self._keeper.tell("detached")
        self._ended = True
        say(DETACHED)
        self._close()

    def end(self, say: Say) -> None:
        """`up`'s end, however it ended: what Slurm did to the allocation meanwhile said (a
        requeue, a preemption, the time limit), then kept (keep_allocation) or released;
        every connection closed. Nothing after a hand-over, or a second time."""
        if self._ended:
            return
        self._ended = True
        try:
            ended = self._said_end()
            if ended is not None:
                say(ended)
            if self.settings.keep_allocation and self._keeper is not None:
                self._keeper.tell("keep")
                say(KEPT)
                return
            self._close_keeper()
            if self.job_id is not None:
                self.cluster.cancel(self.job_id)
                say(f"released allocation {self.job_id}")
        finally:
            self._close()

    # ---- helpers -----------------------------------------------------------------------------

    def _said_end(self) -> str | None:
        """`what_slurm_did` for this allocation; None when it cannot be asked (the end goes on)."""
        if self.running is None:
            return None
        try:
            return allocation.what_slurm_did(self.cluster, self.running.job_id, self.running.nodes)
        except TfdeployError:
            return None

    def _close_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.close()

    def _close(self) -> None:
        self._close_keeper()
        with contextlib.suppress(Exception):
            self.cluster.close()


def runs_on(settings: SlurmSettings, job: QueuedJob, found: Discovered, again: str = "") -> str:
    """ "allocation 17 runs on h2, h3, 14m58s left; its tasks get SIGUSR1 ..." """
    left = f", {say_duration(job.left)} left" if job.left is not None else ""
    if settings.signal:
        name, before = settings.signal
        left += f"; its tasks get SIG{name} {say_duration(before)} before the time limit"
    names = ", ".join(h.name for h in found.hosts)
    return f"allocation {job.id} runs{again} on {names}{left}"


def deadlines(settings: SlurmSettings, job: QueuedJob) -> tuple[Deadline, ...]:
    """The allocation's time limit, for the watch's warnings."""
    if job.left is None:
        return ()
    what = f"Slurm allocation {job.id}"
    return (Deadline(what, time.time() + job.left, settings.signal),)
