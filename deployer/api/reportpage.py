"""`tfdeploy report RUN`: one self-contained HTML page of a run, made from what this machine
kept (results/runstore.py): its facts, a chart per metric with every task overlaid,
resources and a timeline.

Plotting: hand-written inline SVG (deployer/api/charts.py), no library. A charting library
would cost an install (matplotlib ~40 MB with numpy; plotly's offline bundle puts ~3.5 MB of
JavaScript into every page) for what is a few paths; SVG opens from disk in any browser, needs
no script and no CDN.

Every metric a task reported (each number of its records but `step` and `time`) is one chart,
step on the x axis, every task's series overlaid in its colour; steps/s is one more, CPU, RSS
and GPU use over time the resources'. Where an attempt of the job (policy "restart-job") or a
task's restart began is a vertical mark, at the first step recorded after it: up's journal says
when each began, and each record's `time` (the task's own, else when it arrived: the poller
stamps it) where among the steps.

Bounded whatever the run's length: each series is streamed (metricstore.each), never held, and
drawn from at most charts.POINTS points (each bucket's lowest and highest: a spike stays), fewer
each when many tasks share a chart, so a week-long run's page is the size of an hour's. What
the store could not read (a damaged line, named) and the lines the edge dropped are said under
"Skipped".
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.api import charts
from deployer.api.charts import e as _e
from deployer.api.runcost import run_cost
from deployer.core.errors import UsageError
from deployer.core.text import duration, human_size
from deployer.results import metricstore, runstore
from deployer.sources.costs import MachineCost, RunCost, stamp, usd_text

W = charts.W
POINTS_DRAWN = charts.POINTS  # a series is drawn from this many points at most
RATE_SPAN = 10  # records a steps/s point is measured over
METRIC_CHARTS = 24  # charts of metrics at most (a task's record has 24 numbers at most)
NOT_METRICS = ("step", "time")
RESOURCES = (("cpu", "CPU %"), ("rss", "RSS"), ("gpu_util", "GPU %"), ("gpu_mem", "GPU memory"))


def write_report(run_id: str, out: Path | None = None) -> Path:
    kept = runstore.read_facts(run_id)
    facts = kept.found
    if kept.damaged:
        raise UsageError(
            f"run {run_id}'s facts on this machine are damaged ({kept.path} is not "
            "a JSON object: cut short, nested too deep, or edited)",
            hint="the page needs the run's facts, which `up` wrote when it started: restore the "
            "file from a backup, or see the run's logs (`tfdeploy logs RUN_ID`)",
        )
    if facts is None:
        raise UsageError(
            f"run {run_id} has no facts on this machine ({kept.path})",
            hint="`tfdeploy runs` lists the runs this machine keeps; a report needs a run "
            "that `up` carried to its hosts from here",
        )
    metrics, usage = runstore.metrics(run_id), runstore.usage(run_id)
    streams = Streams(
        {task: runstore.each_metric(run_id, task) for task in metrics},
        {task: runstore.each_sample(run_id, task) for task in usage},
    )
    page = render_page(
        run_id,
        sane_facts(facts),
        sane_outcome(runstore.read_outcome(run_id).fields),
        metrics,
        usage,
        runstore.journal(run_id),
        streams,
        cost=run_cost(run_id),
    )
    target = out or runstore.RunFolder.of(run_id).report
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a run's facts: private
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(page)
    return target


def sane_facts(raw: dict[str, Any]) -> dict[str, Any]:
    """The run's facts as the page reads them: every field of its type, or left out. The file
    is this machine's, but a person or a full disk may have changed it: a field that is not
    what `up` writes is a blank on the page, never an error."""
    tasks = [
        {
            "name": _str(t.get("name")) or "?",
            "host": _str(t.get("host")),
            "tf_config": _str(t.get("tf_config")),
            "env": {str(k): _str(v) for k, v in _obj(t.get("env")).items()},
        }
        for t in _objs(raw.get("tasks"))
    ]
    return {
        **{key: _str(raw.get(key)) for key in ("job", "inventory", "command", "image")},
        "requirements": [_str(r) for r in _list(raw.get("requirements")) if isinstance(r, str)],
        "hosts": [
            {"name": _str(h.get("name")), "address": _str(h.get("address"))}
            for h in _objs(raw.get("hosts"))
        ],
        "tasks": tasks,
        "began": metricstore.time_value(raw.get("began")),
        "started_at": _times(raw.get("started_at")),
        "ended_at": _times(raw.get("ended_at")),
        "exits": {str(k): _str(v) for k, v in _obj(raw.get("exits")).items()},
    }


def sane_outcome(raw: dict[str, Any]) -> dict[str, Any]:
    """The run's outcome as the page reads it (see sane_facts)."""
    return {
        "outcome": _str(raw.get("outcome")) or "unknown",
        "why": _str(raw.get("why")),
        "ended": metricstore.time_value(raw.get("ended")),
        "exits": {str(k): _str(v) for k, v in _obj(raw.get("exits")).items()},
        "recoveries": [_str(x) for x in _list(raw.get("recoveries")) if isinstance(x, str)][:20],
        "restarts": metricstore.count_value(raw.get("restarts")),
    }


def _str(value: object) -> str:
    """A text of a record as the page shows it: bounded, and no lone surrogate (a JSON escape
    can make one, and no UTF-8 page holds it)."""
    return value[:4000].encode("utf-8", "replace").decode() if isinstance(value, str) else ""


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _objs(value: object) -> list[dict[str, Any]]:
    return [v for v in _list(value) if isinstance(v, dict)]


def _times(value: object) -> dict[str, float]:
    found = {str(k): metricstore.time_value(v) for k, v in _obj(value).items()}
    return {k: v for k, v in found.items() if v is not None}


@dataclass(frozen=True)
class Streams:
    """Each task's records, read one at a time (runstore.each_metric): what the charts are drawn
    from. A task named here and not in the facts is charted as well."""

    metrics: Mapping[str, Iterable[Mapping[str, Any]]] = field(default_factory=dict)
    usage: Mapping[str, Iterable[Mapping[str, Any]]] = field(default_factory=dict)


def render_page(
    run_id: str,
    facts: dict[str, Any],
    outcome: dict[str, Any],
    metrics: Mapping[str, metricstore.Series],
    usage: Mapping[str, metricstore.Series],
    journal: metricstore.Series,
    streams: Streams | None = None,
    *,
    cost: RunCost | None = None,
) -> str:
    """The page of sane facts and outcome (sane_facts, sane_outcome), the series as the store
    reads them (checked: results/runstore.py; what they skipped is said) and the records
    the charts are drawn from (`streams`; else the series' own records); `cost`: what the
    run's EC2 instances cost (api/runcost.py), a row of the facts and a table per instance."""
    entries = journal.records
    if streams is None:
        streams = Streams(
            {t: s.records for t, s in metrics.items()}, {t: s.records for t, s in usage.items()}
        )
    named = [t["name"] for t in facts["tasks"]]
    metric_tasks = [*named, *(t for t in streams.metrics if t not in named)]
    usage_tasks = [*named, *(t for t in streams.usage if t not in named)]
    begins = attempt_starts(entries)
    began = facts["began"] or min(
        (t for t in (*facts["started_at"].values(), *(e["t"] for e in entries))), default=0.0
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>tfdeploy report {_e(run_id)}</title><style>{CSS}{charts.CSS}</style></head><body>",
        f"<h1>Run {_e(run_id)}</h1>",
        _facts(facts, outcome, cost),
        _cost_table(cost),
        _skipped(metrics, usage, journal),
        "<h2>Timeline</h2>",
        _timeline(facts, entries, outcome),
        "<h2>Metrics</h2>",
        metric_charts(metric_tasks, streams.metrics, begins),
        "<h2>Resources</h2>",
        usage_charts(usage_tasks, streams.usage, begins, began),
        f"<p class='foot'>made by tfdeploy report at "
        f"{_e(time.strftime('%Y-%m-%d %H:%M:%S'))}</p></body></html>",
    ]
    return "\n".join(parts)


@dataclass(frozen=True)
class Begin:
    """Where up's journal says an attempt of the whole job (task None) or a task's restart
    began, and the mark's words."""

    t: float
    text: str
    task: str | None = None
    kind: str = "attempt"


_JOB_RESTART = re.compile(r"restarting the whole job \(restart (\d+) of")
_TASK_RESTART = re.compile(r"^restarting ([a-z]+:\d+)@\S*.*: restart (\d+) of")


def attempt_starts(journal: Sequence[Mapping[str, Any]]) -> list[Begin]:
    """Every attempt's and restart's beginning that up's journal tells (the steps it printed:
    watch/loop.py, up/recovery.py, up/restarts.py), in time order."""
    found = []
    for entry in journal:
        text, t = entry.get("text", ""), entry.get("t")
        if not isinstance(text, str) or not isinstance(t, int | float):
            continue
        if job := _JOB_RESTART.search(text):
            found.append(Begin(float(t), f"attempt {job.group(1)}"))
        elif task := _TASK_RESTART.search(text):
            name = task.group(1)
            found.append(Begin(float(t), f"{name} restart {task.group(2)}", name, "restart"))
    return sorted(found, key=lambda b: b.t)


class _Task:
    """One task's records as they stream by: which begin comes next, and how many have
    passed (a series' line breaks where that count changed since its point before)."""

    def __init__(self, begins: Sequence[Begin], name: str) -> None:
        self.begins = [b for b in begins if b.task in (None, name)]
        self.next = 0
        self.passed = 0
        self.at: dict[int, float] = {}  # begin index (in `begins` of the run) -> its x here
        self.index = {id(b): i for i, b in enumerate(begins)}

    def record(self, t: object, x: float) -> None:
        """A record at time t (when it has one) and x: the begins it comes after are marked
        at its x."""
        if not isinstance(t, int | float):
            return
        while self.next < len(self.begins) and t >= self.begins[self.next].t:
            self.at[self.index[id(self.begins[self.next])]] = x
            self.next += 1
            self.passed += 1


@dataclass
class _Series:
    line: charts.Line
    passed: int = 0


def _marks(begins: Sequence[Begin], tasks: Iterable[_Task]) -> list[charts.Mark]:
    """Each begin at the lowest x a task recorded after it (its first step of the attempt)."""
    xs: dict[int, float] = {}
    for task in tasks:
        for i, x in task.at.items():
            xs[i] = min(x, xs.get(i, x))
    return [charts.Mark(x, begins[i].text, begins[i].kind) for i, x in sorted(xs.items())]


def _add(series: _Series, task: _Task, x: float, y: float) -> None:
    series.line.add(x, y, brk=series.passed != task.passed)
    series.passed = task.passed


def metric_charts(
    tasks: Sequence[str],
    records: Mapping[str, Iterable[Mapping[str, Any]]],
    begins: Sequence[Begin],
) -> str:
    """One chart per metric name (at most METRIC_CHARTS; loss first, then by name), and one of
    steps/s, each with every task's series overlaid; each task's records streamed once."""
    points = charts.share(len(tasks))
    lines: dict[str, dict[str, _Series]] = {}
    rates: dict[str, _Series] = {}
    states: dict[str, _Task] = {}
    unplotted: set[str] = set()
    for name in tasks:
        state = states[name] = _Task(begins, name)
        window: deque[tuple[float, float]] = deque(maxlen=RATE_SPAN + 1)
        rate = rates[name] = _Series(charts.Line(points))
        for record in records.get(name, ()):
            x = _number(record.get("step"))
            if x is None:
                continue
            before = state.passed
            t = _number(record.get("time"))
            state.record(t, x)
            if state.passed != before or (window and x < window[-1][0]):
                window.clear()  # a rate across an attempt's start or a step back is none
            if t is not None:
                window.append((x, t))
                (s0, t0), (s1, t1) = window[0], window[-1]
                if t1 > t0 and s1 >= s0:
                    _add(rate, state, x, (s1 - s0) / (t1 - t0))
            for key, value in record.items():
                y = _number(value)
                if key in NOT_METRICS or y is None:
                    continue
                by_task = lines.get(key)
                if by_task is None:
                    if len(lines) >= METRIC_CHARTS:
                        if len(unplotted) < 1000:
                            unplotted.add(key)
                        continue
                    by_task = lines[key] = {}
                series = by_task.get(name)
                if series is None:
                    series = by_task[name] = _Series(charts.Line(points), state.passed)
                _add(series, state, x, y)
    marks = _marks(begins, states.values())
    order = sorted(lines, key=lambda k: (k != "loss", k.lower(), k))
    figures = [_overlay(metric, metric, tasks, lines[metric], marks, "step") for metric in order]
    figures.append(_overlay("steps_per_s", "steps/s", tasks, rates, marks, "step"))
    more = (
        f"<p class='unplotted'>{len(unplotted)} more metric names, not charted (a page charts "
        f"{METRIC_CHARTS}): {_e(', '.join(sorted(unplotted)[:40]))}</p>"
        if unplotted
        else ""
    )
    return f"<div class='charts'>{''.join(figures)}</div>{more}"


def usage_charts(
    tasks: Sequence[str],
    samples: Mapping[str, Iterable[Mapping[str, Any]]],
    begins: Sequence[Begin],
    began: float,
) -> str:
    """CPU, RSS and GPU use over the run's time (seconds, minutes or hours since it began),
    every task overlaid, attempts marked at their time."""
    points = charts.share(len(tasks))
    lines: dict[str, dict[str, _Series]] = {key: {} for key, _ in RESOURCES}
    states: dict[str, _Task] = {}
    t0: float | None = began or None
    for name in tasks:
        state = states[name] = _Task(begins, name)
        for sample in samples.get(name, ()):
            t = _number(sample.get("t"))
            if t is None:
                continue
            t0 = t if t0 is None else t0
            state.record(t, t - t0)
            for key, _ in RESOURCES:
                y = _number(sample.get(key))
                if y is not None:
                    series = lines[key].get(name)
                    if series is None:
                        series = lines[key][name] = _Series(charts.Line(points), state.passed)
                    _add(series, state, t - t0, y)
    first = t0 or 0.0
    begun = [charts.Mark(b.t - first, b.text, b.kind) for b in begins if b.t >= first]
    spans = [s.line.span() for by in lines.values() for s in by.values()]
    end = max((span[1] for span in spans if span), default=0.0)
    unit, scale = ("h", 3600.0) if end > 3 * 3600 else ("min", 60.0) if end > 300 else ("s", 1.0)
    figures = []
    for key, title in RESOURCES:
        if not lines[key] and key.startswith("gpu"):
            continue
        fmt: Callable[[float, float], str] = (
            (lambda v, _step: human_size(v)) if key in ("rss", "gpu_mem") else charts.label
        )
        scaled = {n: _Series(_rescaled(s.line, scale)) for n, s in lines[key].items()}
        marks = [charts.Mark(m.x / scale, m.text, m.kind) for m in begun]
        figures.append(_overlay(key, title, tasks, scaled, marks, f"{unit} since start", fmt))
    return f"<div class='charts'>{''.join(figures)}</div>"


def _rescaled(line: charts.Line, scale: float) -> charts.Line:
    """The line with its x in another unit (the buckets are kept, their points divided)."""
    if scale == 1.0:
        return line
    out = charts.Line(line.points)
    out.seen, out.width = line.seen, line.width / scale
    out.buckets = [
        charts._Bucket(
            b.key,
            b.broken,
            (b.lo[0], b.lo[1] / scale, b.lo[2]),
            (b.hi[0], b.hi[1] / scale, b.hi[2]),
        )
        for b in line.buckets
    ]
    span = line.span()
    if span:
        out._lo, out._hi = span[0] / scale, span[1] / scale
    return out


def _overlay(
    metric: str,
    title: str,
    tasks: Sequence[str],
    series: Mapping[str, _Series],
    marks: Sequence[charts.Mark],
    xlabel: str,
    fmt: Callable[[float, float], str] = charts.label,
) -> str:
    drawn = [
        charts.Drawn(name, charts.colour(i), series[name].line)
        for i, name in enumerate(tasks)
        if name in series
    ]
    return charts.chart(metric, title, drawn, marks, xlabel, fmt)


def _number(value: object) -> float | None:
    """A finite number of a record, or None (a record read from disk is checked already; one
    handed in whole may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _skipped(
    metrics: Mapping[str, metricstore.Series],
    usage: Mapping[str, metricstore.Series],
    journal: metricstore.Series,
) -> str:
    """What the page could not show: the lines each task wrote that the edge dropped (no
    record: docs/metrics.md), and the stored lines that were damaged, named."""
    dropped = [f"{task}: {s.dropped}" for task, s in metrics.items() if s.dropped]
    every = [*metrics.values(), *usage.values(), journal]
    damaged = [line for s in every for line in s.damage]
    count = sum(s.damaged for s in every)
    items = []
    if dropped:
        items.append(
            "<li class='dropped'>metrics lines dropped (not a record tfdeploy reads: not JSON, "
            f"over 2 kB, nested, no whole step): {_e(', '.join(dropped))}</li>"
        )
    if count:
        named = "".join(f"<li>{_e(line)}</li>" for line in damaged)
        items.append(f"<li class='damaged'>damaged records skipped: {count}<ul>{named}</ul></li>")
    return f"<h2>Skipped</h2><ul class='skipped'>{''.join(items)}</ul>" if items else ""


def _facts(facts: dict[str, Any], outcome: dict[str, Any], cost: RunCost | None = None) -> str:
    began, ended = facts["began"], outcome["ended"]
    rows = [
        ("job", facts.get("job")),
        ("inventory", facts.get("inventory")),
        ("command", facts.get("command")),
        ("image", facts["image"] or "-"),
        ("environment", ", ".join(facts["requirements"]) or "the hosts' own Python"),
        ("hosts", ", ".join(f"{h['name']} ({h['address']})" for h in facts["hosts"])),
        ("started", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(began)) if began else "-"),
        ("duration", duration(ended - began) if began and ended else "-"),
        ("outcome", f"{outcome['outcome']} {outcome['why']}".strip()),
        *_restart_rows(outcome),
        *([("cost", cost.line())] if cost else []),
    ]
    table = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    exits = {**facts["exits"], **outcome["exits"]}
    tasks = "".join(
        f"<tr><td>{_e(t['name'])}</td><td>{_e(t['host'])}</td>"
        f"<td>{_e(exits.get(t['name']) or '-')}</td><td><code>{_e(t['tf_config'])}</code></td>"
        f"<td><code>{_e(json.dumps(t['env']))}</code></td></tr>"
        for t in facts["tasks"]
    )
    return (
        f"<table class='facts'>{table}</table><h2>Tasks</h2><table class='tasks'>"
        "<tr><th>task</th><th>host</th><th>exit</th><th>TF_CONFIG</th><th>env</th></tr>"
        f"{tasks}</table>"
    )


def _cost_table(cost: RunCost | None) -> str:
    """Each instance of the run (its group, type, market and zone, the time it counted for, its
    cost and the price's source, or why it has none), each group's sum after its instances, and
    above them the total with when it was priced."""
    if cost is None:
        return ""
    rows = []
    for g in cost.groups:
        rows += [_instance_row(g.group, m) for m in g.machines]
        summed = usd_text(g.usd) if g.usd is not None else f"unknown: {g.unknown}"
        rows.append((g.group, "all", g.describe(), "", "", summed, ", ".join(g.sources) or "-"))
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    head = "".join(f"<th>{h}</th>" for h in COST_COLUMNS)
    total = f"{cost.cell()} in all" if cost.usd is not None else cost.line()
    running = ", so far: the run goes on" if cost.running else ""
    return (
        f"<h2>Cost</h2><p>{_e(total)}, priced {_e(stamp(cost.priced_at))}{running}</p>"
        f"<table class='cost'><tr>{head}</tr>{body}</table>"
    )


COST_COLUMNS = ("group", "instance", "type", "zone", "counted", "USD", "price")


def _instance_row(group: str, m: MachineCost) -> tuple[str, ...]:
    spent = usd_text(m.usd) if m.usd is not None else f"unknown: {m.unknown}"
    counted = duration(m.hours * 3600)
    return (group, m.id, f"{m.kind}, {m.market}", m.zone, counted, spent, m.source or "-")


def _restart_rows(outcome: dict[str, Any]) -> list[tuple[str, str]]:
    """Each of the keeper's newest restarts in words, after their count when it made more
    than the history lists (the newest 20)."""
    listed = outcome["recoveries"]
    rows = [("recovery", line) for line in listed]
    if outcome["restarts"] > len(listed):
        rows.insert(0, ("restarts", f"{outcome['restarts']} (the newest {len(listed)} below)"))
    return rows


def _timeline(
    facts: dict[str, Any], journal: Sequence[dict[str, Any]], outcome: dict[str, Any]
) -> str:
    began = facts.get("began") or (journal[0]["t"] if journal else 0)
    starts, ends = facts.get("started_at") or {}, facts.get("ended_at") or {}
    end = outcome.get("ended") or max([*ends.values(), began + 1], key=lambda v: v or 0)
    span = max(1.0, end - began)
    names = [t["name"] for t in facts.get("tasks", [])]
    height = 30 + 22 * len(names) + 20

    def sx(t: float) -> float:
        return float(120 + (t - began) / span * (W * 1.6 - 130))

    rows = []
    for i, name in enumerate(names):
        y = 30 + 22 * i
        s, e = starts.get(name), ends.get(name) or end
        rows.append(f"<text x='4' y='{y + 12}'>{_e(name)}</text>")
        if s:
            rows.append(
                f"<rect class='task' x='{sx(s):.1f}' y='{y}' width='{max(1, sx(e) - sx(s)):.1f}'"
                f" height='16'><title>{_e(name)}: {duration(e - s)}</title></rect>"
            )
    marks = []
    for entry in journal:
        x = sx(entry.get("t", began))
        marks.append(
            f"<line class='phase' x1='{x:.1f}' y1='12' x2='{x:.1f}' y2='{height - 10}'>"
            f"</line><circle class='mark' cx='{x:.1f}' cy='12' r='3'><title>"
            f"{_e(duration(entry.get('t', began) - began))}: {_e(entry.get('text', ''))}"
            "</title></circle>"
        )
    listing = "".join(
        f"<li><b>+{_e(duration(e.get('t', began) - began))}</b> {_e(e.get('text', ''))}</li>"
        for e in journal
        if e.get("kind") in ("step", "phase")
    )
    return (
        f"<svg class='timeline' width='{W * 1.6:.0f}' height='{height}'>{''.join(marks)}"
        f"{''.join(rows)}</svg><details><summary>up's steps</summary><ul>{listing}</ul></details>"
    )


CSS = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:24px}
table{border-collapse:collapse}th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}code{font-size:11px;word-break:break-all}.tasks td:nth-child(4){max-width:420px}
svg text{font-size:10px;fill:#555}.task{fill:#8fbc8f}.phase{stroke:#f0a030;stroke-dasharray:2 3}
.mark{fill:#f0a030}.foot{color:#888;font-size:11px;margin-top:30px}
"""
