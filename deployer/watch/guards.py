"""The run's guards on the controller (docs/up.md, "Guards"): an attached `up` that holds its run
itself applies them at every tick (remote/guards.py's rules, on the live view's GPU numbers),
and a watch of a run its keeper holds (an attached kept run, `attach`) asks the keeper's host
why the keeper stopped it, to say so and end with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from deployer.config.plan import Plan
from deployer.core.errors import HostError, JobFailed
from deployer.hosts.fleet import Member
from deployer.hosts.gpus import GpuMonitor
from deployer.hosts.replies import text
from deployer.watch.board import TaskBoard
from remote import protocol
from remote.guards import Guards


class GuardStopped(JobFailed):
    """A guard stopped the run on purpose: its cost reached max_cost, or its GPUs sat idle.
    Not a task's failure: the run's outcome is `stopped`, its artifacts come home as at any
    end, and `up --resume` continues it. Exit status 1: the job did not finish."""

    def __init__(self, run_id: str, why: str, *, by: str = "") -> None:
        who = f" by {by}" if by else ""
        super().__init__(
            f"run {run_id} was stopped{who}: {why}",
            hint=f"every task was stopped; after raising the guard in the inventory, "
            f"`tfdeploy up INVENTORY --resume {run_id}` continues the run",
        )
        self.why = why


def verdict(guards: Guards, now: float, monitor: GpuMonitor | None, plan: Plan) -> str | None:
    """Why the run's own guards stop it `now` (on the watch's clock), or None."""
    said = guards.look(now, samples(monitor), run_gpus(plan))
    return None if said is None else said[1]


def holder_words(board: TaskBoard, ask: Callable[[], str | None] | None) -> str | None:
    """Why the keeper's guard stopped the run, once tasks show stopped (asked of its host then
    only: `down` stops tasks too, and the rules say that as before); None otherwise."""
    stopped = any(
        w.status is not None and w.status.reason == protocol.REASON_STOPPED
        for w in board.watches.values()
    )
    return ask() if stopped and ask is not None else None


def run_gpus(plan: Plan) -> list[tuple[str, int]]:
    """Every GPU the run's tasks were given: (host, index)."""
    return [(t.host, i) for t in plan.tasks for i in t.gpus]


def samples(monitor: GpuMonitor | None) -> dict[str, dict[int, float]]:
    """The live view's last GPU numbers (deployer/hosts/gpus.py, every 3 s): host -> GPU index
    -> utilization. A host it does not ask has none, and the idle window counts no time."""
    if monitor is None:
        return {}
    return {
        host: {g.index: float(g.utilization) for g in report.gpus if g.utilization is not None}
        for host, report in monitor.reports.items()
        if host in monitor.hosts
    }


def holder_guard(members: Sequence[Member], run_id: str) -> Callable[[], str | None]:
    """Asks the run's hosts why its keeper's guard stopped it (the runs op's `guard_stop`, on
    the keeper's host): the words, or None when none did or no host can be asked now."""

    def said() -> str | None:
        for member in members:
            try:
                runs = member.agent.runs()
            except HostError:
                continue
            for run in runs:
                why = run.get("guard_stop") if run["run_id"] == run_id else None
                if isinstance(why, str):
                    return text(why)[:300]
        return None

    return said
