"""`up --resume RUN`: a run that ended early opened again on this host, under its own id.

The hello of a resuming `up` checks here that the run can be resumed (its folder is here, of
the same job, nothing of it runs, no keeper holds it; its reservation refuses another `up` of
the run holding its ports), and once its ports are reserved, lifts the whole-run stop marker
that `down` or a teardown left: from then on the run is its `up`'s again, as any run is from
its preflight on, and its tasks start again in their own folders (checkpoints, logs) with the
next TFDEPLOY_ATTEMPT.
"""

from __future__ import annotations

from pathlib import Path

import layout
import params
import procs
import protocol


def check(workdir: Path, run_id: str, job: str | None) -> int:
    """Raises AgentError when the run cannot be resumed here; else its last attempt here (the
    highest TFDEPLOY_ATTEMPT its tasks were started with). Changes nothing."""
    run_dir = layout.runs_dir(workdir) / run_id
    meta = layout.read_json(run_dir / "run.json")
    if not isinstance(meta, dict):
        raise params.AgentError(
            f"there is no run {run_id!r} of this host in {workdir} to resume", protocol.FAIL_NO_RUN
        )
    if job is not None and meta.get("job") != job:
        raise params.AgentError(f"run {run_id} is of job {meta.get('job')!r}, not {job!r}")
    import kept  # only a resume pays for its imports

    if kept.alive(workdir, run_id):
        raise params.AgentError(f"run {run_id} is kept by its keeper here: it is not over")
    # Another `up` of the run holding its ports here is refused by the reservation itself,
    # under its lock (reservations.reserve): a check here and a reserve after would race.
    attempt = 0
    for task_dir in layout.task_dirs(run_dir):
        if procs.task_state(task_dir)[0] in (protocol.STATE_RUNNING, protocol.STATE_STARTING):
            raise params.AgentError(f"task {task_dir.name} of run {run_id} is still running")
        attempt = max(attempt, _attempt(task_dir))
    return attempt


def reopen(workdir: Path, run_id: str) -> None:
    """The run's stop marker lifted (under the run's lock, as stops write it): its code, setup
    and tasks are accepted again. Its tasks' own records stay until each starts again."""
    run_dir = layout.runs_dir(workdir) / run_id
    with layout.run_lock(run_dir):
        (run_dir / "stop").unlink(missing_ok=True)


def _attempt(task_dir: Path) -> int:
    """The TFDEPLOY_ATTEMPT the task was last started with (its recorded spec), 0 if none or
    damaged: ASCII digits below 10**6, as a keeper's relaunch takes (`"²".isdigit()`, and
    int() of it raises)."""
    spec = layout.read_json(task_dir / "spec.json")
    env = spec.get("env") if isinstance(spec, dict) else None
    value = env.get(protocol.ATTEMPT_ENV) if isinstance(env, dict) else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 6:
        return int(value)
    return 0
