"""The metrics channel's edge and this machine's store of it (issue 58): a task's lines parsed
with bounded depth and size (a line that is no record dropped and counted, never fatal), the
store bounded per task, `runs` and `report` reading what they show in bounded memory, and
damaged local records named and skipped. Hostile lines and records are generated from the
records' shapes (tests/support/hostile_records.py), as the reply walk does for the agent's.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deployer.api import reportpage, runlist
from deployer.core import boundedjson
from deployer.core.errors import UsageError
from deployer.hosts.agent import _metric_lines
from deployer.hosts.replies import (
    METRIC_ABS,
    METRIC_KEYS,
    METRIC_NAME,
    Edge,
    MetricRecords,
    metric_record,
    metric_records,
)
from deployer.hosts.reply_types import TaskStatus
from deployer.results import metricstore, runstore
from deployer.results.archive import LogArchive
from deployer.results.runstore import run_dir
from tests.support.hostile_records import CONTROL, DEEP, strings_in, variants
from tests.support.peak_rss import measured

REMOTE = Path(__file__).resolve().parents[2] / "remote"
NESTED = "[" * DEEP  # issue 58's line: 1,020 `[`, about 1 kB
RUN = "job-20261201T000000Z-abcd"
OTHER = "job-20261130T000000Z-beef"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def helper_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The shape of a metrics line: what the task-side helper writes (remote/taskside)."""
    sys.path.insert(0, str(REMOTE / "taskside"))
    import tfdeploy_metrics

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv(tfdeploy_metrics.ENV, str(path))
    monkeypatch.setattr(tfdeploy_metrics, "_file", None)
    tfdeploy_metrics.report(7, total_steps=100, loss=0.25, accuracy=0.5)
    tfdeploy_metrics._file.close()
    monkeypatch.setattr(tfdeploy_metrics, "_file", None)
    record: dict[str, Any] = json.loads(path.read_text())
    assert set(record) == {"step", "time", "total_steps", "loss", "accuracy"}
    return record


def bounded_record(record: dict[str, float], where: str) -> None:
    """What the edge hands on: a whole step, clean names, finite bounded numbers, few keys."""
    assert 0 <= record["step"] == int(record["step"]), where
    assert len(record) <= METRIC_KEYS, where
    for key, value in record.items():
        assert METRIC_NAME.fullmatch(key), f"{where}: key {key!r:.40}"
        assert type(value) is float and math.isfinite(value), f"{where}: {value!r}"
        assert abs(value) <= METRIC_ABS, f"{where}: {value!r}"


# The edge.


def test_hostile_metrics_lines_are_dropped_and_counted_or_kept_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every field of the helper's record, every key and the whole line, with every hostile
    value: no exception (the 1,020 `[` were a RecursionError), each line a bounded record or
    dropped, and the batch counts exactly the lines dropped."""
    shape = helper_record(tmp_path, monkeypatch)
    lines, wrong = [], []
    for what, raw in variants(shape):
        line = raw.decode("utf-8", "replace")  # the agent's reply carries text
        lines.append(line)
        try:
            record = metric_record(line)
            if record is not None:
                bounded_record(record, what)
        except (AssertionError, Exception) as exc:
            wrong.append(f"{what}: {type(exc).__name__}: {exc!s:.200}")
    assert not wrong, "\n".join(wrong)
    batch = metric_records(lines)
    assert batch.dropped == sum(metric_record(x) is None for x in lines) > 50
    assert len(batch) + batch.dropped == len(lines)


def test_the_nested_line_is_dropped_and_counted_in_every_reader_of_the_hosts_word() -> None:
    """The poll (`up`'s watch, `down`'s metrics) counts it; a status's last records (`status`,
    `down`, `runs -i`) leave it out; neither raises."""
    edge = Edge("h1", "poll")
    entries: Any = [{"task": "worker:0", "offset": 10, "lines": [NESTED, '{"step": 2}']}]
    found = _metric_lines(entries, edge, {"worker:0": 0})
    offset, records = found["worker:0"]
    assert offset == 10 and list(records) == [{"step": 2.0}]
    assert isinstance(records, MetricRecords) and records.dropped == 1
    task = {"name": "worker:0", "state": "running", "last": [NESTED, '{"step": 3}']}
    assert TaskStatus.from_json(task, edge).last == ({"step": 3.0},)


def test_depth_is_measured_before_decoding() -> None:
    assert boundedjson.too_deep(NESTED, 8) and not boundedjson.too_deep('["[[[[[[[[[["]', 2)
    assert not boundedjson.too_deep('{"a": [[1], [2], [3]]}', 3)
    assert boundedjson.too_deep('{"a": [[1], [2], [3]]}', 2)
    with pytest.raises(boundedjson.TooDeep):
        boundedjson.loads('{"a":' * DEEP)
    assert boundedjson.loads('{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}


# The store's bound.


def store_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_a_flood_keeps_the_store_within_its_bound_with_first_and_last(state: Path) -> None:
    """A task writing as fast as polls bring lines (64 kB each), 300k records: the store of its
    series never holds more than its bound, and keeps an even sample from the first record to
    the last, and the count of the lines dropped."""
    archive = LogArchive(RUN)
    folder = archive.dir / "metrics"
    bound = metricstore.HISTORY_BYTES + metricstore.TAIL_BYTES + 4096  # + the index
    step, biggest = 0, 0
    for batch in range(1200):
        records = [{"step": float(s), "loss": 1.0 / (s + 1)} for s in range(step, step + 250)]
        step += 250
        archive.write_metrics("worker:0", MetricRecords(records, dropped=batch % 2))
        biggest = max(biggest, store_bytes(folder))
        assert biggest <= bound, f"{biggest} bytes after {step} records"
    assert archive.failure is None
    kept = runstore.metrics(RUN)["worker:0"]
    steps = [r["step"] for r in kept.records]
    assert steps[0] == 0 and steps[-1] == step - 1 and len(steps) <= metricstore.POINTS + 1
    gaps = {b - a for a, b in itertools.pairwise(steps[:-1])}  # the last: the newest record
    assert len(gaps) == 1, f"an uneven sample: gaps {sorted(gaps)[:8]}"
    assert kept.dropped == 600 and kept.damaged == 0
    assert runstore.last_metrics(RUN)[0].records == ({"step": float(step - 1), "loss": 1.0 / step},)


def test_a_batch_of_dropped_lines_alone_is_counted(state: Path) -> None:
    archive = LogArchive(RUN)
    archive.write_metrics("worker:0", MetricRecords((), dropped=1))
    archive.write_metrics("worker:0", MetricRecords(({"step": 1.0},), dropped=2))
    assert runstore.metrics_dropped(RUN) == 3
    assert runlist.summary(RUN).metrics_dropped == 3


# Damaged local records.


def planned(tasks: int = 2) -> Any:
    """A plan of `tasks` workers on as many hosts (tests/support/helpers.py)."""
    import tempfile

    from tests.support.helpers import JOB, plan

    hosts = "".join(
        f'[[hosts]]\naddress = "10.0.0.{i + 1}"\ntasks = [{{ role = "worker" }}]\n'
        for i in range(tasks)
    )
    with tempfile.TemporaryDirectory() as where:
        return plan(Path(where), JOB + hosts)


def facts(tasks: int = 2) -> dict[str, Any]:
    """facts.json as `up` writes it (deployer/up/records.py run_facts), for `tasks` workers."""
    from deployer.up.records import run_facts

    return run_facts(planned(tasks), RUN, 1_700_000_000.0, lambda v: v)


def write_run(run_id: str, steps: int = 3) -> Path:
    """A run as `up` leaves it here: facts, outcome, journal, each task's metrics and usage,
    the log archive's index."""
    from deployer.results import state

    state.save(state.RunRecord.of(planned(), run_id, detached=False))  # <state>/runs/<id>.json
    archive = LogArchive(run_id)
    document = facts()
    archive.keep_facts(document)
    archive.keep_outcome({"outcome": "succeeded", "ended": 1_700_000_100.0})
    archive.note("step", "started 2 tasks", at=1_700_000_001.0)
    for task in (t["name"] for t in document["tasks"]):
        archive.write(task, "h1", 0, b"a line\n")
        records = [
            {"step": float(s), "loss": 1.0 / s, "time": 1.7e9 + s} for s in range(1, 1 + steps)
        ]
        archive.write_metrics(task, MetricRecords(records))
        archive.write_usage(task, {"t": 1.7e9 + 1, "cpu": 50.0, "rss": 1e8})
    return archive.dir


def test_a_damaged_record_is_named_and_skipped_by_runs_and_report(state: Path) -> None:
    """`{"step": "x"}` as a task's last record: `runs` listed no run at all and `report` was an
    internal error. Now both skip it and name it, and the run before it still lists."""
    write_run(OTHER)
    directory = write_run(RUN)
    with (directory / "metrics" / "worker-0.jsonl").open("a") as f:
        f.write('{"step": "x", "loss": 0.1}\n')
    listed = {r.run_id: r for r in runlist.local_runs()}
    assert set(listed) == {RUN, OTHER}
    run = listed[RUN]
    assert run.last_step == 3 and run.final == {"loss": pytest.approx(1 / 3)}
    assert run.damage == (
        "metrics/worker-0.jsonl line 1 from the end: not a metrics record (no whole step from 0 "
        "to 10^12)",
    )
    shown = rendered(runlist.runs_table(list(listed.values())))
    assert f"run {RUN}: records skipped, damaged: metrics/worker-0.jsonl line 1" in shown
    page = reportpage.write_report(RUN).read_text()
    assert "metrics/worker-0.jsonl line 4: not a metrics record" in page
    loss = page.split("data-metric='loss'")[1].split("</svg>")[0]
    dots = loss.split("<g class='dots' data-task='worker:0'")[1].split("</g>")[0]
    assert dots.count("class='pt'") == 3


def test_a_damaged_run_folder_hides_no_other_run(state: Path) -> None:
    """A run whose every document is damaged (nested 1,020 deep, not an object, a folder where a
    file belongs): `runs` (the real CLI, in a process) lists both runs, the damaged one named;
    its report is a usage error naming the damaged facts, not an internal error."""
    write_run(OTHER)
    directory = write_run(RUN)
    (directory / "facts.json").write_text('{"job": ' + NESTED)
    (directory / "outcome.json").write_text("[1, 2]")
    (directory / "archive.json").write_text('{"tasks": ' + "[" * 5000)
    (directory / "usage" / "worker-0.jsonl").unlink()
    (directory / "usage" / "worker-0.jsonl").mkdir()
    (directory / "metrics" / "worker-1.jsonl").write_bytes(b"\xff\xfe" + NESTED.encode() + b"\n")
    code, out = cli("runs")
    assert code == 0, out
    assert RUN in out and OTHER in out
    assert f"run {RUN}: records skipped, damaged: facts.json: not a JSON object" in out
    code, out = cli("runs", "--json")
    listed = {r["run_id"]: r for r in json.loads(out)["runs"]}
    assert listed[OTHER]["outcome"] == "succeeded" and listed[OTHER]["damage"] == []
    assert listed[RUN]["outcome"] == "unknown" and listed[RUN]["last_step"] == 3
    assert (
        "metrics/worker-1.jsonl line 1 from the end: nested deeper than 64 levels"
        in (listed[RUN]["damage"])
    )
    code, out = cli("report", RUN)
    assert code == 2 and f"run {RUN}'s facts on this machine are damaged" in out, out
    code, out = cli("logs", RUN)  # the archive's index damaged: asks the hosts, no traceback
    assert "Traceback" not in out and "internal error" not in out, out


def cli(*args: str) -> tuple[int, str]:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "deployer", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"COLUMNS": "200"},
    )
    return done.returncode, done.stdout + done.stderr


def rendered(renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


# Hostile local records, generated from what the writers write.


def _series_lines(directory: Path) -> dict[str, bytes]:
    """Each stored line kind's first line, as the store wrote it: the shapes of the records."""
    found = {}
    for name in ("metrics/worker-0.jsonl", "usage/worker-0.jsonl", "journal.jsonl"):
        found[name] = (directory / name).read_bytes().splitlines()[0]
    return found


def _documents(directory: Path) -> dict[str, bytes]:
    names = ("facts.json", "outcome.json", f"../{RUN}.json")  # the last: the run's record
    return {name: (directory / name).read_bytes() for name in names}


@pytest.mark.slow
def test_hostile_local_records_are_skipped_or_shown_clean(state: Path) -> None:
    """Every field, key and whole form of every record this machine keeps (a metrics record,
    a resource sample, a journal entry, the facts, the outcome), hostile in turn: `runs` lists
    every run with clean texts and strict JSON, and `report` writes its page (or says the
    run's facts are damaged); nothing else raises."""
    write_run(OTHER)
    directory = write_run(RUN)
    wrong: list[str] = []
    for name, original in {**_series_lines(directory), **_documents(directory)}.items():
        path = directory / name
        kept = path.read_bytes()
        lines = kept.splitlines(keepends=True)
        for what, raw in variants(json.loads(original)):
            if name.endswith(".jsonl"):  # the hostile line last, after good ones
                path.write_bytes(b"".join(lines) + raw + b"\n")
            else:
                path.write_bytes(raw)
            problem = _runs_and_report_hold(report=not name.startswith(".."))
            if problem:
                wrong.append(f"{name} {what}: {problem}")
        path.write_bytes(kept)
    assert not wrong, "\n".join(wrong[:30])


def _runs_and_report_hold(report: bool) -> str | None:
    """Why `runs` (and with `report`, the report, which does not read the run's record) does
    not hold what the test asks, or None."""
    try:
        listed = runlist.local_runs()
        if {r.run_id for r in listed} != {RUN, OTHER}:
            return f"listed {[r.run_id for r in listed]}"
        document = json.dumps([r.to_json() for r in listed], allow_nan=False)
        shown = rendered(runlist.runs_table(listed))
        for said in [*strings_in(json.loads(document)), shown.replace("\n", "")]:
            if CONTROL.search(said):
                return f"a control character shown: {said!r:.80}"
        for run in listed:
            for value in run.final.values():
                if not math.isfinite(value):
                    return f"final {value!r}"
        try:
            if report:
                reportpage.write_report(RUN)
        except UsageError as exc:
            if "facts on this machine are damaged" not in str(exc):
                return f"UsageError {exc}"
    except Exception as exc:  # what the test is for: any other exception is the bug
        return f"{type(exc).__name__}: {exc!s:.200}"
    return None


# What `runs` and `report` cost.

PEAK_RECORDS = 200_000


def _big_run(state: Path, records: int) -> tuple[str, int]:
    """A run of 2 tasks x `records` metrics records, each series one file as the store held
    it before its bound (what a long run left), and the bytes those files hold."""
    run_id = f"big-20261201T000000Z-{records:04x}"[-30:]
    directory = run_dir(run_id)
    document = facts()
    runstore.write_facts(run_id, document)
    runstore.write_outcome(run_id, {"outcome": "succeeded", "ended": 1.8e9})
    (directory / "metrics").mkdir()
    for task in ("worker-0", "worker-1"):
        with (directory / "metrics" / f"{task}.jsonl").open("w") as f:
            for s in range(records):
                record = {
                    "step": s,
                    "time": 1.7e9 + s / 10,
                    "loss": 1 / (s + 1),
                    "total_steps": records,
                }
                f.write(json.dumps({**record, "accuracy": s / records}) + "\n")
    size = sum(p.stat().st_size for p in (directory / "metrics").iterdir())
    return run_id, size


@pytest.mark.slow
def test_runs_and_report_of_a_200k_record_run_stay_in_bounded_memory(state: Path) -> None:
    """2 tasks x 200k records (issue 58: 1.6 GB RSS). Holding them needs at least the bytes of
    their files (40 MB of text; as Python dicts several times that); each verb's peak over the
    same verb's on a 2,000-record run stays under a quarter of that, so neither reads the
    series whole. And the page draws at most POINTS_DRAWN points a chart, however long the run."""
    small, _ = _big_run(state, 2_000)
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state)}
    base = {
        "runs": measured([sys.executable, "-m", "deployer", "runs"], env),
        "report": measured([sys.executable, "-m", "deployer", "report", small], env),
    }
    small_page = run_dir(small) / "report.html"
    small_size = small_page.stat().st_size
    big, size = _big_run(state, PEAK_RECORDS)
    assert size > 40_000_000
    for verb, argv in (("runs", ["runs"]), ("report", ["report", big])):
        run = measured([sys.executable, "-m", "deployer", *argv], env)
        assert run.returncode == 0, run.output
        grown = (run.rss_kib - base[verb].rss_kib) * 1024
        assert grown < size / 4, f"{verb}: {grown >> 20} MB more than for a small run"
    page = (run_dir(big) / "report.html").read_text()
    points = [int(n) for n in re.findall(r"data-points='(\d+)'", page)]
    assert points and max(points) <= reportpage.POINTS_DRAWN, points
    # each series at most its points, ~12 bytes a point drawn (a path's), beside the rest of
    # the page, which a 2,000-record run has as well
    assert len(page) < small_size + len(points) * reportpage.POINTS_DRAWN * 12
    listed = json.loads(measured([sys.executable, "-m", "deployer", "runs", "--json"], env).output)[
        "runs"
    ]
    assert {r["run_id"]: r["last_step"] for r in listed}[big] == PEAK_RECORDS - 1
