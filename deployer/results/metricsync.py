"""What `down` keeps of a run it stops: the metrics its tasks wrote that this machine has not
read yet (a detached run's, all of them), and how the run ended; both beside the run's archive
(metricstore.py), so `runs` and `report` have them once the hosts are gone.

Where each task's metrics file was read up to is kept in `metric_offsets.json` (by `up` at its
end, and here), so nothing is read or stored twice.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from deployer.core.errors import HostError
from deployer.hosts.fleet import Fleet
from deployer.hosts.reply_types import TaskStatus
from deployer.results import metricstore
from deployer.results.archive import LogArchive, run_dir
from deployer.results.runs import HostRun
from remote import protocol

OFFSETS = "metric_offsets.json"
MAX_ROUNDS = 64  # polls per host and run: 64 x 64 kB of metric lines at most


def keep_runs(fleet: Fleet, runs: Sequence[HostRun]) -> None:
    """For each run (as each host reports it): its unread metric lines into the local store,
    and its outcome (as the hosts report it after the stop), unless `up` recorded one."""
    statuses: dict[str, list[TaskStatus]] = {}
    for run in runs:
        with contextlib.suppress(HostError, OSError):
            statuses.setdefault(run.run_id, []).extend(_fetch(fleet, run))
    for run_id, tasks in statuses.items():
        kept = metricstore.read_json(run_dir(run_id), "outcome.json") or {}
        if kept.get("outcome") in (None, "running", "unknown"):
            with contextlib.suppress(OSError):
                metricstore.write_json(run_dir(run_id), "outcome.json", outcome(tasks))


def _fetch(fleet: Fleet, run: HostRun) -> list[TaskStatus]:
    directory = run_dir(run.run_id)
    offsets: dict[str, int] = {
        k: v
        for k, v in (metricstore.read_json(directory, OFFSETS) or {}).items()
        if isinstance(v, int)
    }
    asked = {t.name: offsets.get(t.name, 0) for t in run.tasks}
    archive = LogArchive(run.run_id)
    agent = fleet.member(run.host).agent
    tasks: list[TaskStatus] = []
    for _ in range(MAX_ROUNDS):
        poll = agent.poll(run.run_id, {}, max_bytes=0, heartbeat=False, metrics=asked)
        tasks = list(poll.tasks)
        moved = False
        for name, (offset, records) in poll.metrics.items():
            moved = moved or offset > asked[name]
            asked[name] = offset
            if records:
                archive.write_metrics(name, records)
        if not moved:
            break
    metricstore.write_json(directory, OFFSETS, {**offsets, **asked})
    return tasks


def outcome(tasks: Sequence[TaskStatus]) -> dict[str, object]:
    """succeeded (every task exited 0 by itself), failed (the first task that did not, named),
    or stopped (by tfdeploy, `down`)."""
    exits = {t.name: t.outcome() for t in tasks if t.finished}
    return {**_verdict(tasks), "exits": exits}


def _verdict(tasks: Sequence[TaskStatus]) -> dict[str, object]:
    own = [t for t in tasks if t.reason != protocol.REASON_STOPPED]
    failed = sorted((t for t in own if t.finished and not t.succeeded), key=lambda t: t.ended or 0)
    ended = max((t.ended or 0.0 for t in tasks), default=0.0) or time.time()
    if failed:
        return {
            "outcome": "failed",
            "why": f"{failed[0].name} {failed[0].outcome()}",
            "ended": ended,
        }
    if own and len(own) == len(tasks) and all(t.succeeded for t in tasks):
        return {"outcome": "succeeded", "ended": ended}
    return {"outcome": "stopped", "why": "by tfdeploy down", "ended": ended}
