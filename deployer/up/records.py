"""What an `up` leaves on record: this machine's run record (for `status`, `logs`, `down RUN_ID`
in any shell) and the run's fields that every host keeps in its run directory."""

from __future__ import annotations

import time

from deployer.config.plan import Plan
from deployer.core.statedir import state_dir
from deployer.results.state import RunRecord, controller_name, save
from deployer.watch.view import Display


def keep_record(plan: Plan, run_id: str, *, detached: bool, view: Display) -> None:
    """The run's local record: a convenience, so a disk that cannot take it is a warning (the
    inventory finds the run as well)."""
    try:
        save(RunRecord.of(plan, run_id, detached=detached))
    except OSError as exc:
        view.step(
            f"warning: cannot keep the run's record ({exc.filename or state_dir()}: "
            f"{exc.strerror or exc}); the job goes on; `status`, `logs` and `down` of it "
            f"need the inventory: `tfdeploy down {run_id} -i INVENTORY`"
        )


def host_fields(plan: Plan, run_id: str, lease: float) -> dict[str, object]:
    """The run as each host records it with the push."""
    return {
        "run_id": run_id,
        "job": plan.job.name,
        # Detached too: the lease holds until every task started and `up` returns
        # (detach()), so an `up --detach` killed half-way leaves nothing running.
        "detached": False,
        "lease_seconds": lease,
        "controller": controller_name(),
        # The run's own list of its hosts: `down`/`status` from a shell whose inventory
        # dropped one can name it (results/runs.py).
        "hosts": [[h.name, h.address] for h in plan.hosts],
        "hosts_at": time.time(),
    }


def archive_warning(run_id: str, why: str) -> str:
    return (
        f"warning: cannot keep the local log archive ({why}); the job goes on, its log "
        f"stays on the hosts: `tfdeploy logs {run_id}` reads it there"
    )
