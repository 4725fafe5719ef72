"""`up --resume RUN`: a run that ended early continued under its own id (issue 59).

Before anything else the inventory's hosts are asked for the run (read-only, as `status` asks
them), and a run that cannot be resumed is refused with the reason, nothing started anywhere:
not on these hosts, of another job, still running or kept, succeeded, or of another plan (a
task added, gone or moved to another host: its TF_CONFIG would not be the run's). Then preflight
runs as for any `up`, and each host's hello reopens the run's folder (remote/resume.py) and says
the run's last attempt there. Every task then starts again in its own folder, with the next
TFDEPLOY_ATTEMPT, so a checkpoint it left inside the run is there to resume from; its log goes
on where it stopped, and the local history keeps one run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from deployer.config.plan import Plan
from deployer.core.errors import HostsFailed, TfdeployError, UsageError
from deployer.core.text import join_names
from deployer.hosts.fleet import Fleet
from deployer.results import runstore
from deployer.results.archive import LogArchive
from deployer.results.runs import HostRun, Target, survey_runs, sync_archive
from deployer.up.records import Lineage
from deployer.watch.board import TaskBoard
from deployer.watch.view import Display
from remote import protocol
from remote.protocol import HelloReply


class ResumeRefused(UsageError):
    """`up --resume RUN` of a run that cannot be resumed: nothing was started (exit 2)."""


@dataclass(frozen=True)
class Resumable:
    """A run found on its hosts, ended early, of this plan: where `up --resume` goes on."""

    run_id: str
    began: float  # when the run was first created on its hosts: the local history's start
    log_bytes: Mapping[str, int]  # each task's log size: the view goes on from there


def look_for(
    fleet: Fleet, plan: Plan, run_id: str, archive: LogArchive, view: Display
) -> Resumable:
    """The run to resume, found on the hosts and checked before any preflight (a refusal
    starts nothing, changes nothing), its earlier logs copied into the local archive."""
    view.step(f"looking for run {run_id} on the hosts, to resume it")
    found = find(fleet, plan, run_id)
    warning = copy_earlier_logs(fleet, found, archive)
    if warning:
        view.step(f"warning: {warning}; `tfdeploy logs {run_id}` reads the hosts")
    return found


def go_on(
    found: Resumable,
    facts: Mapping[str, HelloReply],
    board: TaskBoard,
    archive: LogArchive,
) -> Lineage:
    """The hosts reopened the run (preflight's hellos said its attempts): its tasks go on at
    the next attempt, its log and local history go on (one run, first begun when it was)."""
    attempt = next_attempt(facts)
    carry_on(board, found, attempt)
    lineage = Lineage(found.began, tuple(resumes(found.run_id, attempt)))
    archive.reopen()  # `logs` asks the hosts again until this `up` ends it
    return lineage


def resuming(run_id: str, attempt: int) -> str:
    """What `up` says once the run goes on."""
    return (
        f"resuming run {run_id} at attempt {attempt} (TFDEPLOY_ATTEMPT={attempt}): "
        "every task starts again in its own folder of the run"
    )


def find(fleet: Fleet, plan: Plan, run_id: str) -> Resumable:
    """The run on the inventory's hosts, checked; raises ResumeRefused saying why not, or
    HostsFailed when a host cannot be asked (a run half seen is not judged)."""
    target = Target(plan.inventory, run_id)
    survey = survey_runs(fleet, target)
    if survey.failures:
        raise HostsFailed(
            survey.failures, what="looking for the run failed", outcome="nothing was started"
        )
    if not survey.runs:
        raise ResumeRefused(
            f"cannot resume: {survey.nothing_found(target)}",
            hint=f"`tfdeploy runs` lists this machine's runs; {_again(plan)}",
        )
    return judge(survey.runs, plan, run_id)


def judge(runs: list[HostRun], plan: Plan, run_id: str) -> Resumable:
    """The run as its hosts reported it (each host's share), judged against the plan: the
    refusal that applies first (its job, running or kept, its tasks, its success)."""
    again = _again(plan)
    _refuse_other_job(runs, plan, again)
    _refuse_active(runs, run_id)
    _refuse_other_plan(runs, plan, again)
    _refuse_succeeded(runs, plan, again)
    return Resumable(
        run_id,
        min(r.created for r in runs),
        {t.name: t.log_bytes for r in runs for t in r.tasks},
    )


def _again(plan: Plan) -> str:
    return f"`tfdeploy up {plan.inventory.path}` starts a new run"


def _refuse_other_job(runs: list[HostRun], plan: Plan, again: str) -> None:
    other = next((r.job for r in runs if r.job != plan.job.name), None)
    if other is not None:
        raise ResumeRefused(
            f"cannot resume run {runs[0].run_id}: it is a run of job {other!r}, and this "
            f"inventory's job is {plan.job.name!r}",
            hint=f"resume it with its own inventory; {again}",
        )


def _refuse_active(runs: list[HostRun], run_id: str) -> None:
    """Still running, kept by its keeper (between two attempts), or held by its `up`."""
    if any(r.active or r.leased for r in runs):
        how = "kept by its keeper" if any(r.kept for r in runs) else "running"
        raise ResumeRefused(
            f"cannot resume run {run_id}: it is still {how}",
            hint=f"`tfdeploy down {run_id}` stops it; then `up --resume {run_id}` resumes it",
        )


def _refuse_other_plan(runs: list[HostRun], plan: Plan, again: str) -> None:
    """Every task of the run where the plan puts it, and no other: a task added, gone or moved
    would change the cluster the run's tasks (and their checkpoints) were made for."""
    ran = {t.name: r.host for r in runs for t in r.tasks}
    planned = {t.name: t.host for t in plan.tasks}
    differences = [
        *(f"{n} is not in the run" for n in planned if n not in ran),
        *(f"{n} of the run is not in the plan" for n in ran if n not in planned),
        *(
            f"{n} ran on {ran[n]}, the plan puts it on {h}"
            for n, h in planned.items()
            if n in ran and ran[n] != h
        ),
    ]
    if differences:
        raise ResumeRefused(
            f"cannot resume run {runs[0].run_id}: the inventory's plan no longer matches its "
            f"tasks: {join_names(differences[:8])}"
            + (f" and {len(differences) - 8} more" if len(differences) > 8 else ""),
            hint=again,
        )


def _refuse_succeeded(runs: list[HostRun], plan: Plan, again: str) -> None:
    """Every awaited task exited 0 by itself: the job is done, nothing to resume."""
    statuses = {t.name: t for r in runs for t in r.tasks}
    awaited = [statuses[t.name] for t in plan.tasks if t.awaited and t.name in statuses]
    if awaited and all(s.succeeded and s.reason == protocol.REASON_EXITED for s in awaited):
        raise ResumeRefused(
            f"cannot resume run {runs[0].run_id}: it succeeded, there is nothing to resume",
            hint=again,
        )


def next_attempt(facts: Mapping[str, HelloReply]) -> int:
    """One more than the run's last attempt on any host (each resuming hello says its own)."""
    said = [f.get("attempt") for f in facts.values()]
    return 1 + max((a for a in said if isinstance(a, int)), default=0)


def resumes(run_id: str, attempt: int) -> list[dict[str, float]]:
    """The run's resumes as its local facts keep them (`runs` says it was resumed): those an
    earlier `up --resume` recorded here, and this one."""
    return [*runstore.resumes(run_id), {"at": round(time.time(), 3), "attempt": attempt}]


def copy_earlier_logs(fleet: Fleet, found: Resumable, archive: LogArchive) -> str | None:
    """The local archive made whole up to where the run stopped (a detached run's log never
    came here), so the resumed attempt's bytes follow on. It only reads the hosts, so it runs
    before preflight: a copy of up to 128 MiB a task must not hold the ports the resuming
    hellos reserve. What could not be copied is a warning: the archive is a convenience, the
    logs stay on the hosts."""
    if all(archive.size(name) >= size for name, size in found.log_bytes.items()):
        return None
    try:
        sync_archive(fleet, found.run_id, archive)
    except (TfdeployError, OSError) as exc:
        return f"the run's earlier logs did not all come into the local archive ({exc})"
    return None


def carry_on(board: TaskBoard, found: Resumable, attempt: int) -> None:
    """The board goes on where the run stopped: each task's next attempt, its log from the
    size it had (the lines before are the run's, `logs` has them), its metrics from where
    this machine read them to (its archive's offsets; 0 when it read none)."""
    read = runstore.read_offsets(found.run_id)  # a damaged offset is none: read from 0
    for name, watch in board.watches.items():
        watch.attempt = attempt
        watch.offset = found.log_bytes.get(name, 0)
        if name in read:
            watch.series.offset = read[name]
