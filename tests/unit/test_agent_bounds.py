"""A run's reach on a host: a stop ends what left its task groups, preflight reserves its ports.

Real processes and the agent driven over stdin as the control side drives it (test_agent.py);
the two-controller reservation race runs against a real lab host over SSH, in
tests/integration/test_agent_bounds.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.hosts.agent import Agent
from deployer.hosts.local_transport import LocalTransport
from tests.support.agent import (
    AGENT,
    ESCAPE,
    PYTHON,
    alive,
    escaped_pid,
    new_run,
    ok,
    runs_dir,
    start,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)


def call(workdir: Path, op: str, env: dict[str, str] | None = None, **params: Any) -> Any:
    request = {"v": 1, "op": op, "workdir": str(workdir), **params}
    proc = subprocess.run(
        [PYTHON, str(AGENT)],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode()
    return json.loads(proc.stdout)


@pytest.fixture
def decoys(run_id: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes of this user that are not of the run, though their environments come close."""
    envs = [
        {"TFDEPLOY_RUN_ID": run_id[:-1]},  # a run whose id is a prefix of ours
        {"TFDEPLOY_RUN_ID": run_id + "0"},  # ours is a prefix of its id
        {"OTHER": f"TFDEPLOY_RUN_ID={run_id}"},  # our entry, but inside another variable
    ]
    procs = [
        subprocess.Popen(["sleep", "600"], env={"PATH": os.environ["PATH"], **e}) for e in envs
    ]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_whole_run_stop_ends_what_left_the_group_and_nothing_else(
    workdir: Path, run_id: str, decoys: list[subprocess.Popen[bytes]]
) -> None:
    run_dir = new_run(workdir, run_id)
    env = {"TFDEPLOY_RUN_ID": run_id}
    [task] = start(workdir, {"name": "worker:0", "command": ESCAPE, "env": env}, run_id=run_id)
    stray = escaped_pid(run_dir, task["pgid"])
    # An agent session whose own environment carries the run id is the agent, not the run.
    session = subprocess.Popen(
        [PYTHON, "-S", str(AGENT), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    try:
        # The agent answering the stop carries it too, and must not stop itself.
        reply = call(workdir, "stop", env=env, run_id=run_id, tasks=None, grace=1)
        assert reply["ok"], reply
        assert session.poll() is None
    finally:
        session.communicate(b"", timeout=10)
    assert [(e["pid"], e["signal"]) for e in reply["escaped"]] == [(stray, signal.SIGTERM)]
    assert reply["escaped"][0]["cmd"] == "sleep 600"
    assert not alive(stray) and not alive(task["pid"])
    assert all(d.poll() is None for d in decoys)


def test_a_stray_that_ignores_sigterm_is_killed_after_the_grace(workdir: Path, run_id: str) -> None:
    run_dir = new_run(workdir, run_id)
    stubborn = "(trap '' TERM; exec setsid sleep 600) & echo $! > escaped.pid; sleep 600"
    env = {"TFDEPLOY_RUN_ID": run_id}
    [task] = start(workdir, {"name": "w", "command": stubborn, "env": env}, run_id=run_id)
    stray = escaped_pid(run_dir, task["pgid"])
    began = time.monotonic()
    reply = call(workdir, "stop", run_id=run_id, tasks=None, grace=0.5)
    assert 0.5 <= time.monotonic() - began < 30  # after the grace, long before `sleep 600`
    assert [(e["pid"], e["signal"]) for e in reply["escaped"]] == [(stray, signal.SIGKILL)]
    assert not alive(stray)


def test_stopping_some_tasks_leaves_the_runs_other_processes_alone(
    workdir: Path, run_id: str
) -> None:
    run_dir = new_run(workdir, run_id)
    env = {"TFDEPLOY_RUN_ID": run_id}
    [task, _] = start(
        workdir,
        {"name": "a", "command": ESCAPE, "env": env},
        {"name": "b", "command": "sleep 600", "env": env},
        run_id=run_id,
    )
    stray = escaped_pid(run_dir, task["pgid"])
    reply = call(workdir, "stop", run_id=run_id, tasks=["b"], grace=1)
    assert "escaped" not in reply and alive(stray)  # it may belong to a, which goes on


def test_lease_expiry_also_ends_what_left_the_group(workdir: Path, run_id: str) -> None:
    run_dir = new_run(workdir, run_id, lease_seconds=1)
    env = {"TFDEPLOY_RUN_ID": run_id}
    [task] = start(workdir, {"name": "w", "command": ESCAPE, "env": env}, run_id=run_id, grace=0.5)
    stray = escaped_pid(run_dir, task["pgid"])
    exit_file = run_dir / "tasks/w/exit.json"
    record = json.loads(wait_for(lambda: exit_file.exists() and exit_file.read_text(), 10))
    assert record["reason"] == "lease expired"
    assert [e["pid"] for e in record["escaped"]] == [stray] and not alive(stray)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return int(probe.getsockname()[1])


def test_a_hello_reserves_the_ports_until_the_run_stops(workdir: Path) -> None:
    port = free_port()
    first = ok(call(workdir, "hello", ports=[port], run_id="first", lease_seconds=30))
    assert first["busy_ports"] == [] and first["reserved_by"] == {}
    again = ok(call(workdir, "hello", ports=[port], run_id="first", lease_seconds=30))
    assert again["busy_ports"] == []  # its own reservation does not block a run
    second = ok(call(workdir, "hello", ports=[port], run_id="second", lease_seconds=30))
    assert second["busy_ports"] == [port] and second["reserved_by"] == {str(port): "first"}
    assert second["reserved_state"] == {str(port): "starting"}  # no task of "first" runs here
    plain = ok(call(workdir, "hello", ports=[port]))  # no run id: only the bind is checked
    assert plain["busy_ports"] == []
    # Preflight failed elsewhere (nothing of "first" reached this host): its stop releases.
    ok(call(workdir, "stop", run_id="first", tasks=None, grace=0))
    third = ok(call(workdir, "hello", ports=[port], run_id="second", lease_seconds=30))
    assert third["busy_ports"] == []
    assert ok(call(workdir, "release", run_id="second"))["released"] == 1
    assert list(workdir.glob("hosts/*/ports/*.json")) == []


def test_a_reservation_lapses_with_its_lease_and_lives_with_its_heartbeats(workdir: Path) -> None:
    # A 4 s lease: between two heartbeats here lie two agent calls, and a loaded machine may take
    # a second or more per call.
    port, lease = free_port(), 4
    ok(call(workdir, "hello", ports=[port], run_id="r1", lease_seconds=lease))
    new_run(workdir, "r1", lease_seconds=lease)
    began = time.monotonic()
    while time.monotonic() - began < lease + 0.5:  # heartbeats past the lease
        time.sleep(0.3)
        ok(call(workdir, "poll", run_id="r1", offsets={}, max_bytes=0, heartbeat=True))
        other = ok(call(workdir, "hello", ports=[port], run_id="r2", lease_seconds=lease))
        assert other["reserved_by"] == {str(port): "r1"}
    # The controller of r1 is gone: the reservation lapses with the lease, not before it.
    lapsed = wait_for(
        lambda: (
            ok(call(workdir, "hello", ports=[port], run_id="r2", lease_seconds=lease))["busy_ports"]
            == []
        ),
        timeout=lease + 20,
    )
    assert lapsed


# A task that binds its port only once `go` exists, as a TF task binds after `import tensorflow`
# (seconds after its start); or that ends without binding it.
BIND_LATE = (
    "while [ ! -e go ]; do sleep 0.02; done; exec {python} -c 'import socket, time; "
    's = socket.socket(); s.bind(("0.0.0.0", {port})); s.listen(); '
    'open("bound", "w").close(); time.sleep(60)\''
)
EXIT_LATE = "while [ ! -e go ]; do sleep 0.02; done; exit 0"


@pytest.mark.parametrize("then", ["binds", "exits"])
def test_a_started_runs_reservation_lasts_until_its_task_binds_or_ends(
    workdir: Path, then: str
) -> None:
    port = free_port()
    run_dir = new_run(workdir, "r1")
    ok(call(workdir, "hello", ports=[port], run_id="r1", lease_seconds=30))
    command = BIND_LATE.format(python=PYTHON, port=port) if then == "binds" else EXIT_LATE
    task = {"name": "worker:0", "command": command}
    # The host's last start: the reservation is handed to the task, which has not bound yet.
    ok(call(workdir, "start", run_id="r1", tasks=[task], grace=1, release=True))
    between = ok(call(workdir, "hello", ports=[port], run_id="r2", lease_seconds=30))
    assert between["busy_ports"] == [port] and between["reserved_by"] == {str(port): "r1"}
    assert between["reserved_state"] == {str(port): "running"}  # issue 47: not "starting"
    (run_dir / "code/go").touch()
    if then == "binds":
        wait_for(lambda: (run_dir / "code/bound").exists())
    else:
        wait_for(lambda: (run_dir / "tasks/worker-0/exit.json").exists())
    after = ok(call(workdir, "hello", ports=[port], run_id="r2", lease_seconds=30))
    # Bound: the bind check says it is busy. Ended: it is free, as if never reserved.
    assert after["busy_ports"] == ([port] if then == "binds" else []), after
    assert after["reserved_by"] == {}
    holders = [json.loads(p.read_text())["run_id"] for p in workdir.glob("hosts/*/ports/*.json")]
    assert "r1" not in holders  # its record went when seen


def test_agent_stop_reports_escaped_processes(tmp_path: Path, run_id: str) -> None:
    agent = Agent(LocalTransport("here"), python=sys.executable, workdir=str(tmp_path / "wd"))
    agent.install()
    ok(call(tmp_path / "wd", "materialize", run_id=run_id, job="j", files=[], lease_seconds=None))
    env = {"TFDEPLOY_RUN_ID": run_id}
    [task] = agent.start(run_id, [{"name": "worker:0", "command": ESCAPE, "env": env}], grace=1)
    assert task.pid is not None
    stray = escaped_pid(runs_dir(tmp_path / "wd") / run_id, task.pid)
    report = agent.stop(run_id, grace=1)
    assert [(e.pid, e.cmd, e.signal) for e in report.escaped] == [(stray, "sleep 600", 15)]
    assert [t.reason for t in report.tasks] == ["stopped"]
    agent.close_session()


def test_a_poll_answered_by_a_one_shot_agent_reads_its_raw_logs(
    tmp_path: Path, run_id: str
) -> None:
    """A poll goes one-shot while the session is busy (or lost: a reconnect). The logs come
    raw after its reply line, which the one-shot path fed whole to the JSON parser: `up` lost
    a host after a dropped connection ("the tfdeploy agent failed: n 1355", seen in CI)."""
    agent = Agent(LocalTransport("here"), python=sys.executable, workdir=str(tmp_path / "wd"))
    agent.install()
    ok(call(tmp_path / "wd", "materialize", run_id=run_id, job="j", files=[], lease_seconds=None))
    env = {"TFDEPLOY_RUN_ID": run_id}
    agent.start(run_id, [{"name": "worker:0", "command": "printf 'a\\nb\\n'", "env": env}], grace=1)
    agent.close_session()  # no session: every call from here on is one-shot
    poll = agent.poll(run_id, {"worker:0": 0}, heartbeat=False)
    while poll.logs["worker:0"][0] < 4:
        poll = agent.poll(run_id, {"worker:0": 0}, heartbeat=False)
    assert poll.logs == {"worker:0": (4, b"a\nb\n")}
    agent.stop(run_id, grace=1)
