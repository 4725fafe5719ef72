"""The `[slurm]` host source: the nodes of one Slurm allocation per job, held while the job runs.

This module is the plug-in (what deployer/sources/__init__.py names): `read` turns the table
into a `SlurmSource`. settings.py holds the table as data, outputs.py reads Slurm's answers,
cluster.py runs its commands on the login node, batch.py writes what Slurm is handed,
allocation.py submits, waits, keeps and releases, nodes.py turns the allocated nodes into hosts.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from deployer.config.model import Host, SSHSettings
from deployer.config.schema import Table
from deployer.config.sources import (
    AT_DETACH,
    Deadline,
    Discovered,
    Regained,
    Say,
    SourceContext,
    Sourced,
)
from deployer.sources.slurm import allocation, batch, nodes
from deployer.sources.slurm.cluster import Cluster, SlurmRefused
from deployer.sources.slurm.outputs import JobState, QueuedJob, say_duration
from deployer.sources.slurm.settings import REACH, SlurmSettings, parse_settings


@dataclass(frozen=True)
class SlurmSource:
    """One inventory's `[slurm]`, as a `HostSource`."""

    settings: SlurmSettings
    ssh: SSHSettings  # [ssh]: how the login node is reached

    @property
    def key(self) -> str:
        return self.settings.key

    def cluster(self) -> Cluster:
        return Cluster.of(self.settings, self.ssh)

    def discover(self, file: str, *, preview: bool = False) -> Discovered:
        """`plan`, `check`: stand-ins `(to allocate)`, and nothing asks Slurm. `status`,
        `down`, `logs`, `pull`: the nodes of the job's allocation while it runs."""
        if preview:
            return nodes.preview(self.settings)
        cluster = self.cluster()
        found = cluster.named(self.settings.job_name)
        running = [j for j in found if j.state is JobState.RUNNING]
        if not running:
            return nodes.without_hosts(self.settings, found)
        return nodes.allocated(cluster, self.settings, running[0])

    def provision(self, file: str, say: Say, *, detach: bool = False) -> Discovered:
        """`up`: the job's kept allocation, or a new one, waited for; its nodes as hosts."""
        cluster = self.cluster()
        settings = self.settings
        if detach and settings.reach == REACH[0]:
            _refuse_lost_detach(cluster, file)
        job = _kept(cluster, settings, say)
        if job is None:
            allocation.check_request(cluster, settings)
            job_id = allocation.submit(cluster, settings)
            say(
                f"submitted allocation {job_id}: {settings.nodes} nodes in "
                f"{settings.partition} for {settings.time}"
            )
            try:
                job = allocation.wait_running(cluster, settings, job_id, say)
                found = self._held_nodes(cluster, job)
            except BaseException:  # the bound, Ctrl-C, a lost allocation: it holds nothing yet
                if allocation.release(settings.job_name):
                    say(f"cancelled allocation {job_id}")
                raise
        else:
            allocation.hold(settings.job_name, allocation.Held(cluster, job.id))
            found = self._held_nodes(cluster, job)
            allocation.tell_keeper(settings.job_name, "keep")
        say(self._runs_on(job, found))
        return dataclasses.replace(found, deadlines=self._deadlines(job))

    def _runs_on(self, job: QueuedJob, found: Discovered, again: str = "") -> str:
        left = f", {say_duration(job.left)} left" if job.left is not None else ""
        if self.settings.signal:
            name, before = self.settings.signal
            left += f"; its tasks get SIG{name} {say_duration(before)} before the time limit"
        names = ", ".join(h.name for h in found.hosts)
        return f"allocation {job.id} runs{again} on {names}{left}"

    def _deadlines(self, job: QueuedJob) -> tuple[Deadline, ...]:
        if job.left is None:
            return ()
        what = f"Slurm allocation {job.id}"
        return (Deadline(what, time.time() + job.left, self.settings.signal),)

    def _held_nodes(self, cluster: Cluster, job: QueuedJob) -> Discovered:
        """The running allocation's nodes as hosts; its lease keeper started on the first."""
        found = nodes.allocated(cluster, self.settings, job)
        held = allocation.HELD[self.settings.job_name]
        held.nodes = tuple(h.name for h in found.hosts)
        held.running_since = time.time() - (job.elapsed or 0)
        allocation.start_keeper(held, found.hosts[0].name)
        return found

    def replace(self, file: str, gone: Host, say: Say) -> Host | None:
        return None  # a lost node ends the allocation's use: Slurm requeues or fails the job

    def regain(self, file: str, say: Say) -> Regained | None:
        """With on_failure = "restart-job" (the allocation asked with --requeue): once Slurm
        requeued it (a preemption, a failed node), waits for the same allocation to run again,
        as `up` waited for it first (the bound, Ctrl-C), and gives its nodes in the old ones'
        places. Slurm ended every step of it, the keeper's too: a new keeper holds it."""
        held = allocation.HELD.get(self.settings.job_name)
        if held is None or not self.settings.requeue:
            return None
        job = allocation.requeued(held.cluster, held)
        if job is None:
            return None
        said = allocation.what_slurm_did(held.cluster, held)
        say(f"{said or f'Slurm requeued allocation {job.id}'}: waiting for it to run again")
        allocation.close_keeper(held)
        before = held.nodes
        job = allocation.wait_running(held.cluster, self.settings, job.id, say)
        found = self._held_nodes(held.cluster, job)
        say(self._runs_on(job, found, again=" again"))
        places = dict(zip(before, found.hosts, strict=True))
        return Regained(places, self._deadlines(job))

    def terminate(self, when: tuple[str, ...], say: Say) -> None:
        """At `up`'s end the allocation is released (kept with keep_allocation); a detached
        run gets it (AT_DETACH); `down` cancels every allocation of the job."""
        name = self.settings.job_name
        if when == AT_DETACH:
            if allocation.tell_keeper(name, "detached"):
                say("the allocation stays while the run's tasks run (`tfdeploy down` ends it)")
            return
        if "down" not in when:  # up's end
            ended = allocation.said_end(name)
            if ended is not None:
                say(ended)
            if self.settings.keep_allocation and allocation.tell_keeper(name, "keep"):
                allocation.release(name)
                say(
                    "kept the allocation for the next up (keep_allocation; `tfdeploy down` "
                    "releases it)"
                )
                return
            released = allocation.release(name)
            if released:
                say(f"released allocation {released}")
            return
        allocation.release(name)
        cluster = self.cluster()
        for job in cluster.named(name):
            cluster.cancel(job.id)
            say(f"released allocation {job.id} ({job.state.value.lower()})")


def _refuse_lost_detach(cluster: Cluster, file: str) -> None:
    """`up --detach` with `reach = "srun"` on a cluster that tracks processes with
    proctrack/cgroup, as most production clusters do: the tasks live in the agents' job steps,
    which end when `up` returns, and Slurm kills what a step started when it ends
    (docs/slurm.md, "Process tracking"). The run would die seconds after `up` said it runs, so
    it is refused before anything is allocated, until its tasks get steps of their own (#60)."""
    tracking = cluster.proctrack()
    if tracking != "proctrack/cgroup":
        return
    raise SlurmRefused(
        f'{file}: [slurm] reach = "srun" cannot keep a detached run on this cluster: it tracks '
        f"processes with {tracking}, so every task would end with the agent's job step that "
        "started it, as soon as `up --detach` returns; nothing was allocated",
        hint="run `tfdeploy up` attached (it holds those steps for the whole run), or set reach "
        '= "ssh" in [slurm] where the nodes\' pam_slurm_adopt admits your SSH sessions into the '
        'job (docs/slurm.md, "Process tracking: what survives a step")',
    )


def _kept(cluster: Cluster, settings: SlurmSettings, say: Say) -> QueuedJob | None:
    """The job's allocation that a previous `up` kept, if it runs and was asked for as this
    inventory asks (batch.request: partition, nodes, time, gpus, the options and body that shape
    it); another one of the job's name, pending or running, is refused (two `up` of one job would
    share nodes), and so is a kept one asked for otherwise, saying what differs."""
    found = cluster.named(settings.job_name)
    if not found:
        return None
    job = found[0]
    from deployer.sources.slurm.cluster import SlurmRefused

    if settings.keep_allocation and job.state is JobState.RUNNING:
        differs = batch.request_differences(settings, job.comment)
        if not differs:
            say(f"using allocation {job.id}, kept by the last up")
            return job
        raise SlurmRefused(
            f"allocation {job.id} ({settings.job_name}) was kept by an up that asked for another "
            f"allocation than this inventory does: {'; '.join(differs)}",
            hint="`tfdeploy down INVENTORY` releases it (or scancel "
            f"{job.id} on the login node); then up again for an allocation of this request",
        )
    raise SlurmRefused(
        f"the job already has allocation {job.id} ({job.state.value.lower()}, "
        f"{settings.job_name}): another up of this inventory runs, or a previous one was kept",
        hint="`tfdeploy down INVENTORY` releases it (or scancel "
        f"{job.id} on the login node); a crashed up's allocation ends by itself within the lease",
    )


def read(t: Table, context: SourceContext) -> Sourced:
    """`[slurm]`: pure; its nodes are allocated when `up` calls `provision`."""
    return Sourced(pending=SlurmSource(parse_settings(t, context), context.ssh))
