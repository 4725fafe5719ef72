"""Handing a run to its keeper, so its failure policy outlives the controller.

`up --detach` of a job whose policy restarts (on_failure = "restart" or "restart-job") must not
leave that policy in a terminal that is about to close, and an attached `up` must not lose it
to a laptop that sleeps or an `up` that is killed (kept_attached): every host starts a warden of
the run (remote/warden.py) on its cluster address, and the first host starts the run's keeper
(remote/keeper.py) with the plan, the policy and every warden's port. From then on the keeper's
polls are the run's heartbeat (the lease stays on: if the keeper's host dies, the others stop
the run), it restarts what the policy says, applies the run's guards (max_cost and
gpu_idle_stop, priced and armed by up/guards.py), and it ends the run when the job is done. The
wardens answer only the keeper, proved with a secret made here for this run and sent over SSH.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deployer.config.model import FailurePolicy
from deployer.config.plan import Plan
from deployer.config.roles import role
from deployer.core.errors import HostError, HostsFailed
from deployer.core.text import plural
from deployer.hosts.fleet import Fleet, Member
from deployer.up.notifying import notify_config
from deployer.up.start import start_groups

KEEP_INTERVAL_S = 1.0  # how often the keeper polls every warden (and renews the lease)


def kept(plan: Plan) -> bool:
    """Whether a detached run of `plan` is handed to a keeper: every one is, unless the job
    says `keeper = false`. A teardown job needs one too: someone must stop its ps servers and
    evaluators when its workers are done, and every task when one fails."""
    return plan.job.keeper


def restarts(plan: Plan) -> bool:
    return plan.job.on_failure in (FailurePolicy.RESTART, FailurePolicy.RESTART_JOB)


def kept_attached(plan: Plan) -> bool:
    """Whether an attached `up` of `plan` hands its run to a keeper too: its policy restarts
    and its hosts are the inventory's own. Where a source can replace a lost host (EC2) or
    regain a requeued allocation (Slurm), the attached `up` keeps the policy itself: only the
    controller can launch or allocate (the keeper cannot yet, docs/up.md)."""
    return kept(plan) and restarts(plan) and not plan.inventory.sources


def keeper_alive(member: Member, run_id: str) -> Callable[[], bool | None]:
    """Asks the keeper's host whether the run's keeper (or its warden) still lives there:
    True, False, or None when the host cannot be asked now."""

    def alive() -> bool | None:
        try:
            runs = member.agent.runs()
        except HostError:
            return None
        return any(r["run_id"] == run_id and r.get("kept") for r in runs)

    return alive


def hand_over(
    fleet: Fleet,
    members: Sequence[Member],
    plan: Plan,
    run_id: str,
    attempt: int = 0,
    *,
    guards: Mapping[str, Any] | None = None,
) -> str:
    """Starts the wardens and the keeper; returns the keeper's host. A host that cannot start
    its warden fails the `up` (its teardown stops the run): half a kept run is no kept run.
    `attempt`: the run's attempt now (a resumed run's), which the keeper's restarts follow;
    `guards`: the run's guards as they stand now (remote/guards.py Guards.plan)."""
    secret = secrets.token_hex(32)
    idle = 2 * plan.job.lease_seconds + 60

    def warden(member: Member) -> int:
        return member.agent.keep_warden(run_id, secret, member.host.tf_address, idle)

    ports, failures = fleet.each_settled(warden, members)
    keeper = members[0]
    if not failures:
        try:
            told = keeper_plan(plan, members, ports, attempt, guards=guards)
            keeper.agent.keep(run_id, secret, told)
        except HostError as exc:
            failures = [exc]
    if failures:
        started = f"{plural(len(plan.tasks), 'task')} of run {run_id} had started, and were stopped"
        raise HostsFailed(
            failures,
            what="handing the run to its keeper failed",
            outcome=f"{started} (a detached run needs its keeper; keeper = false runs without one)",
        )
    return keeper.name


def keeper_plan(
    plan: Plan,
    members: Sequence[Member],
    ports: Mapping[str, int],
    attempt: int = 0,
    *,
    guards: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run as the keeper reads it (docs/PROTOCOL.md, `keep`); `guards`: max_cost's
    numbers and gpu_idle_stop's, which the keeper applies from now on (each task's `gpus` say
    which GPUs are the run's)."""
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
                "gpus": list(t.gpus),
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
        "attempt": attempt,
        "job": job.name,
        "notify": notify_config(job.notify),
        "interval": KEEP_INTERVAL_S,
        "loss_after": job.lease_seconds,
        **({"guards": dict(guards)} if guards else {}),
    }
