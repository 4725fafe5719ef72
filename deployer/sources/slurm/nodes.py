"""An allocation's nodes as the run's hosts, and how `plan` and `status` show the allocation.

Nodes go to the `[[slurm.hosts]]` groups in Slurm's order of the allocation's node list: the
first group gets its `nodes` first nodes, and so on. Each node is reached as job steps launched
from the login node (`reach = "srun"`) or over SSH through the login node (`reach = "ssh"`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from deployer.config.inventory import make_host
from deployer.config.model import Host, Via
from deployer.config.sources import Discovered, SourceTable
from deployer.sources.slurm import batch
from deployer.sources.slurm.cluster import Cluster
from deployer.sources.slurm.outputs import (
    MAX_HOSTS,
    QueuedJob,
    expand_hostlist,
    hostlist_count,
    say_duration,
)
from deployer.sources.slurm.settings import LOCAL, NodeGroup, SlurmSettings

COLUMNS = ("node", "address", "GPUs granted", "allocation", "state", "time left", "group")


def preview(settings: SlurmSettings) -> Discovered:
    """`plan`: one stand-in per node `up` will be allocated; nothing asks Slurm."""
    hosts, rows = [], []
    for group, i in _slots(settings):
        name = f"slurm-{i + 1}"
        hosts.append(
            make_host(
                group.settings,
                name=name,
                address=name,
                tf_address=name,
                key=group.key,
                transport="ssh",
            )
        )
        gpus = str(group.settings.gpus) if group.settings.gpus else "-"
        rows.append(("(to allocate)", "-", gpus, "-", "-", settings.time, group.key))
    table = SourceTable(
        title=f"{settings.nodes} Slurm nodes (to allocate by `up` in {settings.partition})",
        columns=COLUMNS,
        rows=tuple(rows),
        json_key="nodes",
        documents=tuple(
            {"node": None, "group": r[-1], "partition": settings.partition} for r in rows
        ),
        to_launch=settings.nodes,
    )
    return Discovered(hosts=tuple(hosts), table=table)


def without_hosts(settings: SlurmSettings, found: Sequence[QueuedJob]) -> Discovered:
    """`status` while the allocation waits (or there is none): its state, no host to ask."""
    rows = tuple(
        ("-", "-", "-", j.id, f"{j.state.value.lower()} ({j.reason})", _left(j), "-") for j in found
    )
    title = f"Slurm allocation of {settings.job_name}: " + ("none" if not found else "waiting")
    return Discovered(
        hosts=(),
        instances=tuple(found),
        table=SourceTable(
            title, COLUMNS, rows, "allocations", tuple(_doc(j) for j in found), in_status=True
        ),
    )


def allocated(cluster: Cluster, settings: SlurmSettings, job: QueuedJob) -> Discovered:
    """The running allocation's nodes as hosts: names, addresses, the GPUs Slurm granted.
    The node list is counted before it is expanded: only a list of the nodes asked for is."""
    command = f"squeue -j {job.id} (%N)"
    count = hostlist_count(job.nodelist, command, MAX_HOSTS)
    if count != settings.nodes:
        from deployer.sources.slurm.allocation import AllocationLost

        raise AllocationLost(
            f"allocation {job.id} has {count} nodes ({short_list(job.nodelist)}), the "
            f"inventory asks for {settings.nodes}",
            hint=f"`tfdeploy down` releases it (or scancel {job.id}); then up again",
        )
    names = expand_hostlist(job.nodelist, command, settings.nodes)
    found = cluster.nodes(names)
    granted = cluster.granted_gpus(job.id, names) if settings.gpus_per_node else {}
    hosts, rows = [], []
    for (group, _), name in zip(_slots(settings), names, strict=True):
        node = found.get(name)
        address = node.address if node is not None else name
        gpu_ids = granted.get(name, ())
        hosts.append(_host(settings, group, job.id, name, address, gpu_ids))
        shown = ",".join(str(g) for g in gpu_ids) or "-"
        rows.append((name, address, shown, job.id, job.state.value.lower(), _left(job), group.key))
    table = SourceTable(
        title=f"Slurm allocation {job.id} ({job.state.value.lower()}, {_left(job)} left)",
        columns=COLUMNS,
        rows=tuple(rows),
        json_key="nodes",
        documents=tuple(dict(zip(COLUMNS, r, strict=True)) for r in rows),
        in_status=True,
    )
    return Discovered(hosts=tuple(hosts), instances=(job,), table=table)


def _host(
    settings: SlurmSettings,
    group: NodeGroup,
    job_id: str,
    name: str,
    address: str,
    gpu_ids: tuple[int, ...],
) -> Host:
    local = settings.login == LOCAL
    host = make_host(
        group.settings,
        name=name,
        address=address,
        tf_address=address,
        key=group.key,
        transport="ssh",
    )
    if gpu_ids:
        host = dataclasses.replace(host, gpus=len(gpu_ids), gpu_ids=gpu_ids)
    if settings.reach == "srun":
        via = Via(LOCAL if local else settings.login, batch.step_launcher(job_id, name))
        return dataclasses.replace(host, via=via)
    if local:
        return host
    ssh = host.ssh
    jump = f"{ssh.jump},{settings.login}" if ssh.jump else settings.login
    return dataclasses.replace(host, ssh=dataclasses.replace(ssh, jump=jump))


def short_list(nodelist: str, at_most: int = 80) -> str:
    """A node list for a message (it may be long, never unsafe: the parser checked its form)."""
    return nodelist if len(nodelist) <= at_most else nodelist[: at_most - 3] + "..."


def _slots(settings: SlurmSettings) -> list[tuple[NodeGroup, int]]:
    slots, i = [], 0
    for group in settings.groups:
        for _ in range(group.nodes):
            slots.append((group, i))
            i += 1
    return slots


def _left(job: QueuedJob) -> str:
    return say_duration(job.left) if job.left is not None else "unlimited"


def _doc(job: QueuedJob) -> dict[str, Any]:
    return {
        "allocation": job.id,
        "state": job.state.value,
        "reason": job.reason,
        "time_left_s": job.left,
        "nodes": job.nodes,
        "partition": job.partition,
    }
