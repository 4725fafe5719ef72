"""A run's cost, as `runs`, `status` and the report show it: priced from the machines its facts
keep (`up` writes what the host sources found: deployer/up/records.py), or, for a run whose
`up` has not ended yet, from what `status` found on the inventory now.

Only runs with machines a source can price ask anything of a cloud (EC2 instances); a run on
static hosts or on Slurm asks nothing. A final figure (the run ended, every price had) is kept
in the run's folder (results/runstore.py cost.json) and never asked for again: the spot price
history goes back 90 days, and EC2 forgets a terminated instance within about an hour.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deployer.config.sources import SourceTable
from deployer.results import metricstore, runstore
from deployer.sources import costs
from deployer.sources.costs import RunCost, Span

if TYPE_CHECKING:  # runs reaches the hosts (paramiko); `runs` and `report` must not load it
    from deployer.results.runs import HostRun


def recorded_cost(
    run_id: str,
    facts: Mapping[str, Any],
    outcome: Mapping[str, Any],
    record: Mapping[str, Any] | None = None,
    *,
    now: float | None = None,
) -> RunCost | None:
    """The run's cost from its local records (its facts, outcome and record, as read); None
    when they keep no machine a source prices. Kept once final."""
    kept = costs.from_json(runstore.read_cost(run_id).found)
    if kept is not None and kept.final:
        return kept
    machines = facts.get("machines")
    began = metricstore.time_value(facts.get("began") or (record or {}).get("created"))
    if not isinstance(machines, dict) or began is None:
        return None
    running = outcome.get("outcome") in (None, "running")
    ended = None if running else metricstore.time_value(outcome.get("ended"))
    span = Span(began, ended, now or time.time())
    return _keep(run_id, costs.price_run(machines, _host_names(facts.get("hosts")), span))


def run_cost(run_id: str, *, now: float | None = None) -> RunCost | None:
    """`recorded_cost` of a run read from this machine's records."""
    facts, outcome = runstore.read_facts(run_id).fields, runstore.read_outcome(run_id).fields
    return recorded_cost(run_id, facts, outcome, runstore.read_record(run_id).fields, now=now)


def status_costs(
    runs: Sequence[HostRun], tables: Iterable[SourceTable], *, now: float | None = None
) -> dict[str, RunCost]:
    """The cost of each run `status` found: from its local records, else (its `up` has not
    ended, so it kept no facts yet) from what the inventory's sources found now, the run's
    hosts among them, over the time its hosts say it ran."""
    by_run: dict[str, list[HostRun]] = {}
    for r in runs:
        by_run.setdefault(r.run_id, []).append(r)
    found: dict[str, RunCost] = {}
    listed = list(tables)
    for run_id, host_runs in by_run.items():
        cost = run_cost(run_id, now=now)
        if cost is None and listed:
            cost = _live_cost(host_runs, listed, now or time.time())
        if cost is not None:
            found[run_id] = cost
    return found


def _live_cost(host_runs: list[HostRun], tables: list[SourceTable], now: float) -> RunCost | None:
    hosts = {r.host for r in host_runs} | {name for r in host_runs for name, _ in r.hosts}
    machines = {t.json_key: [d for d in t.documents if d.get("id") in hosts] for t in tables}
    began = min(r.created for r in host_runs)
    ends = [t.ended for r in host_runs for t in r.tasks if t.ended is not None]
    active = any(r.active for r in host_runs)
    ended = None if active or not ends else max(ends)
    return costs.price_run(machines, sorted(hosts), Span(began, ended, now))


def _keep(run_id: str, cost: RunCost | None) -> RunCost | None:
    """A final cost kept in the run's folder; a disk that cannot take it costs only asking
    again next time."""
    if cost is not None and cost.final:
        with contextlib.suppress(OSError):
            runstore.write_cost(run_id, cost.to_json())
    return cost


def _host_names(hosts: object) -> list[str]:
    listed = hosts if isinstance(hosts, list) else []
    return [h["name"] for h in listed if isinstance(h, dict) and isinstance(h.get("name"), str)]
