"""`tfdeploy report RUN`: one self-contained HTML page of a run, made from what this machine
kept (results/metricstore.py): its facts, each task's curves, resources and a timeline.

Plotting: hand-written inline SVG, no library. A charting library would cost an install
(matplotlib ~40 MB with numpy; plotly's offline bundle puts ~3.5 MB of JavaScript into every
page) for what is a few polylines; SVG opens from disk in any browser, needs no script and no
CDN, and a page of 8 tasks x 4 charts of 1,000 points stays under 2 MB. Each reported point
of a curve is one `<circle class="pt">`, which is what the browser test counts.

Bounded whatever the run's length: each series is read downsampled to POINTS_DRAWN points
(evenly over the run, first and last kept: results/metricstore.py), more than a 510-pixel-wide
chart can show apart, so a week-long run's page is the size of an hour's. What the store could
not read (a damaged line, named) and the lines the edge dropped are said under "Skipped".
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deployer.core.errors import UsageError
from deployer.core.text import duration, human_size
from deployer.results import metricstore
from deployer.results.archive import run_dir

W, H, PAD = 560, 180, 40
POINTS_DRAWN = metricstore.POINTS  # a series is read downsampled to this many points at most
RATE_SPAN = 10  # records a steps/s point is measured over


def write_report(run_id: str, out: Path | None = None) -> Path:
    directory = run_dir(run_id)
    facts = metricstore.read_json(directory, "facts.json")
    if not isinstance(facts, dict) and (directory / "facts.json").exists():
        raise UsageError(
            f"run {run_id}'s facts on this machine are damaged ({directory}/facts.json is not "
            "a JSON object: cut short, nested too deep, or edited)",
            hint="the page needs the run's facts, which `up` wrote when it started: restore the "
            "file from a backup, or see the run's logs (`tfdeploy logs RUN_ID`)",
        )
    if not isinstance(facts, dict):
        raise UsageError(
            f"run {run_id} has no facts on this machine ({directory}/facts.json)",
            hint="`tfdeploy runs` lists the runs this machine keeps; a report needs a run "
            "that `up` carried to its hosts from here",
        )
    page = render_page(
        run_id,
        sane_facts(facts),
        sane_outcome(metricstore.read_object(directory, "outcome.json")),
        metricstore.read(directory, "metrics"),
        metricstore.read(directory, "usage"),
        metricstore.journal(directory),
    )
    target = out or directory / "report.html"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a run's facts: private
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(page)
    return target


def sane_facts(raw: dict[str, Any]) -> dict[str, Any]:
    """facts.json as the page reads it: every field of its type, or left out. The file is this
    machine's, but a person or a full disk may have changed it: a field that is not what `up`
    writes is a blank on the page, never an error."""
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
    """outcome.json as the page reads it (see sane_facts)."""
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


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_page(
    run_id: str,
    facts: dict[str, Any],
    outcome: dict[str, Any],
    metrics: Mapping[str, metricstore.Series],
    usage: Mapping[str, metricstore.Series],
    journal: metricstore.Series,
) -> str:
    """The page of sane facts and outcome (sane_facts, sane_outcome) and the series as the
    store reads them (downsampled, checked: results/metricstore.py)."""
    entries = journal.records
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>tfdeploy report {_e(run_id)}</title><style>{CSS}</style></head><body>",
        f"<h1>Run {_e(run_id)}</h1>",
        _facts(facts, outcome),
        _skipped(metrics, usage, journal),
        "<h2>Timeline</h2>",
        _timeline(facts, entries, outcome),
    ]
    empty = metricstore.Series()
    for task in [t["name"] for t in facts["tasks"]]:
        records, samples = metrics.get(task, empty).records, usage.get(task, empty).records
        parts.append(f"<h2>{_e(task)}</h2><div class='charts'>")
        parts.append(_chart(task, "loss", _xy(records, "step", "loss"), "step", "loss"))
        parts.append(_chart(task, "steps_per_s", _rates(records), "step", "steps/s"))
        t0 = samples[0]["t"] if samples else 0
        for key, label in (("cpu", "CPU %"), ("rss", "RSS"), ("gpu_util", "GPU %")):
            points = [(s["t"] - t0, s[key]) for s in samples if key in s]
            if points or key != "gpu_util":
                parts.append(_chart(task, key, points, "seconds", label))
        parts.append("</div>")
    parts.append(
        f"<p class='foot'>made by tfdeploy report at "
        f"{_e(time.strftime('%Y-%m-%d %H:%M:%S'))}</p></body></html>"
    )
    return "\n".join(parts)


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


def _facts(facts: dict[str, Any], outcome: dict[str, Any]) -> str:
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


def _restart_rows(outcome: dict[str, Any]) -> list[tuple[str, str]]:
    """Each of the keeper's newest restarts in words, after their count when it made more
    than the history lists (the newest 20)."""
    listed = outcome["recoveries"]
    rows = [("recovery", line) for line in listed]
    if outcome["restarts"] > len(listed):
        rows.insert(0, ("restarts", f"{outcome['restarts']} (the newest {len(listed)} below)"))
    return rows


def _xy(records: Sequence[dict[str, Any]], x: str, y: str) -> list[tuple[float, float]]:
    return [(float(r[x]), float(r[y])) for r in records if x in r and y in r]


def _rates(records: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """Steps per second at each record, over the RATE_SPAN records before it: a step's own
    time is a few ms of jitter, and a curve of per-step rates is noise."""
    timed = [r for r in records if "time" in r and "step" in r]
    rates = []
    for i in range(1, len(timed)):
        a, b = timed[max(0, i - RATE_SPAN)], timed[i]
        if b["time"] > a["time"] and b["step"] >= a["step"]:
            rates.append((float(b["step"]), (b["step"] - a["step"]) / (b["time"] - a["time"])))
    return rates


def _chart(task: str, metric: str, points: list[tuple[float, float]], xl: str, yl: str) -> str:
    head = f"<figure><figcaption>{_e(yl)}</figcaption>"
    attrs = f"class='chart' data-task='{_e(task)}' data-metric='{_e(metric)}'"
    if not points:
        return (
            f"{head}<svg {attrs} width='{W}' height='40'><text x='10' y='25'>no data"
            "</text></svg></figure>"
        )
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def sx(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (W - PAD - 10)

    def sy(y: float) -> float:
        return H - 25 - (y - y0) / (y1 - y0) * (H - 40)

    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    dots = (
        "".join(
            f"<circle class='pt' cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='1.6'/>" for x, y in points
        )
        if len(points) <= POINTS_DRAWN
        else ""
    )
    fmt = human_size if metric == "rss" else (lambda v: f"{v:.4g}")
    axes = (
        f"<line x1='{PAD}' y1='{H - 25}' x2='{W - 10}' y2='{H - 25}' class='ax'/>"
        f"<line x1='{PAD}' y1='15' x2='{PAD}' y2='{H - 25}' class='ax'/>"
        f"<text x='2' y='20'>{_e(fmt(y1))}</text><text x='2' y='{H - 25}'>{_e(fmt(y0))}</text>"
        f"<text x='{PAD}' y='{H - 8}'>{_e(f'{x0:g}')}</text>"
        f"<text x='{W - 60}' y='{H - 8}'>{_e(f'{x1:g}')} {_e(xl)}</text>"
    )
    return (
        f"{head}<svg {attrs} data-points='{len(points)}' width='{W}' height='{H}' "
        f"viewBox='0 0 {W} {H}'>{axes}<polyline points='{line}'/>{dots}</svg></figure>"
    )


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
.charts{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0}figcaption{font-size:12px;color:#555}
svg text{font-size:10px;fill:#555}polyline{fill:none;stroke:#1f77b4;stroke-width:1.5}
.pt{fill:#1f77b4}.ax{stroke:#999}.task{fill:#8fbc8f}.phase{stroke:#f0a030;stroke-dasharray:2 3}
.mark{fill:#f0a030}.foot{color:#888;font-size:11px;margin-top:30px}
"""
