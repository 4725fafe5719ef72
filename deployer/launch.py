"""What starting a task means: TF's start order, and the request each task is started with."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from deployer.agent import Agent
from deployer.board import server_like
from deployer.plan import Plan, Task
from remote import protocol


def start_groups(plan: Plan) -> list[list[Task]]:
    """ps and servers first, then workers, then the chief and evaluators.

    TF clients block on servers that are not up yet, and a PSS chief blocks until every server
    answers; starting in this order makes each group's wait short and a late server visible.
    """
    servers = [t for t in plan.tasks if server_like(t)]
    workers = [t for t in plan.tasks if t.role == "worker" and not server_like(t)]
    last = [t for t in plan.tasks if t.role in ("chief", "evaluator") and not server_like(t)]
    return [group for group in (servers, workers, last) if group]


def by_host(tasks: list[Task]) -> dict[str, list[Task]]:
    grouped: dict[str, list[Task]] = {}
    for task in tasks:
        grouped.setdefault(task.host, []).append(task)
    return grouped


def start_request(
    task: Task, agent: Agent, run_id: str, forwarded: Mapping[str, str]
) -> dict[str, object]:
    """The `start` entry for one task: its command, and an env made only of what the plan and
    job.forward_env name (never the controller's environment implicitly)."""
    command = task.command
    if task.is_server:
        server = f"{agent.agent_dir}/tfserver.py"
        command = f"exec {shlex.quote(agent.python)} {shlex.quote(server)}"
    request: dict[str, object] = {
        "name": task.name,
        "command": command,
        "env": {**forwarded, **task.env, protocol.RUN_ID_ENV: run_id},
    }
    if task.cpus is not None:
        request["cpus"] = task.cpus  # the supervisor pins the task before exec
    return request
