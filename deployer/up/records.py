"""What an `up` leaves on record: this machine's run record (for `status`, `logs`, `down RUN_ID`
in any shell), the run's fields that every host keeps in its run directory, and the facts kept
beside its archive that `runs` and `report` read once the hosts are gone."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from deployer.config.plan import Plan
from deployer.core.secrets import masked
from deployer.core.statedir import state_dir
from deployer.push.sync import HostRecord
from deployer.results.archive import LogArchive
from deployer.results.runstore import Facts
from deployer.results.state import RunRecord, controller_name, save
from deployer.watch.board import TaskRow
from deployer.watch.progress import Progress, report
from deployer.watch.runstate import RunState
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


def host_record(plan: Plan, run_id: str, lease: float) -> HostRecord:
    """The run as each host records it with the push."""
    hosts = tuple((h.name, h.address) for h in plan.hosts)
    return HostRecord(run_id, plan.job.name, lease, controller_name(), hosts, time.time())


def archive_warning(run_id: str, why: str) -> str:
    return (
        f"warning: cannot keep the local log archive ({why}); the job goes on, its log "
        f"stays on the hosts: `tfdeploy logs {run_id}` reads it there"
    )


def run_facts(plan: Plan, run_id: str, began: float, hide: Callable[[str], str]) -> Facts:
    """The run as its report shows it (results/runstore.py Facts): inventory, job,
    hosts, and each task's host, command, TF_CONFIG and environment, secrets masked."""
    job, secret = plan.job, plan.job.secret_env
    return {
        "run_id": run_id,
        "job": job.name,
        "inventory": str(plan.inventory.path),
        "began": began,
        "command": hide(job.command or ""),
        "image": job.image,
        "requirements": [str(r) for r in getattr(job, "requirements", None) or ()],
        "hosts": [{"name": h.name, "address": h.address} for h in plan.hosts],
        # what the host sources found (EC2 instances: type, market, zone, launch): its cost
        "machines": {t.json_key: list(t.documents) for t in plan.inventory.tables},
        "tasks": [
            {
                "name": t.name,
                "host": t.host,
                "command": hide(t.command or ""),
                "gpus": list(t.gpus),
                "tf_config": t.cluster_env.get("TF_CONFIG", ""),
                # outside TensorFlow, the rank's variables (config/frameworks.py)
                "cluster_env": t.cluster_env,
                "env": {k: hide(v) for k, v in masked(t.own_env, secret).items()},
            }
            for t in plan.tasks
        ],
    }


@dataclass(frozen=True)
class Lineage:
    """When the run began and when it was resumed: a run that `up --resume` goes on keeps its
    first start (one run in the local history) and adds its resumes (`runs` says so)."""

    began: float
    resumed: tuple[dict[str, float], ...] = ()


def keep_facts(
    archive: LogArchive,
    run: RunState,
    journal: Journal,
    lineage: Lineage,
    outcome: Mapping[str, object],
    hide: Callable[[str], str],
) -> None:
    """The run's facts, journal and outcome beside its archive (results/runstore.py): what
    `tfdeploy runs` and `tfdeploy report` read once the hosts are gone. Written when `up` ends,
    whatever ended it, once the run reached its hosts."""
    facts = run_facts(run.plan, run.run_id, lineage.began, hide)
    if lineage.resumed:
        facts["resumed"] = list(lineage.resumed)
    watches = run.board.watches
    facts["exits"] = {
        w.task.name: w.status.outcome() if w.status and w.status.finished else None
        for w in watches.values()
    }
    facts["started_at"] = {w.task.name: w.status.started for w in watches.values() if w.status}
    facts["ended_at"] = {w.task.name: w.status.ended for w in watches.values() if w.status}
    archive.keep_facts(facts)
    for entry in journal.entries:
        archive.note(entry[1], entry[2], at=entry[0])
    archive.keep_outcome({**outcome, "ended": time.time()})
    archive.keep_offsets({n: w.series.offset for n, w in watches.items()})


class Journal:
    """Any view, which also keeps what `up` said and when (steps and phases): the timeline
    of the run's report. Kept in memory (a run says a few dozen steps) and written beside the
    archive when `up` ends (keep_facts)."""

    def __init__(self, view: Display) -> None:
        self.view = view
        self.entries: list[tuple[float, str, str]] = []

    def step(self, text: str) -> None:
        self._keep("step", text)
        self.view.step(text)

    def phase(self, text: str) -> None:
        self._keep("phase", text)
        self.view.phase(text)

    def progress(self, progress: Progress) -> None:
        report(self.view, progress)

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self.view.lines(label, lines)

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        self.view.tasks(rows)

    def close(self) -> None:
        self.view.close()

    def _keep(self, kind: str, text: str) -> None:
        if len(self.entries) < MAX_JOURNAL:
            self.entries.append((time.time(), kind, text.partition("\n")[0][:300]))


MAX_JOURNAL = 2000
