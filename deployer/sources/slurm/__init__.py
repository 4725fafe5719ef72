"""The `[slurm]` host source: the nodes of one Slurm allocation per job, held while the job runs.

This module is the plug-in (what deployer/sources/__init__.py names): `read` turns the table
into a `SlurmSource`. settings.py holds the table as data, outputs.py reads Slurm's answers,
cluster.py runs its commands on the login node, batch.py writes what Slurm is handed,
allocation.py submits, waits and starts the lease keeper, held.py is the allocation one `up`
holds from `provision` to its end, nodes.py turns the allocated nodes into hosts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from deployer.config.model import Host, SSHSettings
from deployer.config.schema import Table
from deployer.config.sources import (
    Discovered,
    Provisioned,
    Say,
    SourceContext,
    Sourced,
)
from deployer.sources.slurm import allocation, batch, nodes
from deployer.sources.slurm.cluster import Cluster
from deployer.sources.slurm.held import HeldAllocation, deadlines, runs_on
from deployer.sources.slurm.outputs import JobState, QueuedJob
from deployer.sources.slurm.settings import SlurmSettings, parse_settings


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
        with self.cluster() as cluster:
            found = cluster.named(self.settings.job_name)
            running = [j for j in found if j.state is JobState.RUNNING]
            if not running:
                return nodes.without_hosts(self.settings, found)
            return nodes.allocated(cluster, self.settings, running[0])

    def provision(self, file: str, say: Say, *, detach: bool = False) -> Provisioned:
        """`up`: the job's kept allocation, or a new one, waited for; its nodes as hosts, and
        the allocation itself, which that `up` holds and ends (held.py). One that cannot serve
        the run (the wait's bound, Ctrl-C, a lost allocation, a keeper that does not answer) is
        cancelled before this returns, and its connections closed."""
        cluster = self.cluster()
        settings = self.settings
        held = HeldAllocation(cluster, settings)
        try:
            job = _kept(cluster, settings, say)
            if job is None:
                allocation.check_request(cluster, settings)
                held.job_id = allocation.submit(cluster, settings)
                say(
                    f"submitted allocation {held.job_id}: {settings.nodes} nodes in "
                    f"{settings.partition} for {settings.time}"
                )
                job = allocation.wait_running(cluster, settings, held.job_id, say)
                found = held.take(job)
            else:
                held.job_id = job.id
                found = held.take(job)
                held.keep()
        except BaseException:  # it serves no run: nothing may stay held by nobody
            cancelled = held.release()
            if cancelled is not None:
                say(f"cancelled allocation {cancelled}")
            raise
        say(runs_on(settings, job, found))
        return Provisioned(dataclasses.replace(found, deadlines=deadlines(settings, job)), held)

    def replace(self, file: str, gone: Host, say: Say) -> Host | None:
        return None  # a lost node ends the allocation's use: Slurm requeues or fails the job

    def terminate(self, when: tuple[str, ...], say: Say) -> None:
        """`down` cancels every allocation of the job, whoever holds it. `up`'s own allocation
        is not this one's to end: the `up` that holds it ends it (held.py)."""
        if "down" not in when:
            return
        with self.cluster() as cluster:
            for job in cluster.named(self.settings.job_name):
                cluster.cancel(job.id)
                say(f"released allocation {job.id} ({job.state.value.lower()})")


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
