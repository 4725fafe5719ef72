"""Acting on the failure policies' decisions (board.py decides): one task again ("restart"),
or every task again from its last checkpoint ("restart-job", TensorFlow's own fault tolerance).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from deployer.config.model import Job
from deployer.config.plan import Plan
from deployer.core.errors import HostError, JobFailed
from deployer.core.secrets import mask_text
from deployer.core.text import plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.reply_types import StopReport, escaped_text
from deployer.hosts.task_runtime import TaskRuntime
from deployer.up.start import start_request
from deployer.watch.board import TaskBoard
from deployer.watch.view import Display

MAX_BACKOFF_S = 300.0  # restart_backoff doubles per attempt up to this


class StopFailed(JobFailed):
    """A whole-job restart could not stop the attempt's tasks on some host."""


def backoff_s(job: Job, attempt: int) -> float:
    """Seconds before attempt `attempt` (1 for the first restart): restart_backoff, doubling."""
    return min(job.restart_backoff * 2.0 ** (attempt - 1), MAX_BACKOFF_S)


def restart_task(
    fleet: Fleet,
    board: TaskBoard,
    view: Display,
    plan: Plan,
    run_id: str,
    forwarded: Mapping[str, str],
    name: str,
    runtime: TaskRuntime | None = None,
) -> None:
    """Same command, same TF_CONFIG, same host and port: PSS picks a restarted worker up."""
    watch = board[name]
    member = fleet.member(watch.task.host)
    outcome = watch.status.outcome() if watch.status else "failed"
    watch.restarts += 1
    view.step(
        f"restarting {watch.label} ({outcome}): restart {watch.restarts} of {plan.job.max_restarts}"
    )
    try:
        request = start_request(
            watch.task,
            member.agent,
            run_id,
            forwarded,
            board.attempt,
            member.host.interruption_url,
            runtime,
        )
        statuses = member.agent.start(run_id, [request], plan.job.stop_grace)
    except HostError as exc:
        raise JobFailed(
            f"restarting {watch.label} failed: {exc.cause}",
            hint=f"the other tasks were stopped; its log: tfdeploy logs {run_id} --task {name}",
        ) from None
    board.update(statuses)


def stop_attempt(
    fleet: Fleet, board: TaskBoard, lost: Collection[str], run_id: str, job: Job
) -> list[str]:
    """Stops every started task of the attempt, and what escaped them, by name: the run itself
    stays startable. Returns what to report; a host where the stop failed ends the job, since a
    task that may still run must not meet its own restart."""
    started: dict[str, list[str]] = {}
    for name, watch in board.watches.items():
        if watch.status is not None and watch.task.host not in lost:
            started.setdefault(watch.task.host, []).append(name)

    def stop(member: Member) -> StopReport:
        names = started[member.name]
        return member.agent.stop(run_id, grace=job.stop_grace, tasks=names, escaped=True)

    reports, failures = fleet.each_settled(stop, [fleet.member(h) for h in started])
    if failures:
        lines = "\n".join(f"  {f.message}" for f in failures)
        raise StopFailed(
            "the job was not restarted: stopping its tasks failed on "
            f"{plural(len(failures), 'host')}:\n{lines}",
            hint=f"check with `tfdeploy status {run_id}`",
        )
    hide = functools.partial(mask_text, env=job.env, extra=job.secret_env)
    return list(stop_lines(reports, [], hide))


def stop_lines(
    reports: Mapping[str, StopReport], failures: Sequence[HostError], hide: Callable[[str], str]
) -> Iterator[str]:
    """What a stop has to tell: processes that had escaped their task, hosts it failed on."""
    for host, report in sorted(reports.items()):
        if report.escaped:
            yield f"{host}: {escaped_text(report.escaped, hide)}"
    for failure in failures:
        yield f"could not stop the run on {failure.message}"
