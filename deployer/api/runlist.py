"""`tfdeploy runs`: every run this machine started or saw, from its local state (run records,
archives, and the facts, outcome and metrics kept beside them: results/runstore.py), so a
run whose hosts are gone still lists. `-i INVENTORY` adds what that inventory's hosts say now.
A run on EC2 instances also says what they cost (api/runcost.py), the one part of a listing
that may ask the network: AWS's price APIs, for a run whose cost is not final and kept yet.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from deployer.api.runcost import recorded_cost
from deployer.core.lines import clean
from deployer.core.text import duration, plural
from deployer.results import metricstore, runstore
from deployer.results.state import RUN_ID
from deployer.sources.costs import RunCost

STATES = ("succeeded", "failed", "stopped", "running", "unknown")
NAMED = 4  # damaged records named per run in the table (all of them in --json)


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
    metrics_dropped: int = 0  # lines the tasks wrote that were no record (docs/metrics.md)
    restarts: int = 0  # how often its keeper restarted it (the job, or a task alone)
    resumed: int = 0  # how often `up --resume` continued it (docs/up.md "Resuming a run")
    damage: tuple[str, ...] = ()  # the run's local records that could not be read, named
    cost: RunCost | None = None  # what its machines cost; None: none a source prices

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {
            "hosts": list(self.hosts),
            "damage": list(self.damage),
            "cost": self.cost.to_json() if self.cost else None,
        }


def local_runs() -> list[RunSummary]:
    """Every run of the state directory, newest first. A run whose records are damaged is
    listed with what could be read, its damage named; it never hides the others."""
    records, folders = runstore.listed_runs()
    found = [_summary_or_damage(run_id) for run_id in records | folders if RUN_ID.match(run_id)]
    return sorted(found, key=lambda r: (r.started or 0.0, r.run_id), reverse=True)


def _summary_or_damage(run_id: str) -> RunSummary:
    """The run's summary; one that cannot be made (a folder that cannot be read) is the run
    named with why, so `runs` still lists it and every other run."""
    try:
        return summary(run_id)
    except (OSError, ValueError) as exc:
        why = clean(f"{type(exc).__name__}: {exc}")
        job = run_id.rsplit("-", 2)[0]
        return RunSummary(run_id, job, "?", (), None, None, "unknown", damage=(why,))


def summary(run_id: str) -> RunSummary:
    documents = Documents.of(run_id)
    record, facts, ended = documents.record.fields, documents.facts.fields, documents.outcome.fields
    started = metricstore.time_value(facts.get("began") or record.get("created"))
    outcome = _text(ended.get("outcome")) or "unknown"
    end = time.time() if outcome == "running" else metricstore.time_value(ended.get("ended"))
    step, final, damage = _last_metrics(run_id)
    hosts = tuple(
        _text(h.get("name")) or "?" for h in _objects(facts.get("hosts") or record.get("hosts"))
    )
    return RunSummary(
        run_id=run_id,
        job=_text(facts.get("job")) or _text(record.get("job")) or run_id.rsplit("-", 2)[0],
        inventory=_text(facts.get("inventory")) or _text(record.get("inventory")) or "?",
        hosts=hosts,
        started=started,
        duration_s=(end - started) if end is not None and started else None,
        outcome=outcome if outcome in STATES else "unknown",
        detail=_text(ended.get("why")),
        last_step=step,
        final=final,
        metrics_dropped=runstore.metrics_dropped(run_id),
        restarts=metricstore.count_value(ended.get("restarts")),
        resumed=len(_objects(facts.get("resumed"))),
        damage=(*documents.damage(), *damage),
        cost=recorded_cost(run_id, facts, ended, record),
    )


def _last_metrics(run_id: str) -> tuple[int | None, dict[str, float], list[str]]:
    """The last step of any task, the first task's last numbers, and the damaged lines met:
    each task's last record read from the end of its series (runstore.last_metrics)."""
    last = runstore.last_metrics(run_id)
    records = [one.records[-1] for one in last if one.records]
    step = max((int(r["step"]) for r in records), default=None)
    final = {k: v for k, v in (records[0] if records else {}).items() if k not in ("time", "step")}
    return step, final, [line for one in last for line in one.damage]


@dataclass(frozen=True)
class Documents:
    """The run's documents a summary reads: its record, its facts, its outcome."""

    record: runstore.Document
    facts: runstore.Document
    outcome: runstore.Document

    @classmethod
    def of(cls, run_id: str) -> Documents:
        read = runstore.read_record, runstore.read_facts, runstore.read_outcome
        return cls(*(reader(run_id) for reader in read))

    def damage(self) -> list[str]:
        """Those that exist but hold no JSON object, or an empty one (cut by a full disk,
        edited), each named by its file."""
        return [
            f"{d.path.name}: not a JSON object"
            for d in (self.record, self.facts, self.outcome)
            if d.exists and not d.fields
        ]


def _text(value: object) -> str:
    """A text of a local record as it may be printed (one line, no control character)."""
    if not isinstance(value, str):
        return ""
    # a JSON escape can make a lone surrogate, which no terminal encoding writes
    return clean(value[:300].encode("utf-8", "replace").decode().replace("\n", " "))


def _objects(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


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


def runs_table(runs: Sequence[RunSummary]) -> RenderableType:
    """The runs as a table, and below it each run whose local records are damaged, named."""
    table = Table()
    priced = any(r.cost for r in runs)  # the column only where a run ran on priced machines
    columns = ("run", "job", "hosts", "started", "duration", "outcome", "step", "final")
    for name in (*columns, "cost") if priced else columns:
        table.add_column(name, overflow="fold")
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)) if r.started else "-"
        outcome = f"{r.outcome}: {r.detail}" if r.detail and r.outcome != "succeeded" else r.outcome
        if r.restarts:
            outcome += f" ({plural(r.restarts, 'restart')})"
        if r.resumed:
            outcome += " (resumed)" if r.resumed == 1 else f" (resumed {r.resumed} times)"
        final = ", ".join(f"{k} {v:.4g}" for k, v in list(r.final.items())[:3])
        cost = [r.cost.cell() if r.cost else "-"] if priced else []
        table.add_row(
            r.run_id,
            r.job,
            ", ".join(r.hosts[:4]) + (f" +{len(r.hosts) - 4}" if len(r.hosts) > 4 else ""),
            started,
            duration(r.duration_s) if r.duration_s is not None else "-",
            outcome,
            "-" if r.last_step is None else str(r.last_step),
            final or "-",
            *cost,
        )
    notes = [Text(f"run {r.run_id}: {r.cost.line()}") for r in runs if r.cost]
    notes += [_damage_note(r) for r in runs if r.damage]
    return Group(table, *notes) if notes else table


def _damage_note(run: RunSummary) -> Text:
    named = "; ".join(run.damage[:NAMED])
    more = f" (and {len(run.damage) - NAMED} more)" if len(run.damage) > NAMED else ""
    return Text(f"run {run.run_id}: records skipped, damaged: {named}{more}")
