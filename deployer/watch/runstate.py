"""The run being carried out, shared by the board, the poller and the watch loop.

One object instead of copies: when the plan changes (GPU counts learnt at preflight, a host
replaced under restart-job), `replan` swaps the plan and the task board here, and every reader
sees the new ones at its next look.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from deployer.config.model import Host
from deployer.config.plan import Plan
from deployer.hosts.task_runtime import TaskRuntime
from deployer.watch.board import TaskBoard


@dataclass
class RunState:
    run_id: str
    plan: Plan
    clock: Callable[[], float] = time.monotonic
    board: TaskBoard = field(init=False)
    # What each task runs in, by name (up/environment.py and up/images.py decide it); every
    # start of the task, restarts included, sends it.
    runtimes: dict[str, TaskRuntime] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.board = TaskBoard(self.plan.tasks)

    def replan(self, hosts: Iterable[Host], *, moved: Iterable[str] = ()) -> Plan:
        """The plan again, over `hosts` (the re-plan the rare callers use); see `adopt`."""
        return self.adopt(self.plan.with_hosts(hosts), moved=moved)

    def adopt(self, plan: Plan, *, moved: Iterable[str] = ()) -> Plan:
        """Carries out `plan` from now on; tasks keep their board state (log offsets, attempts,
        restarts), except those on `moved` hosts, whose logs start afresh."""
        if plan is self.plan:
            return plan
        previous = self.board
        self.plan = plan
        self.board = TaskBoard(plan.tasks)
        moved_tasks = {t.name for h in moved for t in plan.tasks_on(h)}
        self.board.carry_over(previous, moved=moved_tasks)
        return plan


class OnRun:
    """What the poller and the watch loop read of the run: the one shared RunState, no copy."""

    run: RunState

    @property
    def plan(self) -> Plan:
        return self.run.plan

    @property
    def board(self) -> TaskBoard:
        return self.run.board

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def clock(self) -> float:
        return self.run.clock()
