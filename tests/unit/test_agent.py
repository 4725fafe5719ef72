"""The remote agent driven exactly as the control side drives it: JSON on stdin, real processes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import (
    AGENT,
    PYTHON,
    alive,
    call,
    host_dir,
    new_run,
    ok,
    put_in_store,
    raw_call,
    runs_dir,
    start,
    status,
    wait_for,
    wait_state,
)
from tests.support.helpers import free_port

pytestmark = pytest.mark.timeout(60)


_VERSIONS = """
import platform
from importlib import metadata
found = "-"
for name in ("tensorflow", "tensorflow-cpu"):
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
print(platform.python_version(), found)
"""


def test_hello_reports_versions_and_busy_ports(workdir: Path) -> None:
    with socket.socket() as busy, socket.socket() as probe:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
        probe.close()
        used = busy.getsockname()[1]
        reply = ok(call(workdir, "hello", ports=[used, free]))
    venv_python, venv_tf = subprocess.run(
        [PYTHON, "-c", _VERSIONS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert reply["python"] == venv_python
    # The agent parses TensorFlow's dist-info itself (hostfacts.py); here the stdlib reads it,
    # where the venv has it (the unit tier's `.[dev]` venv has none: null).
    assert reply["tensorflow"] == (None if venv_tf == "-" else venv_tf)
    assert reply["busy_ports"] == [used]
    assert reply["workdir"] == str(workdir) and workdir.is_dir()
    assert reply["hostname"] == platform.node()
    assert reply["disk_free"] > 0
    assert len(reply["agent_id"]) == 12
    assert reply["host_id"] == host_dir(workdir).name
    assert reply["host_id"].startswith(platform.node() + "-") and reply["shared_with"] == []


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b'{"v": 2, "op": "hello"}', "agent speaks protocol 1, got 2"),
        (b"not json", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b'{"v": 1, "op": "fly"}', "unknown op 'fly'"),
        (b'{"v": 1, "op": "runs"}', "needs the parameter 'workdir'"),
        (b'{"v": 1, "op": "poll", "workdir": "WD", "run_id": "../x"}', "run id '../x'"),
        (b'{"v": 1, "op": "poll", "workdir": "WD", "run_id": "nope-xyz"}', "no run 'nope-xyz'"),
        (b'{"v": 1, "op": "hello", "workdir": "WD", "ports": [true]}', "port numbers"),
    ],
)
def test_bad_requests_get_a_sentence(payload: bytes, needle: str, tmp_path: Path) -> None:
    reply = raw_call(payload.replace(b"WD", str(tmp_path / "wd").encode()))
    assert reply["ok"] is False
    assert needle in reply["error"]
    assert not (tmp_path / "wd").exists()  # a refused request leaves nothing behind


def test_have_and_materialize_hard_link_with_modes(workdir: Path) -> None:
    script = put_in_store(workdir, b"#!/bin/sh\necho hi\n")
    data = put_in_store(workdir, b"1,2,3\n")
    absent = hashlib.sha256(b"absent").hexdigest()
    assert ok(call(workdir, "have", hashes=[script, data, absent]))["missing"] == [absent]
    files = [["bin/run.sh", script, 0o4755], ["data/x/y.csv", data, 0o200]]
    files += [["top.csv", data, 0o600], ["other.csv", data, 0]]
    run_dir = new_run(workdir, files=files)
    code, store = run_dir / "code", workdir / "store"
    # The store's inodes keep their mode (other runs and hosts may link them): another mode
    # is a copy of its own in the store, <sha256>.<mode>, linked by every file that wants it.
    assert (store / script).stat().st_mode & 0o777 == 0o600
    assert (code / "bin/run.sh").stat().st_ino == (store / f"{script}.755").stat().st_ino
    assert (code / "bin/run.sh").stat().st_mode & 0o7777 == 0o755
    assert (code / "data/x/y.csv").read_bytes() == b"1,2,3\n"
    assert (code / "data/x/y.csv").stat().st_mode & 0o777 == 0o600  # made user-readable
    assert (code / "data/x/y.csv").stat().st_ino == (store / data).stat().st_ino
    assert (code / "top.csv").stat().st_ino == (code / "data/x/y.csv").stat().st_ino
    assert (code / "other.csv").stat().st_ino == (store / f"{data}.400").stat().st_ino
    assert (code / "other.csv").stat().st_mode & 0o777 == 0o400
    assert (code / "top.csv").stat().st_mode & 0o777 == 0o600
    again = new_run(workdir, "r2", files=[["run.sh", script, 0o755]])  # the copy is reused
    assert (again / "code/run.sh").stat().st_ino == (code / "bin/run.sh").stat().st_ino
    assert run_dir.stat().st_mode & 0o777 == 0o700
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["job"] == "demo" and meta["controller"] == "test" and (run_dir / "lease").exists()


@pytest.mark.parametrize("relpath", ["../evil", "/etc/evil", "a/../../evil", ""])
def test_materialize_rejects_unsafe_paths(workdir: Path, relpath: str) -> None:
    digest = put_in_store(workdir, b"x")
    reply = call(workdir, "materialize", run_id="r1", job="j", files=[[relpath, digest, 0o644]])
    assert reply["ok"] is False and repr(relpath) in reply["error"]
    assert not (workdir / "evil").exists() and not list(workdir.glob("hosts/*/runs/evil"))


def test_materialize_names_missing_store_content(workdir: Path) -> None:
    absent = hashlib.sha256(b"absent").hexdigest()
    reply = call(workdir, "materialize", run_id="r1", job="j", files=[["a.py", absent, 0o644]])
    assert reply["ok"] is False and "'a.py'" in reply["error"]


def test_setup_runs_once_per_fingerprint_and_reports_failure(workdir: Path) -> None:
    run_dir = new_run(workdir)
    once = {"commands": ['echo "$GREETING" >> count.txt'], "env": {"GREETING": "hi there"}}
    first = ok(call(workdir, "setup", run_id="r1", fingerprint="fp1", **once))
    again = ok(call(workdir, "setup", run_id="r1", fingerprint="fp1", **once))
    assert (first["ran"], first["code"], again["ran"]) == (True, 0, False)
    assert (run_dir / "code/count.txt").read_text() == "hi there\n"
    failing = ["echo before", "echo boom >&2; exit 7", "echo never"]
    for _ in range(2):  # a failure leaves no marker, so it runs again
        reply = ok(call(workdir, "setup", run_id="r1", fingerprint="fp2", commands=failing))
        assert (reply["ran"], reply["code"]) == (True, 7)
        assert "boom" in reply["tail"] and "never" not in "\n".join(reply["tail"])
    assert "before" in (run_dir / "setup.log").read_text()


def test_task_runs_then_exits_with_its_code(workdir: Path) -> None:
    new_run(workdir)
    [task] = start(workdir, {"name": "worker:0", "command": "echo hi; sleep 0.5; exit 3"})
    assert task["state"] == "running" and task["pid"] == task["pgid"]
    done = wait_state(workdir, "worker:0", "exited")
    assert (done["exit_code"], done["signal"], done["reason"]) == (3, None, "exited")
    assert done["log_bytes"] == 3 and done["ended"] >= done["started"]


def test_task_killed_by_signal_records_it(workdir: Path) -> None:
    new_run(workdir)
    [task] = start(workdir, {"name": "worker:0", "command": "sleep 30"})
    os.kill(task["pid"], signal.SIGKILL)
    done = wait_state(workdir, "worker:0", "exited")
    assert (done["exit_code"], done["signal"], done["reason"]) == (None, 9, "signal")


def test_one_start_of_several_tasks_runs_each_in_a_group_of_its_own(workdir: Path) -> None:
    # How quick one call of several tasks is against one call per task is a timing claim:
    # bench/agent_start.py measures it (docs/bench/agent_start.md).
    new_run(workdir)
    started = start(workdir, *({"name": f"worker:{i}", "command": "sleep 30"} for i in range(6)))
    assert [t["state"] for t in started] == ["running"] * 6
    assert len({t["pgid"] for t in started}) == 6
    assert all(os.getpgid(t["pid"]) == t["pgid"] for t in started)


def test_stop_escalates_to_sigkill_of_the_whole_group(workdir: Path) -> None:
    run_dir = new_run(workdir)
    lingers = 100  # seconds the stubborn group would live on by itself
    stubborn = f'trap "" TERM; sleep {lingers} & echo $! > child.pid; sleep {lingers}'
    [task] = start(workdir, {"name": "worker:0", "command": stubborn})
    child_file = run_dir / "code/child.pid"
    child = int(wait_for(lambda: child_file.exists() and child_file.read_text().strip()))
    assert alive(child) and os.getpgid(child) == task["pgid"]
    began = time.monotonic()
    [done] = ok(call(workdir, "stop", run_id="r1", tasks=["worker:0"], grace=1.0))["tasks"]
    elapsed = time.monotonic() - began
    # After the 1 s grace, and long before the stubborn `sleep 100`s would end by themselves (a
    # bound a loaded machine cannot break; how quick it is belongs in bench/).
    assert 1.0 <= elapsed < lingers, f"stop took {elapsed:.2f}s"
    assert (done["state"], done["signal"], done["reason"]) == ("exited", 9, "stopped")
    assert not alive(task["pid"]) and not alive(child)


def test_stop_of_a_polite_task_is_prompt(workdir: Path) -> None:
    new_run(workdir)
    start(workdir, {"name": "ps:0", "command": "sleep 30"}, {"name": "chief", "command": "exit 0"})
    began = time.monotonic()
    reply = ok(call(workdir, "stop", run_id="r1", tasks=None, grace=60))
    assert time.monotonic() - began < 30  # the polite task's exit, not the 60 s grace
    by_name = {t["name"]: t for t in reply["tasks"]}
    assert (by_name["ps:0"]["signal"], by_name["ps:0"]["reason"]) == (15, "stopped")
    assert by_name["chief"]["reason"] == "exited"


def test_supervisor_survives_its_starter_going_away(workdir: Path) -> None:
    new_run(workdir)
    request = {"v": 1, "op": "start", "workdir": str(workdir), "run_id": "r1", "grace": 1}
    request["tasks"] = [{"name": "worker:0", "command": "sleep 30"}]
    # Like an SSH session: its own session, pipes read to EOF. If the supervisor kept the
    # pipes, communicate() would hang until the timeout.
    starter = subprocess.Popen(
        ["/bin/sh", "-c", f"{PYTHON} {AGENT}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    out, _ = starter.communicate(json.dumps(request).encode(), timeout=5)
    [task] = ok(json.loads(out))["tasks"]
    for sig in (signal.SIGHUP, signal.SIGKILL):  # the connection drops
        with contextlib.suppress(ProcessLookupError):
            os.killpg(starter.pid, sig)
    time.sleep(0.5)
    pids = json.loads((runs_dir(workdir) / "r1/tasks/worker-0/pid.json").read_text())
    assert os.getsid(pids["supervisor"]) == pids["supervisor"]  # a session of its own
    assert alive(pids["supervisor"]) and alive(task["pid"])
    assert status(workdir, "worker:0")["state"] == "running"


def test_lease_expiry_stops_attached_runs_only(workdir: Path) -> None:
    new_run(workdir, "attached", lease_seconds=1)
    new_run(workdir, "detached", lease_seconds=1, detached=True)
    for run_id in ("attached", "detached"):
        start(workdir, {"name": "worker:0", "command": "sleep 30"}, run_id=run_id, grace=0.5)

    def attached() -> dict[str, Any]:
        reply = ok(call(workdir, "poll", run_id="attached", offsets={}, max_bytes=0))
        return reply["tasks"][0]  # type: ignore[no-any-return]

    began = time.monotonic()
    done = wait_for(lambda: attached()["state"] == "exited" and attached(), timeout=20)
    assert done["reason"] == "lease expired" and time.monotonic() - began < 20  # not the sleep 30
    reply = ok(call(workdir, "poll", run_id="detached", offsets={}, max_bytes=0, heartbeat=False))
    assert reply["tasks"][0]["state"] == "running"


def test_heartbeat_keeps_a_lease_alive(workdir: Path) -> None:
    # A 3 s lease: a loaded machine may take a second or more per agent call, and the gap between
    # two heartbeats is a call and a pause.
    new_run(workdir, lease_seconds=3)
    start(workdir, {"name": "worker:0", "command": "sleep 30"})
    began = time.monotonic()
    while time.monotonic() - began < 4.5:  # well past the lease
        time.sleep(0.3)
        reply = ok(call(workdir, "poll", run_id="r1", offsets={}, max_bytes=0, heartbeat=True))
        assert reply["tasks"][0]["state"] == "running"


def test_killed_supervisor_and_group_is_lost(workdir: Path) -> None:
    run_dir = new_run(workdir)
    [task] = start(workdir, {"name": "worker:0", "command": "sleep 30"})
    pids = json.loads((run_dir / "tasks/worker-0/pid.json").read_text())
    os.kill(pids["supervisor"], signal.SIGKILL)
    assert status(workdir, "worker:0")["state"] == "running"  # the task itself lives on
    os.killpg(task["pgid"], signal.SIGKILL)
    assert wait_state(workdir, "worker:0", "lost")["exit_code"] is None


def test_stop_without_supervisor_records_the_stop(workdir: Path) -> None:
    run_dir = new_run(workdir)
    [task] = start(workdir, {"name": "worker:0", "command": "sleep 30"})
    pids = json.loads((run_dir / "tasks/worker-0/pid.json").read_text())
    os.kill(pids["supervisor"], signal.SIGKILL)
    [done] = ok(call(workdir, "stop", run_id="r1", tasks=None, grace=1))["tasks"]
    assert (done["state"], done["reason"], done["signal"]) == ("exited", "stopped", 15)
    assert not alive(task["pid"])


def logs_of(reply: dict[str, Any]) -> dict[str, bytes]:
    """Each task's bytes of a poll: raw after the reply line, in the order `logs` lists them."""
    raw, at, out = reply.get("_raw", b""), 0, {}
    for entry in reply["logs"]:
        out[entry["task"]] = raw[at : at + entry["bytes"]]
        at += entry["bytes"]
    assert at == len(raw)
    return out


def test_poll_returns_logs_by_offset_without_loss(workdir: Path) -> None:
    new_run(workdir)
    lines = 'i=0; while [ $i -lt 3000 ]; do echo "line $i"; i=$((i+1)); done; sleep 0.3'
    start(workdir, {"name": "worker:0", "command": lines}, {"name": "worker:1", "command": lines})
    got = {"worker:0": b"", "worker:1": b""}
    offsets = dict.fromkeys(got, 0)
    while True:
        reply = ok(call(workdir, "poll", run_id="r1", offsets=offsets, max_bytes=4000))
        chunk = 0
        for name, data in logs_of(reply).items():
            offset = next(e["offset"] for e in reply["logs"] if e["task"] == name)
            assert offset == offsets[name] + len(data)
            got[name] += data
            offsets[name] = offset
            chunk += len(data)
        assert chunk <= 4000
        tasks = reply["tasks"]
        if all(t["state"] == "exited" and t["log_bytes"] == offsets[t["name"]] for t in tasks):
            break
    expected = "".join(f"line {i}\n" for i in range(3000)).encode()
    assert got == {"worker:0": expected, "worker:1": expected}


def test_poll_shares_max_bytes_fairly_and_reports_listening_ports(workdir: Path) -> None:
    new_run(workdir)
    start(workdir, {"name": "a", "command": "seq 1 5000"}, {"name": "b", "command": "echo hi"})
    wait_state(workdir, "a", "exited")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        offsets = {"a": 0, "b": 0}
        reply = ok(call(workdir, "poll", run_id="r1", offsets=offsets, max_bytes=100, ports=[port]))
    assert reply["logs"] == [
        {"task": "a", "offset": 97, "bytes": 97},
        {"task": "b", "offset": 3, "bytes": 3},
    ]
    seq = "".join(f"{i}\n" for i in range(1, 5001)).encode()
    assert logs_of(reply) == {"a": seq[:97], "b": b"hi\n"}
    assert reply["listening"] == [port]


def test_env_reaches_the_task_byte_for_byte(workdir: Path, tmp_path: Path) -> None:
    run_dir = new_run(workdir)
    marker = tmp_path / "pwned"
    hostile = {
        "QUOTES": 'it\'s "quoted"',
        "SUBST": f"$(touch {marker})",
        "TICKS": f"`touch {marker}`",
        "SEMI": f"x; touch {marker}",
        "LINES": "one\ntwo\n",
        "SPACES": "  a  b  ",
        "UNICODE": "grüße ✓ 東京",
        "SECRET_TOKEN": "s3cr3t-value-1234",
    }
    script = (
        "import json, os, time\n"
        f"keys = {sorted(hostile)!r}\n"
        "dump = {k: os.environb[k.encode()].hex() for k in keys}\n"
        "open('env.tmp', 'w').write(json.dumps(dump)); os.replace('env.tmp', 'env.json')\n"
        "time.sleep(30)\n"
    )
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}"
    [task] = start(workdir, {"name": "worker:0", "command": command, "env": hostile})
    env_file = run_dir / "code/env.json"
    dump = json.loads(wait_for(lambda: env_file.exists() and env_file.read_text()))
    assert {k: bytes.fromhex(v).decode() for k, v in dump.items()} == hostile
    assert not marker.exists()
    spec = run_dir / "tasks/worker-0/spec.json"
    assert spec.stat().st_mode & 0o777 == 0o600 and run_dir.stat().st_mode & 0o777 == 0o700
    pids = json.loads((run_dir / "tasks/worker-0/pid.json").read_text())
    for pid in (pids["supervisor"], task["pid"]):
        assert b"s3cr3t" not in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_restart_after_exit_and_refusal_while_running(workdir: Path) -> None:
    new_run(workdir)
    start(workdir, {"name": "worker:0", "command": "echo first"})
    wait_state(workdir, "worker:0", "exited")
    start(workdir, {"name": "worker:0", "command": "sleep 30"})
    reply = call(workdir, "start", run_id="r1", tasks=[{"name": "worker:0", "command": "true"}])
    assert reply["ok"] is False and "still running" in reply["error"]


def test_runs_lists_newest_first_and_tolerates_half_written_runs(workdir: Path) -> None:
    new_run(workdir, "old", job="first")
    time.sleep(0.02)
    new_run(workdir, "new", job="second", detached=True)
    start(workdir, {"name": "worker:0", "command": "exit 0"}, run_id="new")
    broken = runs_dir(workdir) / "broken"
    (broken / "tasks" / "ps-0").mkdir(parents=True)
    (broken / "run.json").write_text('{"run_id": "bro')
    listed = ok(call(workdir, "runs"))["runs"]
    assert [r["run_id"] for r in listed if r["run_id"] != "broken"] == ["new", "old"]
    first = listed[[r["run_id"] for r in listed].index("new")]
    assert first["job"] == "second" and first["detached"] is True
    assert first["tasks"][0]["name"] == "worker:0"
    broken_entry = next(r for r in listed if r["run_id"] == "broken")
    assert broken_entry["tasks"][0]["state"] == "starting"


def test_runs_send_a_run_s_host_list_only_while_it_is_active_or_when_named(
    workdir: Path,
) -> None:
    """Every host keeps every run: an ended run's list of all hosts is history nobody reads,
    and N hosts each sending N-host lists for every old run grew with hosts² x runs."""
    hosts = [["h1", "10.0.0.1"], ["h2", "10.0.0.2"]]
    new_run(workdir, "ended", hosts=hosts, hosts_at=1.0)
    start(workdir, {"name": "worker:0", "command": "exit 0"}, run_id="ended")
    wait_for(lambda: status(workdir, "worker:0", run_id="ended")["state"] == "exited")
    new_run(workdir, "live", hosts=hosts, hosts_at=2.0)
    start(workdir, {"name": "worker:0", "command": "sleep 30"}, run_id="live")
    listed = {r["run_id"]: r for r in ok(call(workdir, "runs"))["runs"]}
    assert listed["live"]["hosts"] == hosts and listed["live"]["hosts_at"] == 2.0
    assert listed["ended"]["hosts"] is None and listed["ended"]["hosts_at"] is None
    named = {r["run_id"]: r for r in ok(call(workdir, "runs", hosts_of="ended"))["runs"]}
    assert named["ended"]["hosts"] == hosts and named["live"]["hosts"] == hosts


def test_stop_of_a_run_that_never_reached_the_host_is_a_no_op(workdir: Path) -> None:
    # Ctrl-C during push: teardown asks hosts that may not have the run yet.
    assert ok(call(workdir, "stop", run_id="absent", tasks=None, grace=0))["tasks"] == []
    reply = call(workdir, "stop", run_id="absent", tasks=["worker:0"], grace=0)
    assert reply["ok"] is False and "no run 'absent'" in reply["error"]


def test_a_stopped_run_never_starts_again(workdir: Path) -> None:
    new_run(workdir)
    ok(call(workdir, "stop", run_id="r1", tasks=None, grace=0))
    reply = call(workdir, "start", run_id="r1", tasks=[{"name": "worker:0", "command": "true"}])
    assert reply["ok"] is False and "was stopped" in reply["error"]
    assert not (runs_dir(workdir) / "r1/tasks/worker-0").exists()


def test_a_stop_during_start_sees_every_task_of_that_start(workdir: Path) -> None:
    # Ctrl-C while `start` is in flight: the stop waits for the start's lock, then stops all.
    new_run(workdir)
    tasks = [{"name": f"worker:{i}", "command": "sleep 30"} for i in range(4)]
    request = {"v": 1, "op": "start", "workdir": str(workdir), "run_id": "r1", "tasks": tasks}
    starter = subprocess.Popen(
        [PYTHON, str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert starter.stdin is not None
    starter.stdin.write(json.dumps(request))
    starter.stdin.close()
    wait_for(lambda: list(workdir.glob("hosts/*/runs/r1/tasks")), step=0.001)
    stopped = ok(call(workdir, "stop", run_id="r1", tasks=None, grace=0))["tasks"]
    starter.wait(timeout=20)
    assert [t["name"] for t in stopped] == [f"worker:{i}" for i in range(4)]
    assert {t["state"] for t in stopped} == {"exited"}


def test_a_whole_run_stop_ends_a_running_setup(workdir: Path) -> None:
    run_dir = new_run(workdir)
    request = {
        "v": 1,
        "op": "setup",
        "workdir": str(workdir),
        "run_id": "r1",
        "fingerprint": "slow",
        "commands": ["echo $$ > setup.pid; sleep 60", "echo never > never.txt"],
    }
    setup = subprocess.Popen(
        [PYTHON, str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert setup.stdin is not None
    setup.stdin.write(json.dumps(request))
    setup.stdin.close()
    pid_file = run_dir / "code/setup.pid"
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip()))
    began = time.monotonic()
    ok(call(workdir, "stop", run_id="r1", tasks=None, grace=1))
    assert setup.stdout is not None and setup.wait(timeout=10) == 0
    assert time.monotonic() - began < 30  # the stop's, not the setup's `sleep 60`
    reply = json.loads(setup.stdout.read())
    # Issue 47: not `exit code 143`, which `up` showed as a setup failure: the stop, named.
    assert reply["ok"] is False and "run r1 was stopped on this host" in reply["error"]
    assert not alive(pid)
    assert not (run_dir / "code/never.txt").exists()
    assert not (host_dir(workdir) / "setup/slow.ok").exists()


def test_restarts_are_counted_and_frozen_tasks_reported(workdir: Path) -> None:
    new_run(workdir)
    [first] = start(workdir, {"name": "worker:0", "command": "exit 1"})
    assert first["restarts"] == 0
    for n in (1, 2):
        wait_state(workdir, "worker:0", "exited")
        [again] = start(workdir, {"name": "worker:0", "command": "sleep 30"})
        assert again["restarts"] == n
        if n == 1:
            os.kill(again["pid"], signal.SIGKILL)
    running = wait_state(workdir, "worker:0", "running")
    assert running["frozen"] is False
    os.kill(running["pid"], signal.SIGSTOP)
    try:
        assert wait_for(lambda: status(workdir, "worker:0")["frozen"]) is True
    finally:
        os.kill(running["pid"], signal.SIGCONT)
    assert status(workdir, "worker:0")["restarts"] == 2


def test_an_idle_session_leaves_and_the_client_resends_one_shot(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cut link leaves the host's end of a session open for hours: it must not linger.
    from deployer.hosts.agent import Agent
    from deployer.hosts.local_transport import LocalTransport

    transport = LocalTransport("here", env={"TFDEPLOY_SERVE_IDLE_S": "1"})
    agent = Agent(transport, python=PYTHON, workdir=str(workdir))
    agent.install()
    session = agent._session
    assert session is not None
    proc = session._proc  # type: ignore[attr-defined]
    assert agent.call("runs")["runs"] == []  # over the session
    assert proc.wait(timeout=5) == 75  # left while idle
    assert agent.call("runs")["runs"] == []  # resent one-shot, no error
    assert agent._session is None


def test_everything_the_agent_writes_is_private(workdir: Path) -> None:
    """Run records, logs, leases and locks may reveal a job: 0600 files in 0700 directories."""
    new_run(workdir, detached=False, lease_seconds=30)
    ok(call(workdir, "setup", run_id="r1", fingerprint="fp", commands=["true"]))
    start(workdir, {"name": "worker:0", "command": "echo hi", "env": {"API_KEY": "s3cret"}})
    wait_state(workdir, "worker:0", "exited")
    ok(call(workdir, "stop", run_id="r1", tasks=None, grace=1))
    code = runs_dir(workdir) / "r1" / "code"
    seen = []
    for path in [workdir, *workdir.rglob("*")]:
        if path.is_relative_to(code) or path.parent.name == "store":
            continue  # the job's own files keep the modes they have on the controller
        mode = path.stat().st_mode & 0o777
        seen.append(path.name)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path} is {oct(mode)}"
    assert {"run.json", "lease", ".lock", "spec.json", "pid.json", "exit.json"} <= set(seen)
    assert {"output.log", "supervisor.log", "setup.log", "tasks"} <= set(seen)


def test_the_client_has_one_typed_method_per_op(workdir: Path) -> None:
    from deployer.hosts.agent import Agent
    from deployer.hosts.local_transport import LocalTransport
    from deployer.hosts.reply_types import SetupResult

    agent = Agent(LocalTransport("here"), python=PYTHON, workdir=str(workdir))
    agent.install()
    new_run(workdir)
    try:
        first = agent.setup("r1", ["echo one", "echo two >&2"], {"A": "b"}, "fp-typed")
        assert first == SetupResult(
            code=0,
            ran=True,
            tail=("tfdeploy setup: echo one", "one", "tfdeploy setup: echo two >&2", "two"),
        )
        assert agent.setup("r1", ["false"], {}, "fp-typed") == SetupResult(0, False, ())
        failed = agent.setup("r1", ["exit 4"], {}, "fp-fails")
        assert (failed.code, failed.ran) == (4, True)
        assert set(agent.gpus()) >= {"nvidia_smi", "gpus", "apps"}
    finally:
        agent.close_session()


def test_an_intact_agent_is_kept_and_a_damaged_one_installed_again(workdir: Path) -> None:
    """The bootstrap checks the installed files against their content id at every hello: an
    intact install is used as it is (the files never travel again), a damaged file (a disk
    error, a half-copied file) and a stray module are replaced; the lab's test does it over SSH
    (tests/integration/test_faults.py)."""
    from deployer.hosts.agent import Agent
    from deployer.hosts.bootstrap import agent_files, agent_id
    from deployer.hosts.local_transport import LocalTransport

    agent = Agent(LocalTransport("here"), python=PYTHON, workdir=str(workdir))
    home = workdir / "agent" / agent_id()
    try:
        agent.install()
        installed = (home / "agent.py").stat().st_ino
        agent.install()
        assert (home / "agent.py").stat().st_ino == installed  # not written again
        with open(home / "agent.py", "a") as f:
            f.write(")(")
        (home / "stray.py").write_text("x = 1\n")
        assert agent.install()["agent_id"] == agent_id()  # the hello answered, from the new files
        assert (home / "agent.py").read_text() == agent_files()["agent.py"]
        assert not (home / "stray.py").exists()
    finally:
        agent.close_session()


def test_an_existing_workdir_keeps_its_mode(tmp_path: Path) -> None:
    """workdir = "/tmp" (or "~") must not make that directory private to one user."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    ok(call(shared, "hello"))
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "hosts").stat().st_mode) == 0o700  # what it made is private


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_hellos_stand_ins_end_with_its_session_and_a_netcheck_ops_keep_their_deadline(
    workdir: Path,
) -> None:
    """Ctrl-C during preflight, between a hello that started stand-ins and their release: the
    controller's session ends, and nobody will probe or close them. They went at their deadline
    (60 s and more), and every following `up` of the port was refused meanwhile (seen in a full
    suite run). Now a hello's stand-ins end with the agent process that serves its session. A
    netcheck op's may be answered by a one-shot process: those keep their deadline."""
    port = free_port()
    request = {
        "v": 1,
        "op": "hello",
        "workdir": str(workdir),
        "ports": [port],
        "run_id": "r-session",
        "lease_seconds": 60,
        "listen": {"ports": [port], "seconds": 60},
    }
    session = subprocess.Popen(
        [PYTHON, str(AGENT), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert session.stdin is not None and session.stdout is not None
    session.stdin.write(json.dumps(request).encode() + b"\n")
    session.stdin.flush()
    assert ok(json.loads(session.stdout.readline()))["listening"]
    assert wait_for(lambda: _listening(port))
    session.stdin.close()  # the controller went away
    assert session.wait(timeout=10) == 0
    assert wait_for(lambda: not _listening(port), timeout=5)

    other = free_port()
    one_shot = call(workdir, "netcheck", action="listen", run_id="r-op", ports=[other], seconds=60)
    assert ok(one_shot)["pid"] and wait_for(lambda: _listening(other))
    time.sleep(2)  # longer than a stand-in takes to see its owner gone
    assert _listening(other), "a one-shot netcheck op's stand-ins must live to their deadline"
    ok(call(workdir, "netcheck", action="close", run_id="r-op"))
    assert not _listening(other)


def test_the_network_check_stand_ins_go_with_the_run_s_code_or_its_release(
    workdir: Path,
) -> None:
    """The hello starts them; the push's first materialize (up) or release (check, a failed
    preflight) stops them, each in a request the controller makes anyway."""
    for ends in ("materialize", "release"):
        port = free_port()
        hello = call(
            workdir,
            "hello",
            ports=[port],
            run_id=f"r-{ends}",
            lease_seconds=60,
            listen={"ports": [port], "seconds": 60},
        )
        assert ok(hello)["listening"] and wait_for(lambda p=port: _listening(p))
        if ends == "materialize":
            new_run(workdir, f"r-{ends}")
        else:
            ok(call(workdir, "release", run_id=f"r-{ends}"))
        assert not _listening(port), ends


def test_a_task_without_a_log_yet_says_zero_bytes_and_its_poll_passes_the_edge(
    workdir: Path,
) -> None:
    """A task whose supervisor has not made output.log yet (a start under way) is polled as
    `log_bytes` 0, not null: the control side's edge, which checks every field against its
    shape, refused the whole poll for a null there."""
    from deployer.hosts.replies import Edge
    from remote import protocol

    run_dir = new_run(workdir)
    task_dir = run_dir / "tasks" / "worker-0"
    task_dir.mkdir(parents=True)
    (task_dir / "spec.json").write_text(json.dumps({"name": "worker:0", "command": "true"}))
    reply = ok(call(workdir, "poll", run_id="r1", offsets={}, max_bytes=0))
    [task] = reply["tasks"]
    assert task["name"] == "worker:0" and task["log_bytes"] == 0, task
    checked = Edge("h1", "poll").reply(reply, protocol.PollReply)
    assert checked["tasks"][0]["log_bytes"] == 0
    # No start will come: without its spec the workdir's stop does not wait out START_TIMEOUT
    # for one (remote/taskops.py), which would cost this test 10 s.
    (task_dir / "spec.json").unlink()
