"""Handing a detached run to its keeper, so its failure policy outlives the controller.

`up --detach` of a job whose policy restarts (on_failure = "restart" or "restart-job") must not
leave that policy in a terminal that is about to close: every host starts a warden of the run
(remote/warden.py) on its cluster address, and the first host starts the run's keeper
(remote/keeper.py) with the plan, the policy and every warden's port. From then on the keeper's
polls are the run's heartbeat (the lease stays on: if the keeper's host dies, the others stop
the run), it restarts what the policy says, and it ends the run when the job is done. The
wardens answer only the keeper, proved with a secret made here for this run and sent over SSH.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from deployer.config.model import FailurePolicy
from deployer.config.plan import Plan
from deployer.config.roles import role
from deployer.core.errors import HostError, HostsFailed
from deployer.core.text import plural
from deployer.hosts.fleet import Fleet, Member
from deployer.up.start import start_groups

KEEP_INTERVAL_S = 1.0  # how often the keeper polls every warden (and renews the lease)


def kept(plan: Plan) -> bool:
    """Whether a detached run of `plan` is handed to a keeper: its policy restarts."""
    return plan.job.on_failure in (FailurePolicy.RESTART, FailurePolicy.RESTART_JOB)


def hand_over(fleet: Fleet, members: Sequence[Member], plan: Plan, run_id: str) -> str:
    """Starts the wardens and the keeper; returns the keeper's host. A host that cannot start
    its warden fails the `up` (its teardown stops the run): half a kept run is no kept run."""
    secret = secrets.token_hex(32)
    idle = 2 * plan.job.lease_seconds + 60

    def warden(member: Member) -> int:
        return member.agent.keep_warden(run_id, secret, member.host.tf_address, idle)

    ports, failures = fleet.each_settled(warden, members)
    keeper = members[0]
    if not failures:
        try:
            keeper.agent.keep(run_id, secret, keeper_plan(plan, members, ports))
        except HostError as exc:
            failures = [exc]
    if failures:
        started = f"{plural(len(plan.tasks), 'task')} of run {run_id} had started, and were stopped"
        raise HostsFailed(
            failures,
            what="handing the run to its keeper failed",
            outcome=f"{started} (a detached run whose policy restarts needs its keeper)",
        )
    return keeper.name


def keeper_plan(plan: Plan, members: Sequence[Member], ports: Mapping[str, int]) -> dict[str, Any]:
    """The run as the keeper reads it (docs/PROTOCOL.md, `keep`)."""
    job = plan.job
    waves = {t.name: i for i, group in enumerate(start_groups(plan)) for t in group}
    return {
        "hosts": [
            {"name": m.name, "address": m.host.tf_address, "port": ports[m.name]} for m in members
        ],
        "tasks": [
            {
                "name": t.name,
                "host": t.host,
                "awaited": t.awaited,
                "serves": t.serves,
                "evaluator": role(t.role).finishes_after,
                "restartable": role(t.role).restartable_alone,
                "wave": waves.get(t.name, 0),
                "port": t.port,
            }
            for t in plan.tasks
        ],
        "policy": {
            "on_failure": str(job.on_failure),
            "max_restarts": job.max_restarts,
            "restart_backoff": job.restart_backoff,
            "retry_exit_codes": list(job.retry_exit_codes or ()),
            "stop_grace": job.stop_grace,
            "evaluator_grace": job.evaluator_grace,
        },
        "attempt": 0,
        "interval": KEEP_INTERVAL_S,
        "loss_after": job.lease_seconds,
    }
