"""`plan`, `check` and `up` as functions: what the CLI's verbs of those names do, minus printing.

The CLI calls these with its views and message callbacks; a notebook or a pipeline calls them
with none (quiet) or with its own. Errors are raised, typed (deployer.core.errors), never
printed: the CLI renders them, a pipeline's task fails with them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal, overload

from deployer.api.actions import Say, terminate_sources, with_run
from deployer.api.handle import Result, Run, TaskState, started
from deployer.api.inventories import InventoryLike, load
from deployer.api.views import View, events_to
from deployer.config.inventory import discover_hosts, provision_hosts
from deployer.config.model import Host, NetcheckMode
from deployer.config.plan import Plan, make_plan
from deployer.config.sources import AT_JOB_END, Holdings
from deployer.core.errors import TfdeployError, UsageError
from deployer.core.text import plural
from deployer.hosts.fleet import DEFAULT_CONCURRENCY, Fleet, open_transport
from deployer.hosts.transport import Transport
from deployer.results.state import RUN_ID
from deployer.up.deployment import Deployment, UpOptions
from deployer.up.environment import PlannedEnv, planned_environments

PathLike = str | os.PathLike[str]
# Which TF connections preflight tries: None or True (as the inventory's job.netcheck says),
# False (none), or a mode: "auto" (all up to 32 hosts, a sample above), "full", "sampled", "off".
Netcheck = bool | str | NetcheckMode | None


def netcheck_mode(value: Netcheck) -> NetcheckMode | None:
    """The mode `value` asks for; None leaves it to the inventory. Raises UsageError for a
    word that names no mode."""
    if value is None or value is True:
        return None
    if value is False:
        return NetcheckMode.OFF
    try:
        return NetcheckMode(value)
    except ValueError:
        words = ", ".join(repr(m.value) for m in NetcheckMode)
        raise UsageError(
            f"netcheck={value!r}: expected True, False, None or one of {words}"
        ) from None


def _nothing(_: str) -> None:
    pass


def _reaching(holdings: Holdings) -> Callable[[Host], Transport]:
    """How `up` reaches each host: a held one over what holds it (a Slurm allocation's nodes
    as job steps over the allocation's one login connection), any other one as usual."""

    def connect(host: Host) -> Transport:
        held: Transport | None = holdings.connect(host)
        return held if held is not None else open_transport(host)

    return connect


def _end(holdings: Holdings, say: Say, warn: Say) -> None:
    """`up`'s end for what the sources held (released, or kept; nothing after a detached
    run's hand-over): a failure there is reported, and the job's own outcome stands."""
    try:
        holdings.end(say)
    except TfdeployError as exc:
        warn(f"ending what the run held failed: {exc}")


def plan(inventory: InventoryLike, *, base: PathLike | None = None) -> Plan:
    """Every task of the job: host, TF address and port, GPUs, command, TF_CONFIG. Touches no
    host and launches nothing (host sources list what `up` would launch as stand-ins).

    Raises InventoryError for a wrong inventory.
    """
    return make_plan(discover_hosts(load(inventory, base=base), preview=True))


def environments(plan: Plan) -> list[PlannedEnv]:
    """Each host's Python environment (`requirements`) as far as this machine knows it without
    asking a host: its hash, platform and wheels where an earlier `up` or `check` learnt the
    host's platform and the wheels are resolved here, else "resolved at up"."""
    return planned_environments(plan)


def check(
    inventory: InventoryLike,
    *,
    base: PathLike | None = None,
    netcheck: Netcheck = None,
    refresh_env: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    view: View | None = None,
) -> None:
    """Preflight alone: every host reached and checked (and the TF connections tried as
    `netcheck` says: see `Netcheck`), nothing started. Returns when all is well.

    Raises InventoryError, UsageError (hosts of a fleet not launched yet), HostsFailed (hosts
    unreachable or failing a check), NetworkBlocked (TF connections that cannot be made).
    """
    shown = events_to(view)
    try:
        loaded = discover_hosts(load(inventory, base=base), preview=True)
        missing = sum(t.to_launch for t in loaded.tables)
        if missing:
            raise UsageError(
                f"{plural(missing, 'instance')} of the fleet {'is' if missing == 1 else 'are'} "
                "not launched yet: check needs every host running",
                hint=f"`tfdeploy up {loaded.path}` launches them (`plan` shows what it would)",
            )
        the_plan = make_plan(loaded)
    except BaseException:
        shown.close()
        raise
    with Fleet(the_plan.hosts, concurrency=concurrency) as fleet:
        Deployment(
            the_plan,
            fleet,
            shown,
            UpOptions(netcheck=netcheck_mode(netcheck), refresh_env=refresh_env),
        ).check()  # closes it


@overload
def up(
    inventory: InventoryLike,
    *,
    detach: Literal[False] = False,
    base: PathLike | None = None,
    netcheck: Netcheck = None,
    refresh_env: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    view: View | None = None,
    say: Say | None = None,
    warn: Say | None = None,
    resume: str | None = None,
) -> Result: ...


@overload
def up(
    inventory: InventoryLike,
    *,
    detach: Literal[True],
    base: PathLike | None = None,
    netcheck: Netcheck = None,
    refresh_env: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    view: View | None = None,
    say: Say | None = None,
    warn: Say | None = None,
    resume: str | None = None,
) -> Run: ...


@overload
def up(
    inventory: InventoryLike,
    *,
    detach: bool,
    base: PathLike | None = None,
    netcheck: Netcheck = None,
    refresh_env: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    view: View | None = None,
    say: Say | None = None,
    warn: Say | None = None,
    resume: str | None = None,
) -> Result | Run: ...


def up(
    inventory: InventoryLike,
    *,
    detach: bool = False,
    base: PathLike | None = None,
    netcheck: Netcheck = None,
    refresh_env: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    view: View | None = None,
    say: Say | None = None,
    warn: Say | None = None,
    resume: str | None = None,
) -> Result | Run:
    """Deploys the job: preflight, push, setup, start, and (attached) watch until the awaited
    tasks end, then tear down on every host, whatever happened, and pull job.artifacts.

    Attached (the default) blocks and returns the Result of a job that succeeded. Detached
    returns a Run once every task runs; the run goes on without this process.

    `view` receives the events (steps, log lines, the task table); None: quiet. `say` receives
    the host sources' notes (instances launched, terminated); default: the view's steps.
    `warn`: a failure after the job that does not change its outcome (a terminate at job end
    that failed); default: `say`. The view is closed when `up` returns.

    `resume`: a run id of the job that ended early (stopped by `down`, failed, its hosts' lease
    lapsed): that run goes on under its own id instead of a new one, every task started again
    in its folder of the run with the next TFDEPLOY_ATTEMPT (docs/up.md, "Resuming a run").
    A run that cannot be resumed raises ResumeRefused (a UsageError) and starts nothing.

    Raises InventoryError (wrong inventory), HostsFailed or HostError (hosts unreachable or
    failing preflight), NetworkBlocked, JobFailed (a task failed, a deadline passed),
    Interrupted (Ctrl-C, SIGTERM, SIGHUP: every started task was stopped), LocalError. Once a
    run was started, the error's `run_id` names it.
    """
    shown = events_to(view)
    say = say or shown.step
    warn = warn or say
    deployment: Deployment | None = None
    running = False  # Deployment.run closes the view from here on
    try:
        if resume is not None and not RUN_ID.match(resume):
            raise UsageError(f"{resume!r} is not a run id to resume (JOB-YYYYMMDDTHHMMSSZ-XXXX)")
        loaded = load(inventory, base=base)
        provisioned, holdings = provision_hosts(loaded, say, detach=detach)
        try:  # what the sources hold for this up (a Slurm allocation) is its own to end
            the_plan = make_plan(provisioned)
            connect = _reaching(holdings)
            with Fleet(the_plan.hosts, concurrency=concurrency, connect=connect) as fleet:
                options = UpOptions(
                    detach=detach,
                    netcheck=netcheck_mode(netcheck),
                    refresh_env=refresh_env,
                    resume=resume,
                )
                deployment = Deployment(the_plan, fleet, shown, options, holdings=holdings)
                running = True
                deployment.run()  # closes the view, whatever happens
            if detach:  # the run goes on without this process: what a source holds is its now
                holdings.hand_over(say)
        finally:
            _end(holdings, say, warn)
            if not detach:
                try:
                    terminate_sources(loaded, AT_JOB_END, say)
                except TfdeployError as exc:  # reported; the job's own outcome stands
                    warn(f"terminate_after = job-end failed: {exc}")
    except TfdeployError as exc:
        if deployment is not None and deployment.contacted_hosts:  # its record was written
            with_run(exc, deployment.run_id)
        raise
    finally:
        if not running:
            shown.close()
    run = started(deployment.plan, deployment.run_id, loaded)
    if detach:
        return run
    watches = deployment.board.watches.values()
    tasks = tuple(TaskState.of(w.task.host, w.status, w.task.name, w.task.awaited) for w in watches)
    return Result(deployment.run_id, tasks, run)
