"""A detached run rejoined after Slurm requeued its allocation.

Slurm's requeue (a preemption, a failed node) ends every step of the allocation: the tasks,
the run's keeper and its wardens (all in the holder step, holder.py) go with it, and the same
job runs again later, often on the same nodes. An attached `up` waits for that and starts the
run again itself; a detached run has no `up` left, so its holders do it: each `keep` request a
holder ran inside an allocation is recorded in the run's folder (`rejoin-warden.json`,
`rejoin-keeper.json`, 0600: they hold the run's secret, as the keeper's own memory did), and
a holder that starts in a requeued allocation (SLURM_RESTART_COUNT > 0) runs them again: the
warden on the port the keeper knows, then the keeper, which restarts the whole job (attempt
one higher, from its checkpoint) by its policy, or ends the run when no restart is left.

A run stopped by tfdeploy (`down`: the run's stop marker) or ended by its keeper is not
rejoined; the records go when the run ends. On other nodes than before there is nothing to
rejoin (the records are where the run was), and the allocation's body ends it once no task
of the user's is left.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import layout
import protocol

RECORDS = {protocol.KEEP_WARDEN: "rejoin-warden.json", protocol.KEEP_KEEPER: "rejoin-keeper.json"}
JOB_ENV, RESTARTS_ENV = "SLURM_JOB_ID", "SLURM_RESTART_COUNT"


def record(req: dict[str, Any], run_dir: Path, port: int | None = None) -> None:
    """A `keep` request run inside a Slurm allocation, kept for a requeue (not elsewhere: no
    secret is written where nothing would read it)."""
    job = os.environ.get(JOB_ENV)
    action = req.get("action")
    if not job or action not in RECORDS:
        return
    kept = {k: v for k, v in req.items() if k not in ("v", "op")}
    if port is not None:
        kept["port"] = port
    with contextlib.suppress(OSError):  # a full disk loses the rejoin, never the start
        layout.write_json(run_dir / RECORDS[action], {"slurm_job": job, "request": kept})


def forget(run_dir: Path) -> None:
    """The run ended: nothing of it is started again, and its secret leaves the disk."""
    for name in RECORDS.values():
        with contextlib.suppress(OSError):
            (run_dir / name).unlink()


def requeued() -> bool:
    restarts = os.environ.get(RESTARTS_ENV, "")
    return restarts.isdigit() and int(restarts) > 0


def runs_to_rejoin(workdir: Path, job: str) -> list[tuple[Path, dict[str, Any]]]:
    """Each run of this workdir that this allocation held here and nobody stopped: its folder
    and its recorded requests, by action."""
    found = []
    runs = layout.host_dir(workdir) / "runs"
    with contextlib.suppress(OSError):
        for run_dir in sorted(runs.iterdir()):
            if layout.run_stopped(run_dir):
                continue
            asked = {}
            for action, name in RECORDS.items():
                kept = layout.read_json(run_dir / name)
                if isinstance(kept, dict) and kept.get("slurm_job") == job:
                    request = kept.get("request")
                    if isinstance(request, dict):
                        asked[action] = request
            if protocol.KEEP_WARDEN in asked:
                found.append((run_dir, asked))
    return found
