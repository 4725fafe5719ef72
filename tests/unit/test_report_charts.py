"""The report page's charts (deployer/api/charts.py, deployer/api/reportpage.py): round ticks,
downsampling that keeps each bucket's extremes, lines broken across gaps and attempts, marks
where up's journal says an attempt began, escaping, and a page bounded whatever the run's
length (issue 62)."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest

from deployer.api import charts, reportpage
from deployer.results import metricstore, runstore

JOB_RESTART = (
    "worker:1@h2 exit code 3: restarting the whole job (restart 1 of 3, TFDEPLOY_ATTEMPT=1), "
    "by up, after stopping every task"
)


def test_ticks_are_round_and_cover_the_range() -> None:
    assert charts.ticks(0, 1000) == [0, 200, 400, 600, 800, 1000]
    assert charts.ticks(3, 997) == [0, 200, 400, 600, 800, 1000]
    assert charts.ticks(0.013, 0.87, 4) == [0, 0.25, 0.5, 0.75, 1.0]
    assert charts.ticks(0.1, 0.3) == [0.1, 0.15, 0.2, 0.25, 0.3]  # no 0.30000000000000004
    assert charts.ticks(-3.2, 7.9) == [-5, -2.5, 0, 2.5, 5, 7.5, 10]
    assert charts.ticks(5, 5) == [4.4, 4.6, 4.8, 5.0, 5.2, 5.4, 5.6]  # a flat series: a range
    assert charts.ticks(0, 0) == [-1.0, -0.5, 0.0, 0.5, 1.0]
    assert charts.ticks(0, 1_000_000) == [0, 200_000, 400_000, 600_000, 800_000, 1_000_000]
    assert charts.ticks(math.nan, 1) == []


def test_tick_labels_are_readable() -> None:
    assert [charts.label(t, 200_000) for t in (0, 200_000, 1_000_000)] == ["0", "200k", "1M"]
    assert charts.label(2_500_000, 500_000) == "2.5M"
    assert charts.label(3e9, 1e9) == "3G"
    assert [charts.label(t, 0.25) for t in (0.25, 0.5)] == ["0.25", "0.50"]
    assert charts.label(0.2, 0.05) == "0.20" and charts.label(600, 200) == "600"
    assert charts.label(4e-5, 1e-5) == "4e-05"
    assert charts.label(1500, 500) == "1500"  # under 10,000: the number as it is


def test_downsampling_keeps_every_spike_and_a_bounded_count() -> None:
    """1,000,000 points of a smooth curve with a one-step spike up and one down: at most
    `points` kept, both spikes among them, first and last x kept, in bounded time."""
    line = charts.Line(500)
    began = time.monotonic()
    for s in range(1_000_000):
        y = 1.0 / (s + 1)
        if s == 123_457:
            y = 50.0
        elif s == 876_543:
            y = -7.0
        line.add(float(s), y)
    spent = time.monotonic() - began
    [run] = line.segments()
    ys = [y for _, y in run]
    assert len(run) <= 500 and line.seen == 1_000_000
    assert (123_457.0, 50.0) in run and (876_543.0, -7.0) in run
    assert max(ys) == 50.0 and min(ys) == -7.0
    assert run[0][0] == 0.0 and run[-1][0] >= 999_000
    assert [x for x, _ in run] == sorted(x for x, _ in run)  # in the order they came
    assert spent < 30, spent


def test_a_short_series_is_kept_whole() -> None:
    line = charts.Line(500)
    for s in range(1, 38):
        line.add(float(s), 2.0 / s)
    assert line.segments() == [[(float(s), 2.0 / s) for s in range(1, 38)]]


def test_a_line_breaks_at_a_gap_a_step_back_and_an_attempt_never_inside_a_run() -> None:
    line = charts.Line(500)
    for s in range(0, 100):
        line.add(float(s), 1.0)
    for s in range(300, 400):  # no records from 100 to 299: a gap
        line.add(float(s), 2.0)
    for s in range(350, 500):  # resumed from an earlier checkpoint: x goes back
        line.add(float(s), 3.0)
    for s in range(500, 520):
        line.add(float(s), 4.0, brk=s == 500)  # an attempt began here
    runs = line.segments()
    assert [(r[0][0], r[-1][0]) for r in runs] == [(0, 99), (300, 399), (350, 499), (500, 519)]
    steady = charts.Line(500)  # irregular but gapless spacing breaks nothing
    x = 0.0
    for i in range(2000):
        x += 1 + (i % 7)
        steady.add(x, 0.5)
    assert len(steady.segments()) == 1


def test_gaps_survive_downsampling_and_too_many_are_merged_within_the_bound() -> None:
    line = charts.Line(100)
    for block in range(20):  # 20 blocks of 10,000 steps, 5,000 apart
        for s in range(10_000):
            line.add(block * 15_000.0 + s, float(s % 97))
    assert len(line.segments()) == 20
    assert sum(map(len, line.segments())) <= 100
    many = charts.Line(100)
    for block in range(5_000):  # more gaps than points: bounded all the same
        for s in range(3):
            many.add(block * 100.0 + s, 1.0)
    assert sum(map(len, many.segments())) <= 100


def test_non_finite_numbers_are_skipped() -> None:
    line = charts.Line(500)
    for x, y in ((1, 1.0), (2, math.nan), (3, math.inf), (math.inf, 1.0), (4, -math.inf), (5, 2.0)):
        line.add(float(x), y)
    assert line.segments() == [[(1.0, 1.0), (5.0, 2.0)]]
    page = _page({"worker:0": [{"step": 1, "loss": math.nan}, {"step": 2, "loss": 0.5}]})
    assert "nan" not in page.lower() and "inf" not in page.replace("info", "")


def test_attempts_and_restarts_are_read_from_ups_journal() -> None:
    journal = [
        {"t": 50.0, "kind": "step", "text": JOB_RESTART},
        {"t": 20.0, "kind": "step", "text": "restarting worker:0@h1 (exit code 1): restart 2 of 3"},
        {"t": 30.0, "kind": "step", "text": "restarting worker:0@h1 failed: host gone"},
        {"t": 40.0, "kind": "step", "text": "started 2 tasks"},
        {"t": "x", "kind": "step", "text": JOB_RESTART},
    ]
    assert reportpage.attempt_starts(journal) == [
        reportpage.Begin(20.0, "worker:0 restart 2", "worker:0", "restart"),
        reportpage.Begin(50.0, "attempt 1"),
    ]


def _page(
    metrics: dict[str, list[dict[str, object]]],
    journal: tuple[dict[str, object], ...] = (),
    tasks: tuple[str, ...] = ("worker:0", "worker:1"),
) -> str:
    facts = reportpage.sane_facts({"began": 1000.0, "tasks": [{"name": t} for t in tasks]})
    return reportpage.render_page(
        "run-1",
        facts,
        reportpage.sane_outcome({}),
        {},
        {},
        metricstore.Series(journal),
        reportpage.Streams(metrics, {}),
    )


def _chart(page: str, metric: str) -> str:
    found = re.findall(rf"<svg class='chart' data-metric='{metric}'.*?</svg>", page, re.S)
    assert len(found) == 1, found
    return str(found[0])


def test_one_chart_per_metric_every_task_overlaid_with_the_attempt_marked() -> None:
    def records(offset: float) -> list[dict[str, object]]:
        first = [{"step": s, "loss": 1 / s + offset, "time": 1000.0 + s} for s in range(1, 11)]
        again = [  # attempt 1 began at t=1020; its steps go on from the checkpoint, step 8
            {"step": s, "loss": 1 / s, "accuracy": s / 30, "time": 1020.0 + s} for s in range(8, 30)
        ]
        return first + again

    journal = ({"t": 1020.0, "kind": "step", "text": JOB_RESTART},)
    page = _page({"worker:0": records(0), "worker:1": records(0.5)}, journal)
    assert re.findall(r"<svg class='chart' data-metric='([^']+)'", page) == [
        "loss",
        "accuracy",
        "steps_per_s",
        "cpu",
        "rss",
    ]
    loss = _chart(page, "loss")
    paths = re.findall(
        r"<path class='series' data-task='([^']+)' data-points='(\d+)' "
        r"data-segments='(\d+)' stroke='([^']+)'",
        loss,
    )
    assert [(t, int(n), int(k)) for t, n, k, _ in paths] == [
        ("worker:0", 32, 2),
        ("worker:1", 32, 2),
    ]
    assert paths[0][3] != paths[1][3]  # each task its colour
    assert "<g class='mark attempt' data-x='8'>" in loss  # its first step after the restart
    assert ">attempt 1<" in loss
    assert loss.count("class='pt'") == 64
    assert len(re.findall(r"<text class='xt'", loss)) >= 3  # ticks, labelled
    legend = page.split("data-metric='loss'")[1].split("</figure>")[0]
    assert "<li data-task='worker:0'>" in legend and "<li data-task='worker:1'>" in legend
    accuracy = _chart(page, "accuracy")
    assert accuracy.count("<path class='series'") == 2 and "attempt 1" in accuracy


def test_texts_from_tasks_are_escaped() -> None:
    hostile = "<script>alert(1)</script>"
    page = _page(
        {"worker:0": [{"step": 1, hostile: 1.0}, {"step": 2, hostile: 2.0}]},
        ({"t": 1001.0, "kind": "step", "text": hostile},),
        tasks=("worker:0", f"ps:0{hostile}"),
    )
    assert "<script" not in page
    assert "data-metric='&lt;script&gt;alert(1)&lt;/script&gt;'" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in _chart(
        page, "&lt;script&gt;alert\\(1\\)&lt;/script&gt;"
    ).replace("data-metric", "")
    quote = "a'b\" onload='x"
    assert "onload='x" not in _page({"worker:0": [{"step": 1, quote: 1.0}]})


def test_charts_are_bounded_by_names_too() -> None:
    """A task that names a new metric in every record gets METRIC_CHARTS charts, the rest
    counted."""
    records = [{"step": s, f"m{s}": 1.0} for s in range(200)]
    page = _page({"worker:0": records})
    assert page.count("<svg class='chart'") == reportpage.METRIC_CHARTS + 3  # steps/s, cpu, rss
    assert "176 more metric names, not charted" in page


@pytest.mark.slow
def test_a_page_of_a_million_records_a_task_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 tasks x 1,000,000 records through the store as `up` writes them, each with a loss
    spike: the page is under 2 MB, written in bounded time, and draws the spikes."""
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    run_id = "big-20261201T000000Z-aaaa"
    tasks = [{"name": "worker:0"}, {"name": "worker:1"}]
    runstore.write_facts(run_id, {"began": 1.7e9, "tasks": tasks})
    runstore.write_outcome(run_id, {"outcome": "succeeded", "ended": 1.8e9})
    total, batch = 1_000_000, 20_000
    for task in ("worker:0", "worker:1"):
        for start in range(0, total, batch):
            records = [
                {
                    "step": s,
                    "loss": 99.0 if s == total - 3 else 1 / (s + 1),
                    "accuracy": s / total,
                    "time": 1.7e9 + s / 10,
                }
                for s in range(start, start + batch)
            ]
            runstore.append_metrics(run_id, task, records)
    began = time.monotonic()
    page = reportpage.write_report(run_id).read_text()
    spent = time.monotonic() - began
    assert len(page.encode()) < 2_000_000, len(page)
    assert spent < 30, spent
    loss = _chart(page, "loss")
    counts = [int(n) for n in re.findall(r"data-points='(\d+)'", loss)]
    assert len(counts) == 2 and max(counts) <= charts.POINTS
    assert ">1M<" in loss  # the step axis reaches the last step, labelled
    assert re.search(r"<text class='yt'[^>]*>100<", loss)  # the spike is drawn: y up to 100
    print(f"page of 2 tasks x {total} records: {len(page.encode())} bytes in {spent:.2f} s")
