"""The verbs that name an inventory or a run id rather than hold a `Run`: `status`, `down`,
`pull`, `execute`. `TARGET` is what `tfdeploy status TARGET` takes: an inventory file (every run
of its job), or a run id this machine started (its record names the inventory), or any run id
with `inventory=`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deployer.api.actions import (
    ARTIFACTS_TIMEOUT_S,
    Say,
    discovered,
    newest_run,
    pull_files,
    stop,
    waiting_artifacts,
)
from deployer.api.inventories import InventoryLike, load
from deployer.api.runcost import status_costs
from deployer.config.inventory import discover_hosts
from deployer.config.sources import SourceTable
from deployer.core.errors import HostError, UsageError
from deployer.hosts.fleet import DEFAULT_CONCURRENCY, Fleet
from deployer.hosts.transport import CommandResult
from deployer.results.gpuuse import with_gpu_use
from deployer.results.metricsync import keep_ended
from deployer.results.pull import PullResult
from deployer.results.runs import HostRun, resolve, survey_runs
from deployer.sources.costs import RunCost


@dataclass(frozen=True)
class RunsFound:
    """What `status` found on the hosts: the target's runs (newest first, each one host's
    share: `run_id`, `job`, `host`, `tasks`) and the hosts that could not be asked."""

    runs: list[HostRun]
    failures: list[HostError]
    run_id: str | None  # the run asked for; None: every run of the inventory's job
    nothing_found: str  # in words: what was sought, where, and what is there instead
    # Detached runs that ended with job.artifacts not pulled yet (`down` pulls them), newest first
    artifacts_waiting: tuple[str, ...] = ()
    # What the host sources say beside the runs (a Slurm allocation: pending, running, time left)
    sources: tuple[SourceTable, ...] = ()
    # What each run's machines cost (EC2 instances), by run id: runs on other hosts have none
    costs: Mapping[str, RunCost] = field(default_factory=dict)

    def missing(self) -> UsageError:
        """The error for a run asked for by id that no host has."""
        return UsageError(
            self.nothing_found,
            hint="`tfdeploy status INVENTORY` lists the runs on the inventory's hosts",
        )


@dataclass(frozen=True)
class Executed:
    """What `execute` ran: each reached host's exit code and output, and the hosts that could
    not be reached (the command ran on the others)."""

    results: dict[str, CommandResult]  # host -> .exit_code, .stdout, .stderr (bytes)
    unreachable: list[HostError]


def status(target: str, *, inventory: str | None = None) -> RunsFound:
    """The runs on the hosts of an inventory file (every run of its job), or one run's tasks
    (`target` a run id). A host that cannot be asked is in `failures`; the others' answers
    are kept. Raises UsageError when `target` is neither an inventory file nor a known run."""
    found = discovered(resolve(target, inventory))
    with Fleet(found.hosts) as fleet:
        survey = survey_runs(fleet, found)
        runs = with_gpu_use(fleet, survey.runs)
        keep_ended(fleet, survey.runs, survey.failures)  # the history learns what ended
    waiting = tuple(waiting_artifacts(survey.runs, found.inventory.job))
    sources = tuple(t for t in found.inventory.tables if t.in_status)
    costs = status_costs(runs, found.inventory.tables)  # after keep_ended: ended runs' ends
    return RunsFound(
        runs, survey.failures, found.run_id, survey.nothing_found(found), waiting, sources, costs
    )


def down(
    target: str,
    *,
    inventory: str | None = None,
    terminate: bool = False,
    say: Say | None = None,
    warn: Say | None = None,
    artifacts: bool = True,
    artifacts_timeout: float = ARTIFACTS_TIMEOUT_S,
    progress: Say | None = None,
) -> tuple[str, ...]:
    """Stops the runs of an inventory's job, or one run (finished tasks' escaped processes
    too), on every host; returns the hosts where something was stopped. `terminate` also ends
    every machine the host sources created. `say` receives what `tfdeploy down` prints,
    `warn` its warnings (default: `say`). A detached run's job.artifacts come home after its
    stop, before any machine is terminated (`artifacts=False` skips that; the pull is cut
    after `artifacts_timeout` seconds, what arrived kept). `progress` receives the stop's
    countdown lines (tasks inside their stop_grace, seconds to SIGKILL), where wanted.

    Raises HostsFailed naming the hosts that could not be asked (after the others were
    stopped), UsageError for a run id no host has."""
    say = say or _nothing
    stopped = stop(
        resolve(target, inventory),
        terminate=terminate,
        say=say,
        warn=warn,
        artifacts=artifacts,
        artifacts_timeout=artifacts_timeout,
        progress=progress,
    )
    return tuple(sorted(set(stopped)))


def pull(
    run_id: str,
    patterns: Sequence[str],
    to: str | os.PathLike[str] = ".",
    *,
    inventory: str | None = None,
    tasks: Sequence[str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    say: Say | None = None,
) -> PullResult:
    """`Run.pull` by run id: files the tasks wrote (glob patterns relative to each task's
    directory) into `to/<run id>/<role>-<index>/`; only contents missing here travel.
    `run_id` an inventory file: its job's newest run on the hosts, said through `say`.

    Raises UsageError when `run_id` names no run, Interrupted on Ctrl-C (what arrived is
    kept; its hint is the command that fetches the rest)."""
    target = newest_run(resolve(run_id, inventory), "pull", say or _nothing)
    if inventory is None and target.run_id != run_id:
        inventory = run_id  # the resume hint names the run and its inventory
    return pull_files(
        target, patterns, to, tasks=tasks, concurrency=concurrency, inventory=inventory
    )


def execute(
    inventory: InventoryLike,
    command: str | Sequence[str],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Executed:
    """Runs `command` on every host of the inventory at once, with `sh -c`: a string is a
    shell snippet ("nvidia-smi | head"), a sequence an argv, quoted as it is."""
    shell = command if isinstance(command, str) else shlex.join(command)
    hosts = discover_hosts(load(inventory)).hosts
    with Fleet(hosts, concurrency=concurrency) as fleet:
        results, unreachable = fleet.each_settled(
            lambda m: m.agent.transport.run(["sh", "-c", shell], timeout=None)
        )
    return Executed(results, unreachable)


def _nothing(_: str) -> None:
    pass
