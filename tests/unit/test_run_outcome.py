"""A run's end as the history records it, and the keeper's restarts as `status` reads them:
the verdict over the tasks' exits, and each recovery checked at the edge (untrusted: a host's
reply)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from deployer.api import render, runlist
from deployer.core.errors import HostError
from deployer.hosts.replies import Edge
from deployer.hosts.reply_types import TaskStatus
from deployer.results import metricstore, runstore
from deployer.results.metricsync import outcome
from deployer.results.runs import HostRun, Recovery
from deployer.results.runstore import run_dir
from remote import protocol

RUN = "job-20261202T000000Z-abcd"


def _task(name: str, code: int | None = 0, reason: str = protocol.REASON_EXITED) -> TaskStatus:
    return TaskStatus(
        name=name, state=protocol.STATE_EXITED, exit_code=code, reason=reason, ended=1.8e9
    )


def test_workers_that_succeeded_with_their_ps_stopped_by_tfdeploy_are_a_success() -> None:
    """A kept PSS run ends with the keeper stopping the ps server after the workers and the
    chief exited 0: that is the job's success, not "stopped" (as `down` of a running job is)."""
    stopped_ps = _task("ps:0", None, protocol.REASON_STOPPED)
    done = outcome([_task("chief:0"), _task("worker:0"), stopped_ps], ["restart 1 (...)"])
    assert (done["outcome"], done["restarts"]) == ("succeeded", 1)
    stopped_worker = _task("worker:1", None, protocol.REASON_STOPPED)
    assert outcome([_task("worker:0"), stopped_worker])["outcome"] == "stopped"
    assert outcome([_task("worker:0"), _task("worker:1", 1)])["outcome"] == "failed"
    # PSS whose workers run the built-in server: stopped once the chief was done.
    servers = [_task(f"worker:{i}", None, protocol.REASON_STOPPED) for i in range(2)]
    assert outcome([_task("chief:0"), *servers, stopped_ps])["outcome"] == "succeeded"
    chief_stopped = _task("chief:0", None, protocol.REASON_STOPPED)
    assert outcome([chief_stopped, _task("worker:0")])["outcome"] == "stopped"
    assert "restarts" not in outcome([_task("worker:0")])


def test_runs_says_how_often_the_keeper_restarted_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    directory = run_dir(RUN)
    directory.mkdir(parents=True)
    record = {"outcome": "succeeded", "ended": 1.8e9, "restarts": 2}
    runstore.write_outcome(RUN, record)
    [found] = runlist.local_runs()
    assert (found.outcome, found.restarts) == ("succeeded", 2)
    out = io.StringIO()
    Console(file=out, width=200).print(runlist.runs_table([found]))
    assert "succeeded (2 restarts)" in out.getvalue()
    for hostile in (True, -1, 10**9, "2", 2.5):  # a hand-edited record: no count, no crash
        runstore.write_outcome(RUN, record | {"restarts": hostile})
        assert runlist.local_runs()[0].restarts == 0


def test_a_recovery_from_a_host_is_checked_and_shown_clean() -> None:
    edge = Edge("h1", "runs")
    raw = {
        "attempt": 1,
        "task": None,
        "cause": "worker:1 was killed\x1b]52;c;aGk=\x07 by signal 9",
        "backoff": 1.0,
        "started_after_s": 3.25,
        "stepping_after_s": 5.5,
    }
    recovery = Recovery.from_json(raw, edge)
    assert "\x1b" not in recovery.cause and "\x07" not in recovery.cause
    assert recovery.line().startswith("restart 1 (worker:1 was killed")
    assert recovery.line().endswith(": running again 3.2 s later, training again 5.5 s later")
    for bad in (
        {"task": "../../x"},
        {"attempt": -1},
        {"backoff": "soon"},
        {"stepping_after_s": 1e300},
    ):
        with pytest.raises(HostError):
            Recovery.from_json(raw | bad, edge)
    running = TaskStatus(name="worker:0", state=protocol.STATE_RUNNING)
    run = HostRun("h1", RUN, "job", 1.8e9, True, (running,), kept=True, recoveries=(recovery,))
    out = io.StringIO()
    Console(file=out, width=120).print(render.status_table([run]))
    assert "restart 1 (worker:1 was killed" in out.getvalue()
    assert "detached, kept by its keeper)" in out.getvalue()
    [shown] = json.loads(render.status_json([run]))["runs"]
    assert shown["recoveries"][0]["stepping_after_s"] == 5.5


def test_the_report_page_lists_each_recovery_escaped_and_bounded() -> None:
    from deployer.api import reportpage

    hostile = "restart 1 (worker:1 <script>alert(1)</script>): running again 3.1 s later"
    raw = {"outcome": "succeeded", "recoveries": [hostile, 7, *["x"] * 40]}
    sane = reportpage.sane_outcome(raw)
    assert len(sane["recoveries"]) == 20 and 7 not in sane["recoveries"]
    assert reportpage.sane_outcome({"recoveries": "not a list"})["recoveries"] == []
    page = reportpage.render_page(
        RUN,
        reportpage.sane_facts({}),
        sane,
        {},
        {},
        metricstore.Series(),
    )
    assert "<th>recovery</th><td>restart 1 (worker:1 &lt;script&gt;" in page
    assert "<script>alert" not in page


def test_a_run_restarted_more_often_than_a_reply_lists_says_how_often_everywhere(
    workdir: Path,
) -> None:
    """A runs reply lists the keeper's newest 20 restarts (bounded), and says how many there
    were apart from that list: the history, `status` and the report count all 25, not 20."""
    from deployer.api import reportpage
    from deployer.results.runs import _host_run, _HostLists
    from tests.support.agent import call, new_run, ok

    run_dir = new_run(workdir, RUN)
    events = [
        {"restart_job": i, "cause": f"worker:1 exited {i}", "backoff": 1.0} for i in range(25)
    ]
    (run_dir / "keeper.json").write_text(json.dumps({"events": events}))
    [raw] = ok(call(workdir, "runs"))["runs"]
    assert (raw["restarts"], len(raw["recoveries"])) == (25, 20)
    assert raw["recoveries"][-1]["cause"] == "worker:1 exited 24"  # the newest, last
    run = _host_run("h1", raw, _HostLists())
    assert (run.restarts, len(run.recoveries)) == (25, 20)
    running = TaskStatus(name="worker:0", state=protocol.STATE_RUNNING)
    run = dataclasses.replace(run, tasks=(running,), kept=True)
    assert json.loads(render.status_json([run]))["runs"][0]["restarts"] == 25
    out = io.StringIO()
    Console(file=out, width=120).print(render.status_table([run]))
    assert "… 22 earlier restarts" in out.getvalue()
    done = outcome([_task("worker:0")], [x.line() for x in run.recoveries], run.restarts)
    assert (done["restarts"], len(done["recoveries"])) == (25, 20)
    for bad in (-1, "25", True, 2.5):  # a host's count is checked at the edge
        with pytest.raises(HostError):
            _host_run("h1", raw | {"restarts": bad}, _HostLists())
    rows = reportpage._restart_rows(reportpage.sane_outcome(done))
    assert rows[0] == ("restarts", "25 (the newest 20 below)") and len(rows) == 21


def test_a_keeper_that_restarted_more_often_than_its_record_keeps_counts_every_restart(
    workdir: Path,
) -> None:
    """keeper.json keeps the newest 200 events, two or three per restart: the count the keeper
    writes beside them, not the events left, is how often it restarted (100, not 66)."""
    import subprocess
    import sys

    from tests.support.agent import AGENT, call, new_run, ok

    run_dir = new_run(workdir, RUN)
    script = (
        f"import sys; sys.path.insert(0, {str(AGENT.parent)!r})\n"
        "from pathlib import Path\nimport keeper\n"
        f"k = keeper.Keeper({{'run_id': {RUN!r}, 'hosts': [], 'tasks': [], 'policy': {{}}}}, "
        f"b'x', Path({str(run_dir)!r}))\n"
        "for i in range(1, 101):\n"
        "    k.note({'restart_job': i, 'cause': 'worker:1 exited 1', 'backoff': 1.0})\n"
        "    k.note({'started': i, 'after_s': 1.0})\n"
        "    k.note({'stepping': i, 'after_s': 2.0})\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    [raw] = ok(call(workdir, "runs"))["runs"]
    assert (raw["restarts"], len(raw["recoveries"])) == (100, 20)
    assert raw["recoveries"][-1]["attempt"] == 100


def test_a_resumed_runs_new_keeper_goes_on_counting_the_earlier_keepers_restarts(
    workdir: Path,
) -> None:
    """`up --resume` of a kept run hands it to a new keeper: the restarts its earlier keeper
    made stay in the record (and in `status`), and the earlier keeper's end does not (the
    run is not over: readers take `ended` for its end)."""
    import subprocess
    import sys

    from tests.support.agent import AGENT, call, new_run, ok

    run_dir = new_run(workdir, RUN)
    earlier = [
        {"kept": True},
        {"restart_job": 1, "cause": "worker:1 was killed by signal 9", "backoff": 1.0},
        {"started": 1, "after_s": 1.5},
        {"ended": {"outcome": "stopped", "why": "by tfdeploy down", "attempt": 1}},
    ]
    record = {"run_id": RUN, "attempt": 1, "restarts": 1, "events": earlier}
    (run_dir / "keeper.json").write_text(json.dumps(record))
    script = (
        f"import sys; sys.path.insert(0, {str(AGENT.parent)!r})\n"
        "from pathlib import Path\nimport keeper\n"
        f"k = keeper.Keeper({{'run_id': {RUN!r}, 'hosts': [], 'tasks': [], 'policy': {{}}, "
        f"'attempt': 2}}, b'x', Path({str(run_dir)!r}))\n"
        "k.note({'kept': True})\n"
        "k.note({'restart_job': 3, 'cause': 'worker:0 exited 137', 'backoff': 1.0})\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    kept = json.loads((run_dir / "keeper.json").read_text())
    assert kept["restarts"] == 2 and not any("ended" in e for e in kept["events"])
    [raw] = ok(call(workdir, "runs"))["runs"]
    assert raw["restarts"] == 2
    assert [r["attempt"] for r in raw["recoveries"]] == [1, 3]
    assert raw["recoveries"][0]["started_after_s"] == 1.5
    # A record of another run (a folder reused by hand) is not this run's history.
    (run_dir / "keeper.json").write_text(json.dumps(record | {"run_id": "other"}))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert json.loads((run_dir / "keeper.json").read_text())["restarts"] == 1
