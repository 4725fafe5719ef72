"""`tfdeploy report`: the page loads in real headless Chromium (Debian's package) from disk,
with no console error; its loss chart overlays every task with one point per reported step;
and the page of a real lab run (2 stand-in workers, one failing, the job restarted whole: a
second attempt) has one chart per metric, a line per task and the attempt marked (issue 62)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deployer.api.reportpage import write_report
from deployer.results import runstore
from tests.lab import Lab
from tests.support import standin
from tests.support.faults import tfdeploy

CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]
STEPS = 37


def _run(state: Path) -> str:
    run_id = "digits-20261128T000000Z-abcd"
    tasks = [
        {
            "name": f"worker:{i}",
            "host": f"h{i + 1}",
            "command": "python3 mwms.py",
            "gpus": [],
            "tf_config": '{"cluster": {}}',
            "env": {"TOKEN": "***"},
        }
        for i in range(2)
    ]
    facts: runstore.Facts = {
        "job": "digits",
        "inventory": "/x.toml",
        "began": 1000.0,
        "command": "python3 m.py",
        "hosts": [{"name": "h1", "address": "10.0.0.1"}, {"name": "h2", "address": "10.0.0.2"}],
        "tasks": tasks,
        "exits": {"worker:0": "exit code 0"},
        "started_at": {"worker:0": 1001.0, "worker:1": 1001.5},
        "ended_at": {"worker:0": 1060.0, "worker:1": 1060.0},
    }
    runstore.write_facts(run_id, facts)
    runstore.write_outcome(run_id, {"outcome": "succeeded", "ended": 1061.0})
    for task in ("worker:0", "worker:1"):
        records = [{"step": s, "loss": 2.0 / s, "time": 1001.0 + s} for s in range(1, STEPS + 1)]
        runstore.append_metrics(run_id, task, records)
        runstore.append_usage(
            run_id, task, [{"t": 1001.0 + s, "cpu": 50.0 + s, "rss": 1e8 + s} for s in range(10)]
        )
    runstore.append_journal(run_id, [{"t": 1000.5, "kind": "step", "text": "a <b>"}])
    return run_id


def _dom(page: Path, profile: Path) -> str:
    """The page as headless Chromium loaded it from disk (its DOM, serialized), after checking
    it logged no console error."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    return done.stdout


def _chart(dom: str, metric: str) -> str:
    charts = re.findall(rf'<svg class="chart" data-metric="{metric}".*?</svg>', dom, re.S)
    assert len(charts) == 1, f"{len(charts)} charts of {metric}"
    return str(charts[0])


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/install.sh)")
def test_report_page_loads_without_errors_and_has_every_point(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    page = write_report(_run(tmp_path / "state"), tmp_path / "report.html")
    assert "http://" not in page.read_text() and "https://" not in page.read_text()  # no CDN
    dom = _dom(page, tmp_path / "profile")
    loss = _chart(dom, "loss")
    for task in ("worker:0", "worker:1"):
        dots = loss.split(f'<g class="dots" data-task="{task}"')[1].split("</g>")[0]
        assert dots.count('class="pt"') == STEPS
    assert "a &lt;b&gt;" in dom  # the journal's text is escaped, not markup


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/install.sh)")
def test_the_report_of_a_restarted_lab_run_charts_each_metric_task_and_attempt(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """2 stand-in workers on 2 lab hosts; worker:1 fails at step 3 of its first attempt and the
    job is restarted whole (policy "restart-job"), both resuming from their checkpoints. The
    page of that run, in Chromium: one chart per metric the tasks wrote (loss) and the derived
    ones, each with a line per task, and the second attempt's mark on the step axis."""
    lab = clean_lab
    code = tmp_path / "code"
    standin.write(code)
    inventory = lab_inventory(
        [[{"role": "worker"}]] * 2,
        code=code,
        job={
            "name": "charted",
            "command": f"{lab.python} {standin.NAME} 8 --interval 0.2 --fail-at 3 "
            "--fail-task worker:1",
            "on_failure": "restart-job",
            "retry_exit_codes": [3],
            "restart_backoff": 1,
            "stop_grace": 2,
        },
    )
    state = tmp_path / "state"
    up = tfdeploy("up", str(inventory), state=state, timeout=240, check_rc=0)
    assert "restarting the whole job (restart 1 of" in up.stdout, up.stdout
    found = re.search(r"\(run (charted-\S+)\)$", up.stdout, re.M)
    assert found, up.stdout
    report = tfdeploy("report", found.group(1), state=state, check_rc=0)
    page = Path(report.stdout.strip().splitlines()[-1])
    assert "http://" not in page.read_text() and "https://" not in page.read_text()
    dom = _dom(page, tmp_path / "profile")
    metrics = re.findall(r'<svg class="chart" data-metric="([^"]+)"', dom)
    assert sorted(metrics) == ["cpu", "loss", "rss", "steps_per_s"], metrics
    loss = _chart(dom, "loss")
    paths = re.findall(r'<path class="series" data-task="([^"]+)" data-points="(\d+)"', loss)
    assert sorted(t for t, _ in paths) == ["worker:0", "worker:1"], paths
    assert all(int(n) >= 8 for _, n in paths), paths  # every step of 1 to 8, at least
    marks = re.findall(r'<g class="mark attempt" data-x="([^"]+)">.*?<text[^>]*>([^<]*)<', loss)
    assert [text for _, text in marks] == ["attempt 1"], loss
    assert 1 <= float(marks[0][0]) <= 8, marks  # at a step of the run
    # Not asked of the steps/s chart: there the mark was missing once under the full suite's
    # load (a rate needs two records, so that series may begin after the attempt's first step,
    # leaving the mark outside the chart's x range; marks are drawn only inside it).


def test_report_of_a_run_without_facts_is_a_usage_error(tmp_path, monkeypatch):
    from deployer.core.errors import UsageError

    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path))
    with pytest.raises(UsageError, match="no facts"):
        write_report("nothing-here")
