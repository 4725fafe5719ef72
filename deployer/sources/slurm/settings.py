"""The `[slurm]` table as data: the login node, what to ask Slurm for, and how to reach the nodes.

Parsing is pure and runs inside `load_inventory`; nothing here talks to Slurm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deployer.config.inventory import parse_host_settings
from deployer.config.model import FailurePolicy, HostSettings
from deployer.config.schema import Table
from deployer.config.sources import SourceContext
from deployer.sources.slurm import sbatch_options

LOCAL = "local"  # `login = "local"`: tfdeploy runs on the login node itself
# How processes reach the allocated nodes: as job steps started from the login node (works where
# nodes refuse SSH), or over SSH to each node (pam_slurm_adopt puts the session into the job).
REACH = ("srun", "ssh")
# Slurm's time formats (sbatch --time): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
# ASCII digits, each field bounded (`\d` takes every script's digits, int() 5,000 of them).
_TIME = re.compile(r"^([0-9]{1,6}-)?[0-9]{1,6}(:[0-9]{1,6}){0,2}$")
# `signal`: NAME@SECONDS. Slurm signals the body (sbatch --signal=B:NAME@SECONDS), which passes
# it to every task of the run on every node: tasks started by the agent are no step of their own.
_SIGNAL = re.compile(r"^(?:SIG)?([A-Z][A-Z0-9]{0,15})@([0-9]{1,7})$")
# An sbatch option of the user's own: long form, with its value after '='.
_OPTION = re.compile(r"^--[a-z][a-z0-9-]*(=.+)?$")
# Options tfdeploy sets itself, or that would hide the allocation from it or make it something
# else: the user's extra options must not change what it relies on. Refused by what sbatch takes
# an option for (its getopt_long prefix rule: `--job-n=` is `--job-name=`; sbatch_options.py).
OWN_OPTIONS = (
    "--job-name",  # down, status and the next up find the allocation by its name
    "--comment",  # what tfdeploy asked for, read back by the next up (keep_allocation)
    "--nodes",
    "--ntasks",
    "--ntasks-per-node",
    "--tasks-per-node",  # sbatch's other name for --ntasks-per-node
    "--partition",
    "--time",
    "--output",
    "--error",
    "--parsable",
    "--wrap",
    "--array",
    "--chdir",
    "--gres",
    "--gpus",
    "--gpus-per-node",
    "--gpus-per-task",
    "--gpus-per-socket",
    "--signal",
    "--test-only",  # the check's own: in the submit, nothing would be submitted
    "--wait",  # sbatch would not return until the allocation ended
    "--hold",  # pending forever, until someone releases it
    "--cluster",  # another cluster's queue: squeue here would not see it
    "--clusters",
    "--uid",  # another user's job: `squeue --me` would not see it
    "--gid",
    "--help",  # sbatch prints and submits nothing
    "--usage",
    "--version",
)
WAIT_S = 0.0  # `wait` left out: wait for the allocation as long as Slurm keeps it pending


@dataclass(frozen=True)
class NodeGroup:
    """One `[[slurm.hosts]]` entry: `nodes` allocated nodes, each running the group's tasks."""

    nodes: int
    settings: HostSettings  # tasks, GPUs (per node), port, python, workdir, ssh: as [[hosts]]
    key: str  # "slurm.hosts[0]"


@dataclass(frozen=True)
class SlurmSettings:
    """The `[slurm]` host source: one allocation per job, its nodes the run's hosts."""

    login: str  # an address reached over [ssh], or "local"
    partition: str
    time: str  # the allocation's time limit, as Slurm writes it
    groups: tuple[NodeGroup, ...]
    job: str = ""  # the job's name: the allocation is named tfdeploy-<job>
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    exclusive: bool = False
    sbatch_options: tuple[str, ...] = ()
    wait: float = WAIT_S  # seconds a pending allocation may wait; 0: as long as it takes
    keep_allocation: bool = False  # the allocation outlives `up`, for the next one; `down` ends it
    reach: str = REACH[0]
    signal: tuple[str, int] | None = None  # ("USR1", 300): the tasks' warning before the limit
    # on_failure = "restart-job": a preempted allocation, or one whose node failed, is requeued
    # (sbatch --requeue, whatever the cluster's JobRequeue) and the job restarts when it runs again
    requeue: bool = False
    lease_seconds: float = (
        60.0  # the job's lease: the allocation ends this long after its controller
    )
    key: str = "slurm"

    @property
    def nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def gpus_per_node(self) -> int:
        return self.groups[0].settings.gpus

    @property
    def job_name(self) -> str:
        """The allocation's name in Slurm: how `down`, `status` and the next `up` find it."""
        return f"tfdeploy-{self.job}"


def parse_settings(t: Table, context: SourceContext) -> SlurmSettings:
    """`[slurm]`: pure; its nodes are allocated later, when `up` calls `provision`."""
    login = t.required_string("login")
    if login != LOCAL:
        login = t.host_address("login", login, port_key="ssh.port")
    time = t.required_string("time")
    if not _TIME.match(time):
        t.fail("time", f'expected a Slurm time limit such as "02:00:00" or "1-00:00", got {time!r}')
    groups = tuple(_group(g, context) for g in t.table_list("hosts", required=True))
    _same_gpus(t, groups)
    settings = SlurmSettings(
        login=login,
        partition=t.required_string("partition"),
        time=time,
        groups=groups,
        job=context.job.name,
        account=t.string("account"),
        qos=t.string("qos"),
        constraint=t.string("constraint"),
        reservation=t.string("reservation"),
        exclusive=t.boolean("exclusive", False),
        sbatch_options=_options(t),
        wait=t.number("wait", WAIT_S),
        keep_allocation=t.boolean("keep_allocation", False),
        reach=t.choice("reach", REACH, REACH[0]),
        signal=_signal(t),
        lease_seconds=context.job.lease_seconds,
        requeue=context.job.on_failure == FailurePolicy.RESTART_JOB,
    )
    t.finish()
    return settings


def _group(g: Table, context: SourceContext) -> NodeGroup:
    if not g.has("nodes"):
        g.fail("nodes", "is missing: expected the number of nodes this group gets, e.g. nodes = 2")
    nodes = g.integer("nodes", 1, minimum=1, maximum=100000)
    settings = parse_host_settings(g, context)
    if settings.gpus_auto:
        g.fail(
            "gpus",
            'Slurm is asked for a number of GPUs per node, not "auto"',
            hint="write the count, e.g. gpus = 4 (what `sinfo -o '%P %G'` lists for the partition)",
        )
    group = NodeGroup(nodes=nodes, settings=settings, key=g.path)
    g.finish()
    return group


def _same_gpus(t: Table, groups: tuple[NodeGroup, ...]) -> None:
    """One allocation asks every node for the same GPUs (a heterogeneous job is not made)."""
    first = groups[0].settings.gpus
    for i, group in enumerate(groups[1:], start=1):
        if group.settings.gpus != first:
            t.fail(
                f"hosts[{i}].gpus",
                f"{group.settings.gpus} GPUs per node, but hosts[0] asks for {first}: one "
                "allocation asks every node for the same number of GPUs",
                hint="give every [[slurm.hosts]] group the same gpus, or run the groups as jobs "
                "of their own",
            )


def _options(t: Table) -> tuple[str, ...]:
    options = t.string_list("sbatch_options")
    for option in options:
        if not _OPTION.match(option):
            t.fail(
                "sbatch_options",
                f"expected long sbatch options such as '--mem=64G', got {option!r}",
                hint="write each option as one string, its value after '='",
            )
        _as_sbatch_reads(t, option)
    return options


def _as_sbatch_reads(t: Table, option: str) -> None:
    """Refuses `option` by what sbatch would take it for (sbatch_options.resolve)."""
    written, equal, _ = option[2:].partition("=")
    found = sbatch_options.resolve(written)
    if found.ambiguous:
        t.fail(
            "sbatch_options",
            f"--{written} is ambiguous to sbatch (it abbreviates "
            + ", ".join(f"--{n}" for n in found.candidates)
            + "), which refuses it",
            hint="write the option's whole name",
        )
    if found.name is None:
        return  # not an option of Slurm 22.05: sbatch itself judges it (`up` checks first)
    name = f"--{found.name}"
    said = name if found.name == written else f"--{written} (sbatch reads it as {name})"
    if name in OWN_OPTIONS:
        t.fail(
            "sbatch_options",
            f"{said} is set by tfdeploy itself, or would hide the allocation from it "
            "(partition, time, nodes, gpus, signal and the allocation's name and comment are "
            "[slurm] keys)",
            hint="use the [slurm] key for it, or remove the option",
        )
    argument = sbatch_options.LONG_OPTIONS[found.name]
    if argument == sbatch_options.REQUIRED and not equal:
        t.fail(
            "sbatch_options",
            f"{said} takes a value: write it after '=' ({name}=VALUE); alone, sbatch would "
            "take the next option for its value",
        )
    if argument == sbatch_options.NONE and equal:
        t.fail("sbatch_options", f"{said} takes no value (sbatch refuses {option!r})")


def _signal(t: Table) -> tuple[str, int] | None:
    value = t.string("signal")
    if value is None:
        return None
    match = _SIGNAL.match(value)
    if match is None:
        t.fail(
            "signal",
            f'expected a signal name and the seconds before the time limit, e.g. "USR1@300", '
            f"got {value!r}",
        )
    return match.group(1), int(match.group(2))
