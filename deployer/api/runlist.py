"""`tfdeploy runs`: every run this machine started or saw, from its local state (run records,
archives, and the facts, outcome and metrics kept beside them: results/metricstore.py), so a
run whose hosts are gone still lists. `-i INVENTORY` adds what that inventory's hosts say now.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from deployer.core.statedir import state_dir
from deployer.core.text import duration
from deployer.results import metricstore
from deployer.results.archive import run_dir

STATES = ("succeeded", "failed", "stopped", "running", "unknown")


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    job: str
    inventory: str
    hosts: tuple[str, ...]
    started: float | None
    duration_s: float | None
    outcome: str  # one of STATES
    detail: str = ""  # "worker:1 exit code 1", how it failed or stopped
    last_step: int | None = None
    final: dict[str, float] = field(default_factory=dict)  # the last record's numbers

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"hosts": list(self.hosts)}


def local_runs() -> list[RunSummary]:
    """Every run of the state directory, newest first."""
    root = state_dir() / "runs"
    ids = {p.stem for p in root.glob("*.json")} | {p.name for p in root.iterdir() if p.is_dir()}
    found = [summary(run_id) for run_id in ids] if root.is_dir() else []
    return sorted(found, key=lambda r: (r.started or 0.0, r.run_id), reverse=True)


def summary(run_id: str) -> RunSummary:
    record = _json(state_dir() / "runs" / f"{run_id}.json") or {}
    directory = run_dir(run_id)
    facts = metricstore.read_json(directory, "facts.json") or {}
    ended = metricstore.read_json(directory, "outcome.json") or {}
    started = facts.get("began") or record.get("created")
    outcome = str(ended.get("outcome") or "unknown")
    end = ended.get("ended")
    if outcome == "running":
        end = time.time()
    metrics = metricstore.read(directory, "metrics")
    last = [series[-1] for series in metrics.values() if series]
    step = max((int(r["step"]) for r in last if "step" in r), default=None)
    final = {k: v for k, v in (last[0] if last else {}).items() if k not in ("time", "step")}
    hosts = tuple(h.get("name", "?") for h in facts.get("hosts") or record.get("hosts") or ())
    return RunSummary(
        run_id=run_id,
        job=str(facts.get("job") or record.get("job") or run_id.rsplit("-", 2)[0]),
        inventory=str(facts.get("inventory") or record.get("inventory") or "?"),
        hosts=hosts,
        started=started,
        duration_s=(end - started) if isinstance(end, int | float) and started else None,
        outcome=outcome if outcome in STATES else "unknown",
        detail=str(ended.get("why") or ""),
        last_step=step,
        final=final,
    )


def with_hosts(
    runs: list[RunSummary], host_states: Mapping[str, Sequence[Any]]
) -> list[RunSummary]:
    """What the hosts say (run id -> its task statuses) over the local outcome."""
    from dataclasses import replace

    shown = []
    for run in runs:
        tasks = host_states.get(run.run_id)
        if tasks:
            running = [t for t in tasks if not t.finished]
            failed = [t for t in tasks if t.finished and not t.succeeded]
            if running:
                run = replace(run, outcome="running")
            elif failed and run.outcome in ("unknown", "running"):
                first = min(failed, key=lambda t: t.ended or 0.0)
                run = replace(run, outcome="failed", detail=f"{first.name} {first.outcome()}")
        shown.append(run)
    return shown


def runs_table(runs: Sequence[RunSummary]) -> Table:
    table = Table()
    for name in ("run", "job", "hosts", "started", "duration", "outcome", "step", "final"):
        table.add_column(name, overflow="fold")
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)) if r.started else "-"
        outcome = f"{r.outcome}: {r.detail}" if r.detail and r.outcome != "succeeded" else r.outcome
        final = ", ".join(f"{k} {v:.4g}" for k, v in list(r.final.items())[:3])
        table.add_row(
            r.run_id,
            r.job,
            ", ".join(r.hosts[:4]) + (f" +{len(r.hosts) - 4}" if len(r.hosts) > 4 else ""),
            started,
            duration(r.duration_s) if r.duration_s is not None else "-",
            outcome,
            "-" if r.last_step is None else str(r.last_step),
            final or "-",
        )
    return table


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
