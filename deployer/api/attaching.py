"""`tfdeploy attach RUN|INVENTORY` and `Run.watch`: the live view of a run already running, from
any shell, as its `up` shows it.

Attaching watches and owns nothing. Its polls renew no lease: the run's lease is its keeper's
(a kept run), its `up`'s (an attached run kept by none), or there is none (detached). It
restarts nothing: whoever holds the policy restarts, and attach says so and watches the task
run again (the watch loop's kept path, deployer/watch/loop.py). Leaving it (Ctrl-C, SIGTERM, a
closed terminal) leaves the run as it was; `tfdeploy down` stops it. It ends with the run:
returns once every awaited task exited 0, and raises the job's failure as `up` would have.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from deployer.api.actions import discovered, inventory_masker, newest_run, unknown_run
from deployer.api.views import View, events_to
from deployer.config.plan import Plan, make_plan
from deployer.core.errors import HostError, JobFailed, UsageError
from deployer.core.text import join_names
from deployer.hosts.fleet import DEFAULT_CONCURRENCY, Fleet, Member
from deployer.results.metricsync import keep_ended
from deployer.results.runs import HostRun, Target, resolve, survey_runs
from deployer.watch.guards import holder_guard
from deployer.watch.loop import RestartJob, Watch
from deployer.watch.poller import Poller
from deployer.watch.runstate import RunState
from deployer.watch.view import Display

# A task's log longer than this is shown from its last CATCH_UP_BYTES: attaching to a run of
# days replays what a screen can read, not gigabytes (`tfdeploy logs RUN` has all of it).
CATCH_UP_BYTES = 256 * 1024
INTERVAL_S = 1.0


def watch_run(
    target: Target,
    view: Display,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    interval: float = INTERVAL_S,
) -> None:
    """Shows `target`'s run (its run id must be set) in `view` until it ends. Returns when
    every awaited task exited 0; raises JobFailed when the job failed (or, with nobody to
    restart it, a task did), UsageError when no host has the run."""
    assert target.run_id is not None
    run_id = target.run_id
    found = discovered(target)
    with Fleet(found.hosts, concurrency=concurrency) as fleet:
        survey = survey_runs(fleet, found)
        if not survey.runs:
            raise unknown_run(target, survey)
        plan = _plan_of(found, survey.runs)
        run = RunState(run_id, plan)
        poller = Poller(fleet, run)
        for task in plan.tasks:
            poller.watch_host(task.host)
        watching = Watch(
            poller,
            view,
            restart=_nobody_restarts(run_id),
            sleep=time.sleep,
            interval=interval,
            lease=plan.job.lease_seconds,
            hide=inventory_masker(found.inventory),
        )
        watching.beats = False
        _hold(watching, fleet, survey.runs, run_id)
        _carry_counts(watching, survey.runs)
        _catch_up(watching, survey.runs)
        view.step(f"attached to run {run_id}: {_owner(survey.runs)}; Ctrl-C leaves it running")
        try:
            watching.until_done()
        except RestartJob as decision:  # restart-job with nobody to apply it (keeper = false)
            raise JobFailed(
                f"{decision.cause}, and nothing restarts the job: run {run_id} is detached "
                "without a keeper (keeper = false)",
                hint=f"tfdeploy logs {run_id} shows why; tfdeploy down {run_id} stops the rest",
            ) from None
        ended = survey_runs(fleet, found)
        keep_ended(fleet, ended.runs, ended.failures)  # the history learns its end


def _plan_of(target: Target, runs: list[HostRun]) -> Plan:
    """The inventory's plan, which must name the run's tasks: one changed since the run
    started would watch tasks the hosts never ran (and wait for them forever)."""
    plan = make_plan(target.inventory)
    running = {t.name for r in runs for t in r.tasks}
    missing = [t.name for t in plan.tasks if t.name not in running]
    if running and missing:
        raise UsageError(
            f"{target.inventory.path} now plans {join_names(missing)}, which run "
            f"{target.run_id} does not have: the inventory changed since the run started",
            hint="attach with the inventory the run was started from: -i FILE",
        )
    return plan


def _hold(watching: Watch, fleet: Fleet, runs: list[HostRun], run_id: str) -> None:
    """Who restarts, and how attach asks whether they still live: the run's keeper (its
    warden answers on every host), the `up` whose lease is live, or nobody (detached)."""
    kept = [r.host for r in runs if r.kept]
    leased = [r.host for r in runs if r.leased]
    if kept:
        watching.keeper_alive = _asks(fleet.member(kept[0]), run_id, "kept")
        watching.holder_guard = holder_guard([fleet.member(h) for h in kept], run_id)
    elif leased:
        watching.keeper_alive = _asks(fleet.member(leased[0]), run_id, "leased")
        watching.holder = "its `up`"


def _owner(runs: list[HostRun]) -> str:
    if any(r.kept for r in runs):
        return "its keeper holds its failure policy"
    if any(r.leased for r in runs):
        return "the `up` that started it holds its failure policy"
    return "detached, with no failure policy (a failed task is not restarted)"


def _asks(member: Member, run_id: str, field: str) -> Callable[[], bool | None]:
    """Whether the run is still held there (`kept` or `leased`): None when the host cannot be
    asked now."""

    def alive() -> bool | None:
        try:
            runs = member.agent.runs()
        except HostError:
            return None
        return any(r["run_id"] == run_id and r.get(field) for r in runs)

    return alive


def _carry_counts(watching: Watch, runs: list[HostRun]) -> None:
    """The run's restarts so far, as its hosts and its keeper recorded them: the attempt (the
    keeper's newest whole-job restart) and each task's restarts, so what attach says of the
    next one ("restart 2 of 3", `[attempt 2]`) is the run's count, not one from zero."""
    attempt = max((x.attempt for r in runs for x in r.recoveries), default=0)
    for status in (t for r in runs for t in r.tasks):
        if status.name in watching.board.watches:
            task = watching.board[status.name]
            task.attempt, task.restarts = attempt, status.restarts


def _catch_up(watching: Watch, runs: list[HostRun]) -> None:
    """Each task's log from its start, or its last CATCH_UP_BYTES, said where cut."""
    for status in (t for r in runs for t in r.tasks):
        if status.name not in watching.board.watches or status.log_bytes <= CATCH_UP_BYTES:
            continue
        task = watching.board[status.name]
        task.offset = status.log_bytes - CATCH_UP_BYTES
        skipped = task.offset / 1e6
        watching.view.step(
            f"{task.label}: its first {skipped:.1f} MB of output skipped "
            f"(tfdeploy logs {watching.run_id} --task {status.name} has all of it)"
        )


def _nobody_restarts(run_id: str) -> Callable[[str], None]:
    """A detached run kept by no keeper (keeper = false): its policy has nobody to apply it."""

    def restart(name: str) -> None:
        raise JobFailed(
            f"{name} of run {run_id} failed, and nothing restarts it: the run is detached "
            "without a keeper (keeper = false)",
            hint=f"tfdeploy logs {run_id} --task {name} shows why; tfdeploy down {run_id} "
            "stops the rest",
        )

    return restart


def attach_run(
    name: str,
    view: View,
    *,
    inventory: str | None = None,
    say: Callable[[str], None] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> None:
    """`tfdeploy attach`: `name` is a run id (found as `logs` finds it) or an inventory file
    (its job's newest run on the hosts, said through `say`). The view is closed on return;
    an interruption says the run goes on, then propagates (exit 130, 143)."""
    target = newest_run(resolve(name, inventory), "attach", say or (lambda _: None))
    shown = events_to(view)
    try:
        watch_run(target, shown, concurrency=concurrency)
    except KeyboardInterrupt:
        shown.step(f"left run {target.run_id} running: tfdeploy down {target.run_id} stops it")
        raise
    finally:
        shown.close()
