"""`tfdeploy report`: the page loads in real headless Chromium (Debian's package) from disk,
with no console error, and its loss curve has one point per reported step."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deployer.api.reportpage import write_report
from deployer.results import metricstore
from deployer.results.archive import run_dir

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
    directory = run_dir(run_id)
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
    facts = {
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
    metricstore.write_json(directory, "facts.json", facts)
    metricstore.write_json(directory, "outcome.json", {"outcome": "succeeded", "ended": 1061.0})
    for task in ("worker:0", "worker:1"):
        records = [{"step": s, "loss": 2.0 / s, "time": 1001.0 + s} for s in range(1, STEPS + 1)]
        metricstore.append(directory, "metrics", task, records)
        metricstore.append(
            directory,
            "usage",
            task,
            [{"t": 1001.0 + s, "cpu": 50.0 + s, "rss": 1e8 + s} for s in range(10)],
        )
    metricstore.append(directory, "", "journal", [{"t": 1000.5, "kind": "step", "text": "a <b>"}])
    return run_id


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/install.sh)")
def test_report_page_loads_without_errors_and_has_every_point(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    page = write_report(_run(tmp_path / "state"), tmp_path / "report.html")
    assert "http://" not in page.read_text() and "https://" not in page.read_text()  # no CDN
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    charts = re.findall(
        r'<svg class="chart" data-task="worker:0" data-metric="loss".*?</svg>', done.stdout, re.S
    )
    assert len(charts) == 1
    assert charts[0].count('class="pt"') == STEPS
    assert "a &lt;b&gt;" in done.stdout  # the journal's text is escaped, not markup


def test_report_of_a_run_without_facts_is_a_usage_error(tmp_path, monkeypatch):
    from deployer.core.errors import UsageError

    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path))
    with pytest.raises(UsageError, match="no facts"):
        write_report("nothing-here")
