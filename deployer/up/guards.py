"""The run's guards armed by `up`: `[aws] max_cost` priced once its hosts are known, and
`[job] gpu_idle_stop`, before anything starts (docs/up.md, "Guards").

The rules are remote/guards.py's, shared with the keeper. This module does what only the
controller can: it asks AWS (through the pricing registry, deployer/sources/costs.py) what the
run's instances cost so far and what they cost an hour, once; from there the cost is that rate
times the time passed, on this machine's clock or, once the run is handed over, the keeper's.
A cap that cannot be kept is refused here, nothing started: a run whose cost cannot be known,
or a detached one that nobody would hold.
"""

from __future__ import annotations

import time
from decimal import Decimal

from deployer.config.plan import Plan
from deployer.core.errors import InventoryError, UsageError
from deployer.sources import costs
from deployer.sources.costs import RunCost, Span
from deployer.watch.guards import run_gpus
from remote.guards import CostCap, GpuIdle, Guards

PERMISSIONS = (
    "ec2:DescribeInstances, with ec2:DescribeSpotPriceHistory for spot instances and "
    "pricing:GetProducts for on-demand ones"
)


def arm(
    plan: Plan, began: float, now: float, *, detached: bool, wall: float | None = None
) -> Guards | None:
    """The run's guards, or None when it has none. `began`: the run's start (Unix time, a
    resumed run's first); `now`: the watch's clock, from which the cost goes on counting;
    `wall`: Unix time now (the pricing's). Raises InventoryError when max_cost cannot be kept
    (its cost unknown), UsageError for a detached run without a keeper."""
    cap = max_cost(plan)
    job = plan.job
    if cap is None and job.gpu_idle_stop is None:
        return None
    if detached and not job.keeper:
        raise UsageError(
            f"{'max_cost' if cap is not None else 'gpu_idle_stop'} needs someone to hold the "
            "run: a detached run without a keeper (keeper = false) has nobody to stop it; "
            "nothing was started",
            hint="leave keeper = false out, or run it attached (without --detach)",
        )
    # Priced a second into the run at least: an instance that counted no time has no rate.
    wall = max(time.time() if wall is None else wall, began + 1.0)
    cost = None if cap is None else _priced(plan, cap, began, wall)
    idle = job.gpu_idle_stop
    return Guards(cost, GpuIdle(idle.below, idle.minutes) if idle else None, run_gpus(plan), now)


def max_cost(plan: Plan) -> float | None:
    """The lowest cap any source of the inventory set on its machines (`[aws] max_cost`)."""
    caps = [t.max_cost for t in plan.inventory.tables if t.max_cost is not None]
    return min(caps) if caps else None


def _priced(plan: Plan, cap: float, began: float, wall: float) -> CostCap:
    machines = {t.json_key: list(t.documents) for t in plan.inventory.tables}
    hosts = [h.name for h in plan.hosts]
    found = costs.price_run(machines, hosts, Span(began, None, wall))
    why = "no source can price the run's machines" if found is None else found.unknown
    if found is None or found.usd is None:
        raise InventoryError(
            str(plan.inventory.path),
            "aws.max_cost",
            f"cannot be kept: the run's cost is unknown ({why}); nothing was started",
            hint=f"let the credentials read prices ({PERMISSIONS}), or leave max_cost out",
        )
    rate = hourly(found)
    if isinstance(rate, str):
        raise InventoryError(
            str(plan.inventory.path),
            "aws.max_cost",
            f"cannot be kept: {rate}; nothing was started",
            hint="run `tfdeploy up` again in a moment, or leave max_cost out",
        )
    return CostCap(cap, float(found.usd), float(rate))


def hourly(cost: RunCost) -> Decimal | str:
    """What the run's instances that still run cost an hour: each one's cost over the seconds
    it counted, per hour (the price in force, on-demand; spot, its mean over the run so far,
    which a minute into a run is the price now). Why not, in words, when one counted none."""
    rate = Decimal(0)
    for group in cost.groups:
        for machine in group.machines:
            if machine.end is None or machine.end < cost.priced_at or machine.usd is None:
                continue  # it ended before now: it costs the run nothing more
            if machine.hours <= 0:
                return f"{machine.id} has run no time of the run yet, so its rate is unknown"
            rate += machine.usd / Decimal(repr(machine.hours))
    return rate
