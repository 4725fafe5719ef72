"""The metrics channel: what a task writes (TFDEPLOY_METRICS), read by the agent in bounded
pieces, parsed at the reply edge as untrusted, and shown as steps/s and ETA."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from deployer.hosts.replies import metric_record
from deployer.watch.progress import PlainProgress, Progress
from deployer.watch.series import TaskSeries
from remote import protocol

REMOTE = Path(__file__).resolve().parents[2] / "remote"
sys.path.insert(0, str(REMOTE))
sys.path.insert(0, str(REMOTE / "taskside"))
import taskmetrics  # noqa: E402  (the agent's module, as hosts import it)
import tfdeploy_metrics  # noqa: E402  (the task-side helper, as tasks import it)


def test_the_helper_names_the_protocols_variable():
    """The helper is copied alone into each task's directory: it cannot import protocol.py."""
    assert tfdeploy_metrics.ENV == protocol.METRICS_ENV


def test_the_helper_is_installed_with_the_agent_and_imports_only_the_stdlib_at_import():
    from deployer.hosts.bootstrap import agent_files

    assert "tfdeploy_metrics.py" in agent_files()
    source = (REMOTE / "taskside" / "tfdeploy_metrics.py").read_text()
    top = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert top == ["import json", "import math", "import os", "import time"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"step": 3, "loss": 0.5}', {"step": 3.0, "loss": 0.5}),
        ('{"step": 3, "loss": NaN}', {"step": 3.0}),
        ('{"step": 3, "loss": 1e300}', {"step": 3.0}),
        ('{"step": 3, "bad name\\u001b[2J": 1}', {"step": 3.0}),
        ('{"step": 3, "acc": true, "s": "x"}', {"step": 3.0}),
        ('{"step": -1}', None),
        ('{"step": 1.5}', None),
        ('{"loss": 1}', None),
        ("[1, 2]", None),
        ("not json", None),
        ('{"step": 1, "x": ' + "1" * 3000 + "}", None),
    ],
)
def test_the_edge_keeps_only_bounded_finite_numbers_with_clean_names(line, expected):
    assert metric_record(line) == expected


def test_the_edge_bounds_the_number_of_keys():
    record = metric_record(json.dumps({"step": 1, **{f"k{i}": i for i in range(100)}}))
    assert record is not None and len(record) == 24


def test_the_helper_writes_what_the_agent_reads_whole_lines_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDEPLOY_METRICS", str(tmp_path / taskmetrics.METRICS_FILE))
    monkeypatch.setattr(tfdeploy_metrics, "_file", None)
    for step in range(1, 6):
        tfdeploy_metrics.report(step, total_steps=5, loss=1.0 / step, note="dropped")
    (tmp_path / taskmetrics.METRICS_FILE).open("a").write('{"step": 6')  # half a line
    offset, lines = taskmetrics.new_lines(tmp_path, 0, 1 << 16)
    assert [metric_record(x)["step"] for x in lines] == [1, 2, 3, 4, 5]
    assert offset < (tmp_path / taskmetrics.METRICS_FILE).stat().st_size  # the half line waits
    assert taskmetrics.new_lines(tmp_path, offset, 1 << 16) == (offset, [])
    small_offset, few = taskmetrics.new_lines(tmp_path, 0, 100)  # a budget cuts at a line end
    assert 0 < len(few) < 5 and small_offset <= 100


def test_steps_per_second_and_eta_from_the_records():
    series = TaskSeries()
    series.add_records(
        tuple({"step": s, "time": 100.0 + s / 4, "total_steps": 100} for s in range(1, 41)), 0
    )
    progress = series.progress()
    assert progress.step == 40 and progress.total_steps == 100
    assert progress.rate == pytest.approx(4.0)
    assert progress.eta_s == pytest.approx(15.0)


def test_plain_progress_is_one_line_per_phase_and_a_still_line_at_most_every_few_seconds():
    said: list[str] = []
    plain = PlainProgress(said.append, every=5.0)
    phase = Progress("installing", started=0.0, done=1, total=4, unit="hosts")
    for now in (0.0, 1.0, 2.0, 4.9, 5.1, 6.0, 10.2):
        plain.show(phase, now)
    assert said == [
        "installing: 1 of 4 hosts",
        "still installing (5 s): 1 of 4 hosts",
        "still installing (10 s): 1 of 4 hosts",
    ]


def test_bytes_are_human_with_rate_and_eta():
    progress = Progress("sending", started=0.0, bytes_done=120_000_000, bytes_total=363_000_000)
    assert progress.counts(10.0) == "120 MB of 363 MB, 12 MB/s, ETA 20 s"


def test_preflight_says_where_tensorflow_comes_from_when_the_hosts_have_none(tmp_path):
    """Issue 51: `tensorflow -` read as "missing" for a job whose environment brings it."""
    from deployer.up.preflight import _tensorflow_words
    from tests.support.helpers import JOB, plan

    hosts = '[[hosts]]\naddress = "10.0.0.1"\ntasks = [{ role = "worker" }]\n'
    bare = plan(tmp_path, JOB + hosts)
    with_env = plan(tmp_path, JOB + 'requirements = ["attrs==23.1"]\n' + hosts)
    assert _tensorflow_words(bare, ["2.21.0"]) == "tensorflow 2.21.0"
    assert _tensorflow_words(with_env, []) == "tensorflow: from the job's environment"
    assert "-" not in _tensorflow_words(bare, [])


def test_a_push_shows_bytes_per_host_with_rate_and_eta():
    from deployer.push.sync import ByteMeter
    from deployer.watch.progress import sent_progress, still_line

    meter = ByteMeter()
    meter.expect("h1", 363_000_000)
    meter.expect("h2", 363_000_000)
    meter.add("h1", 363_000_000)
    meter.add("h2", 120_000_000)
    shown = sent_progress(Progress("sending the code to 2 hosts", started=0.0), meter)
    line = still_line(shown, 10.0)
    assert line == (
        "still sending the code to 2 hosts (10 s): 483 MB of 726 MB, 48 MB/s, ETA 5 s; "
        "h2: 120 MB of 363 MB, 12 MB/s, ETA 20 s"
    )


def test_cpu_and_rss_of_a_busy_process_group_are_seen(tmp_path):
    """A real process that spins one core and holds 60 MB: the agent's sample says so."""
    import os
    import subprocess
    import time

    spin = "b = bytearray(60_000_000)\nwhile True:\n    pass\n"
    began = time.time()
    proc = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        time.sleep(0.5)
        status = {"state": "running", "pgid": proc.pid, "started": began}
        for _ in range(8):
            taskmetrics.add_usage([status])
            time.sleep(0.5)
        taskmetrics.add_usage([status])
        # What the kernel says it got on average (on a loaded machine, far from one core):
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        average = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        average = 100 * average / (time.time() - began)
        assert status["usage"]["rss"] > 60_000_000 and status["usage"]["procs"] == 1
        assert average > 0
        assert average / 2 <= status["usage"]["cpu"] <= average * 2 + 5
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
