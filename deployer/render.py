"""Static renderings for people and scripts: the plan as a rich table and as one JSON document."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from deployer.plan import Plan, Task
from deployer.runs import HostRun
from deployer.secrets import masked


def _gpu_text(task: Task, auto: bool = False) -> str:
    if auto and not task.gpus and task.role != "ps":
        return "auto"  # counted by nvidia-smi at preflight, then split as the README says
    return ",".join(str(g) for g in task.gpus) or "-"


def _auto_hosts(plan: Plan) -> set[str]:
    return {h.name for h in plan.inventory.hosts if h.gpus_auto}


def instances_table(plan: Plan) -> Table:
    """The EC2 instances that [aws] discovery found, in host order."""
    from deployer.aws import instance_rows

    table = Table(title=f"{len(plan.inventory.instances)} EC2 instances (running, from [aws])")
    for column in ("instance", "Name", "type", "zone", "private IP", "public IP", "group"):
        table.add_column(column, overflow="fold")
    for row in instance_rows(plan.inventory.instances):
        table.add_row(*(Text(cell) for cell in row))
    return table


def plan_table(plan: Plan) -> RenderableType:
    """One row per task, then the TF_CONFIG each task gets (secrets masked)."""
    job = plan.job
    table = Table(title=f"job {job.name}: {len(plan.tasks)} tasks on {len(plan.hosts)} hosts")
    for column in ("task", "host", "address", "GPUs", "command"):
        table.add_column(column, overflow="fold")
    auto = _auto_hosts(plan)
    for task in plan.tasks:
        address = task.endpoint if task.port is not None else f"{task.address} (no server)"
        gpus = _gpu_text(task, task.host in auto)
        # Text, not str: addresses come from the inventory and rich would parse "[...]" as markup.
        table.add_row(task.name, task.host, Text(address), gpus, Text(task.command))
    configs = Text()
    for task in plan.tasks:
        configs.append(f"{task.name:<12}", style="bold")
        configs.append(f" TF_CONFIG={task.env['TF_CONFIG']}\n")
    parts: list[RenderableType] = [instances_table(plan)] if plan.inventory.instances else []
    return Group(*parts, table, Text("TF_CONFIG per task", style="bold underline"), configs)


def plan_document(plan: Plan) -> dict[str, Any]:
    job = plan.job
    secret = job.secret_env
    auto = _auto_hosts(plan)
    return {
        "job": {
            "name": job.name,
            "code": str(job.code),
            "command": job.command,
            "python": job.python,
            "workdir": job.workdir,
            "port": job.port,
            "setup": list(job.setup),
            "env": masked(job.env, secret),
            "cluster": plan.cluster,
        },
        "tasks": [
            {
                "role": t.role,
                "index": t.index,
                "host": t.host,
                "address": t.address,
                "port": t.port,
                "gpus": list(t.gpus),
                "command": t.command,
                "env": masked(t.env, secret),
                # gpus = "auto": the GPUs are counted by nvidia-smi at preflight
                **({"gpus_auto": True} if t.host in auto else {}),
            }
            for t in plan.tasks
        ],
        **_instances_document(plan),
    }


def _instances_document(plan: Plan) -> dict[str, Any]:
    if not plan.inventory.instances:
        return {}
    return {
        "instances": [
            {
                "id": i.id,
                "name": i.name,
                "type": i.type,
                "zone": i.zone,
                "private_ip": i.private_ip,
                "public_ip": i.public_ip,
                "launched": i.launched.isoformat(),
                "group": i.group,
            }
            for i in plan.inventory.instances
        ],
    }


def plan_json(plan: Plan) -> str:
    return json.dumps(plan_document(plan), indent=2)


def status_table(runs: Sequence[HostRun]) -> RenderableType:
    table = Table(title="runs on the hosts, newest first")
    table.add_column("run", no_wrap=True)
    for column in ("task", "host", "state", "pid", "started", "restarts", "outcome"):
        table.add_column(column, overflow="fold")
    for r in runs:
        for t in r.tasks:
            started = time.strftime("%H:%M:%S", time.localtime(t.started)) if t.started else "-"
            table.add_row(
                r.run_id,
                t.name,
                r.host,
                t.state,
                str(t.pid or "-"),
                started,
                str(t.restarts),
                t.outcome() if t.finished else "",
            )
    return table


def status_json(runs: Sequence[HostRun]) -> str:
    return json.dumps(
        {
            "runs": [
                {
                    "run_id": r.run_id,
                    "host": r.host,
                    "job": r.job,
                    "created": r.created,
                    "detached": r.detached,
                    "tasks": [t.__dict__ for t in r.tasks],
                }
                for r in runs
            ]
        },
        indent=2,
    )
