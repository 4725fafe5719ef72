"""`python -m bench.preflight INVENTORY`: tfdeploy's preflight alone, as `up` runs it, then exit."""

from __future__ import annotations

import io
import sys

from deployer.config.plan import make_plan
from deployer.hosts.fleet import Fleet
from deployer.sources import load_inventory
from deployer.up.deployment import Deployment, UpOptions
from deployer.watch.view import PlainView


def main(argv: list[str]) -> int:
    plan = make_plan(load_inventory(argv[0]))
    with Fleet(plan.hosts) as fleet:
        deployment = Deployment(plan, fleet, PlainView(io.StringIO()), UpOptions(detach=True))
        deployment.prepare.preflight()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
