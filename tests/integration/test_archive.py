"""The local log archive on the lab: a finished run's logs with every one of its hosts down, and
a detached run's logs copied home with `logs --sync`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from deployer.core.lines import MAX_LINE
from deployer.hosts.agent import Agent
from deployer.hosts.fleet import Fleet
from deployer.results.archive import LogArchive, let_go, read_runs
from deployer.results.runs import resolve, sync_archive
from tests.lab import Lab
from tests.support.faults import Up
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab]

PRINT = """\
import sys, time
for i in range(300):
    print(sys.argv[1], i)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "say.py").write_text(PRINT)
    return code


def expected(name: str) -> list[str]:
    return [f"{name} {i}" for i in range(300)]


@pytest.mark.isolated  # crashes hosts
def test_logs_of_a_finished_run_with_every_host_down(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    h4, h5 = lab.hosts[3], lab.hosts[4]
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        hosts=[h4, h5],
        job={"name": "arch", "command": "python3 say.py $TFDEPLOY_TASK 0"},
    )
    up = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    for host in (h4, h5):
        lab.crash_host(host)
    try:
        began = time.monotonic()
        logs = tfdeploy("logs", run_id, state=tmp_path / "state", check_rc=0, timeout=30)
        assert time.monotonic() - began < 10  # no host was waited for
        for name, host in (("worker:0", h4), ("worker:1", h5)):
            mine = [
                x.split(" | ", 1)[1]
                for x in logs.stdout.splitlines()
                if x.startswith(f"{name}@{host.name} | ")
            ]
            assert mine == expected(name)
    finally:
        for host in (h4, h5):
            lab.revive_host(host)


def test_logs_sync_copies_a_detached_run_home(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={"name": "archsync", "command": "python3 say.py $TFDEPLOY_TASK 1"},
    )
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    deadline = time.monotonic() + 30
    while "exited" not in tfdeploy("status", run_id, state=tmp_path / "state").stdout:
        assert time.monotonic() < deadline, "the detached run did not finish"
        time.sleep(0.5)
    synced = tfdeploy("logs", run_id, "--sync", state=tmp_path / "state", check_rc=0)
    assert [x.split(" | ", 1)[1] for x in synced.stdout.splitlines()] == expected("worker:0")
    archive = tmp_path / "state" / "runs" / run_id / "worker-0.log"
    assert archive.read_text().splitlines() == expected("worker:0")
    again = tfdeploy("logs", run_id, "--sync", state=tmp_path / "state", check_rc=0)
    assert again.stdout == synced.stdout  # nothing twice
    tfdeploy("down", run_id, state=tmp_path / "state", check_rc=0)


TWO_BURSTS = """\
import sys, time
for i in range(300):
    print(sys.argv[1], i, flush=True)
time.sleep(float(sys.argv[2]))
for i in range(300, 600):
    print(sys.argv[1], i, flush=True)
"""


def lines_of(stdout: str, name: str) -> list[str]:
    return [x.split(" | ", 1)[1] for x in stdout.splitlines() if x.startswith(f"{name}@")]


def test_a_damaged_archive_is_never_read_mid_stream_and_sync_repairs_it(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """Issue 28 item 5: worker-1.log deleted while `up` ran came back starting with NUL bytes,
    `logs --task worker:1` then started mid-stream without a word, and `--sync` kept it so; a
    finished run's deleted worker-0.log was dropped from `logs` and `--task worker:0` said no
    host had it."""
    (code / "bursts.py").write_text(TWO_BURSTS)
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "damage", "command": "python3 bursts.py $TFDEPLOY_TASK 4"},
    )
    state = tmp_path / "state"
    up = Up(inventory, state=state)
    run_id = up.run_id()
    up.wait_for(r"^worker:1@\S+ \| worker:1 299$")
    archived = state / "runs" / run_id / "worker-1.log"
    time.sleep(0.5)  # the lines shown are archived by now (the archive is written first)
    archived.unlink()  # by hand, a cleaner, ...
    assert up.finish() == 0, up.report()
    assert not archived.read_bytes().startswith(b"\0"), "the gap was filled with NUL bytes"

    logs = tfdeploy("logs", run_id, "--task", "worker:1", state=state, check_rc=0)
    said = " ".join(logs.stderr.split())
    assert f"local archive of run {run_id}, worker:1: its first " in said, logs.stderr
    assert "reading the run's hosts instead" in said
    assert lines_of(logs.stdout, "worker:1") == expected_n("worker:1", 600)

    synced = tfdeploy("logs", run_id, "--sync", state=state, check_rc=0)
    assert synced.stderr == ""
    assert archived.read_text().splitlines() == expected_n("worker:1", 600)
    for name in ("worker:0", "worker:1"):
        assert lines_of(synced.stdout, name) == expected_n(name, 600)

    (state / "runs" / run_id / "worker-0.log").unlink()  # the run has ended: a later loss
    logs = tfdeploy("logs", run_id, state=state, check_rc=0)
    said = " ".join(logs.stderr.split())
    assert f"local archive of run {run_id}, worker:0: its file worker-0.log is missing" in said
    assert lines_of(logs.stdout, "worker:0") == expected_n("worker:0", 600)
    one = tfdeploy("logs", run_id, "--task", "worker:0", state=state, check_rc=0)
    assert lines_of(one.stdout, "worker:0") == expected_n("worker:0", 600)


def expected_n(name: str, count: int) -> list[str]:
    return [f"{name} {i}" for i in range(count)]


LONG = """\
import sys
for i in range(20000):
    print(sys.argv[1], i, "x" * 40)
"""


def test_sync_of_a_log_longer_than_the_archive_keeps_copies_only_the_kept_part(
    clean_lab: Lab,
    lab_inventory: Any,
    code: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1 MB log and an archive that keeps 128 kB: --sync moves the last 128 kB (from a line's
    start), not the whole log only to let most of it go. In this process, with a small bound."""
    (code / "long.py").write_text(LONG)
    inventory = lab_inventory(
        [[{"role": "worker"}]], code=code, job={"name": "long", "command": "python3 long.py w"}
    )
    state = tmp_path / "state"
    up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    deadline = time.monotonic() + 30
    while "exited" not in tfdeploy("status", run_id, state=state).stdout:
        assert time.monotonic() < deadline, "the detached run did not finish"
        time.sleep(0.5)
    lines = [f"w {i} {'x' * 40}\n".encode() for i in range(20000)]
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(state))
    moved: list[int] = []
    real_read_log = Agent.read_log

    def counted(self: Agent, run_id: str, task: str, offset: int, most: int, sink: Any) -> int:
        def into(data: bytes) -> None:
            moved.append(len(data))
            sink(data)

        return real_read_log(self, run_id, task, offset, most, into)

    monkeypatch.setattr(Agent, "read_log", counted)
    archive = LogArchive(run_id, limit=64 << 10)
    with Fleet(resolve(run_id).hosts) as fleet:
        assert sync_archive(fleet, run_id, archive)
        assert sum(moved) < archive.kept() + 5 * MAX_LINE  # the part kept, and a line found
        first = starts.index(let_go(run_id)["worker:0"])  # a line's start, where it skipped to
        assert starts[-1] - starts[first] <= archive.kept() < starts[-1] - starts[first - 1]
        kept = [line for _, chunk in read_runs(run_id) for line in chunk]
        assert kept == [x.decode().rstrip() for x in lines[first:]]
        moved.clear()
        assert sync_archive(fleet, run_id, LogArchive(run_id, limit=64 << 10))
        assert sum(moved) == 0  # all there: nothing travels twice
    tfdeploy("down", run_id, state=state, check_rc=0)
