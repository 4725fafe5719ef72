"""Hosts sharing one workdir (NFS or EFS homes), simulated on this machine.

Each "host" is the agent run with another identity (TFDEPLOY_HOST_ID, which replaces the computed
one for tests); where the real failure needs it, agents also run in PID namespaces of their own,
so they have the same pids, as processes of different machines do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from remote.protocol import HOST_ID_ENV
from tests.support.agent import AGENT, ESCAPE, PYTHON, alive, escaped_pid, raw_call, wait_for
from tests.support.local_pythons import old_pythons

pytestmark = pytest.mark.timeout(90)

A, B = "host-a", "host-b"
# The agent as a host's interpreter runs it: the venv's, and 3.8 and 3.9 where the machine has them.
PYTHONS = [PYTHON, *old_pythons()]


def on(host: str, workdir: Path, op: str, python: str = PYTHON, **params: Any) -> dict[str, Any]:
    """One call of the agent as `host`; the reply must be ok."""
    request = {"v": 1, "op": op, "workdir": str(workdir), **params}
    reply = raw_call(json.dumps(request).encode(), host=host, python=python)
    assert reply["ok"] is True, reply
    return reply


def run_dir(workdir: Path, host: str, run: str) -> Path:
    return workdir / "hosts" / host / "runs" / run


def materialize(host: str, workdir: Path, run: str, python: str = PYTHON, **fields: Any) -> None:
    fields = {"job": "demo", "detached": False, "lease_seconds": None, "files": [], **fields}
    on(host, workdir, "materialize", python, run_id=run, controller="test", **fields)


def tasks(host: str, workdir: Path, run: str, python: str = PYTHON, **params: Any) -> Any:
    reply = on(host, workdir, "poll", python, run_id=run, offsets={}, max_bytes=0, **params)
    return {t["name"]: t for t in reply["tasks"]}


def test_each_host_names_itself_and_the_hosts_it_shares_the_workdir_with(workdir: Path) -> None:
    first = on(A, workdir, "hello", ports=[])
    assert (first["host_id"], first["shared_with"]) == (A, [])
    # The later of two hosts always sees the earlier one; the control side joins the pairs.
    assert on(B, workdir, "hello", ports=[])["shared_with"] == [A]
    assert on(A, workdir, "hello", ports=[])["shared_with"] == [B]
    assert sorted(p.name for p in (workdir / "hosts").iterdir()) == [A, B]


def test_tokens_of_hosts_gone_for_a_day_age_out(workdir: Path) -> None:
    for host in (A, B, "host-c"):
        on(host, workdir, "hello", ports=[])
    materialize("host-c", workdir, "kept")  # host-c has records: they stay, its token goes
    day_ago = time.time() - 25 * 3600
    for host in (B, "host-c"):
        os.utime(workdir / "hosts" / host / "hello", (day_ago, day_ago))
    assert on(A, workdir, "hello", ports=[])["shared_with"] == []
    assert not (workdir / "hosts" / B).exists()
    assert not (workdir / "hosts/host-c/hello").exists()
    assert (run_dir(workdir, "host-c", "kept") / "run.json").is_file()
    assert on("host-c", workdir, "hello", ports=[])["shared_with"] == [A]


def hello_with_hostname(workdir: Path, hostname: str) -> dict[str, Any]:
    """A hello in a UTS namespace of its own: a lab host (same machine id, its own hostname)."""
    request = json.dumps({"v": 1, "op": "hello", "workdir": str(workdir), "ports": []})
    script = 'hostname "$1" && exec "$2" "$3"'
    proc = subprocess.run(
        ["unshare", "--uts", "sh", "-c", script, "sh", hostname, PYTHON, str(AGENT)],
        input=request.encode(),
        capture_output=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k != HOST_ID_ENV},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    reply: dict[str, Any] = json.loads(proc.stdout)
    assert reply["ok"], reply
    return reply


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_hosts_of_one_machine_with_their_own_hostnames_differ(workdir: Path) -> None:
    first = hello_with_hostname(workdir, "lab-one")["host_id"]
    second = hello_with_hostname(workdir, "lab-two")
    assert first.startswith("lab-one-") and second["host_id"].startswith("lab-two-")
    assert second["shared_with"] == [first]
    assert hello_with_hostname(workdir, "lab-one")["host_id"] == first  # stable
    assert first.partition("-o")[2] != second["host_id"].partition("-t")[2]


def at_once(commands: list[tuple[list[str], bytes, str]]) -> list[dict[str, Any]]:
    """Starts every (argv, stdin, host) first, then feeds them all together; their replies."""
    procs = [
        subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, HOST_ID_ENV: host},
        )
        for argv, _, host in commands
    ]
    time.sleep(0.5)  # every agent is up and waiting for its request
    outputs: list[tuple[bytes, bytes]] = [(b"", b"")] * len(procs)

    def talk(index: int) -> None:
        outputs[index] = procs[index].communicate(commands[index][1], timeout=60)

    threads = [threading.Thread(target=talk, args=(n,)) for n in range(len(procs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(70)
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0 and err == b"", err.decode()
    return [json.loads(out) for out, _ in outputs]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
@pytest.mark.parametrize("python", PYTHONS)
def test_hosts_pushing_the_same_content_at_once_all_succeed(workdir: Path, python: str) -> None:
    """Same pids on every host (each agent is PID 1 of its namespace), same content at once."""
    contents = [bytes([n]) * (3 << 20) + str(n).encode() for n in range(8)]
    digests = [hashlib.sha256(c).hexdigest() for c in contents]
    files = [[f"data/{n}.bin", d, 0o644] for n, d in enumerate(digests)]
    request = {"v": 1, "op": "materialize", "workdir": str(workdir), "run_id": "r1"}
    blobs = [[digest, len(content)] for digest, content in zip(digests, contents, strict=True)]
    request.update(job="j", files=files, blobs=blobs)
    payload = json.dumps(request).encode() + b"\n" + b"".join(contents)
    argv = ["unshare", "--pid", "--fork", python, str(AGENT)]
    hosts = [f"host-{n}" for n in range(4)]
    replies = at_once([(argv, payload, host) for host in hosts])
    assert [r["ok"] for r in replies] == [True] * len(hosts), replies
    store = workdir / "store"
    assert sorted(p.name for p in store.iterdir()) == sorted(digests)  # no .part left behind
    for digest in digests:
        assert hashlib.sha256((store / digest).read_bytes()).hexdigest() == digest
    for host in hosts:
        code = run_dir(workdir, host, "r1") / "code"
        assert [(code / f"data/{n}.bin").read_bytes() for n in range(8)] == contents


def test_content_one_host_stored_is_there_for_the_others(workdir: Path) -> None:
    """What the control side relies on to send each content once per shared store."""
    script, data = b"#!/bin/sh\necho hi\n", b"1,2,3\n"
    digests = [hashlib.sha256(c).hexdigest() for c in (script, data)]
    assert on(B, workdir, "have", hashes=digests)["missing"] == digests
    files = [["run.sh", digests[0], 0o755], ["data.csv", digests[1], 0o644]]
    blobs = [[digests[0], len(script), 0o755], [digests[1], len(data)]]  # the mode is optional
    request = {"v": 1, "op": "materialize", "workdir": str(workdir), "run_id": "r1"}
    request.update(job="j", files=files, blobs=blobs, lease_seconds=None)
    reply = raw_call(json.dumps(request).encode() + b"\n" + script + data, host=A)
    assert reply["ok"], reply
    assert on(B, workdir, "have", hashes=digests)["missing"] == []
    materialize(B, workdir, "r1", files=files)  # no bytes sent to B
    store = workdir / "store"
    for host in (A, B):  # modes as the blobs said: hard links, no copy of the content
        code = run_dir(workdir, host, "r1") / "code"
        assert (code / "run.sh").stat().st_ino == (store / digests[0]).stat().st_ino
        assert (code / "data.csv").stat().st_ino == (store / digests[1]).stat().st_ino
        assert (code / "run.sh").stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in store.iterdir()) == sorted(digests)


@pytest.mark.parametrize("python", PYTHONS)
def test_status_runs_and_stop_of_a_run_are_per_host(workdir: Path, python: str) -> None:
    for host, name in ((A, "worker:0"), (B, "worker:1")):
        materialize(host, workdir, "r1", python)
        task = {"name": name, "command": "sleep 30"}
        on(host, workdir, "start", python, run_id="r1", tasks=[task], grace=1)
    assert list(tasks(A, workdir, "r1", python)) == ["worker:0"]
    assert list(tasks(B, workdir, "r1", python)) == ["worker:1"]
    [listed] = on(B, workdir, "runs", python)["runs"]
    assert [t["name"] for t in listed["tasks"]] == ["worker:1"]
    stopped = on(A, workdir, "stop", python, run_id="r1", tasks=None, grace=1)
    assert [(t["name"], t["reason"]) for t in stopped["tasks"]] == [("worker:0", "stopped")]
    left = tasks(B, workdir, "r1", python)["worker:1"]
    assert left["state"] == "running" and alive(left["pid"])
    stopped = on(B, workdir, "stop", python, run_id="r1", tasks=None, grace=1)
    assert [(t["name"], t["reason"]) for t in stopped["tasks"]] == [("worker:1", "stopped")]


def test_the_lease_is_per_host(workdir: Path) -> None:
    """A controller that lost one host: that host's tasks end, the ones it still beats do not."""
    # A lapses at once; B is beaten below at least every second or so, with a margin for a
    # loaded machine (a beat late by a second must not end B's tasks: that is not the point).
    for host, lease in ((A, 1), (B, 5)):
        materialize(host, workdir, "r1", lease_seconds=lease)
        task = {"name": "worker:0", "command": "sleep 30"}  # the same name on both hosts
        on(host, workdir, "start", run_id="r1", tasks=[task], grace=0.5)

    def a_expired() -> bool:
        on(B, workdir, "poll", run_id="r1", offsets={}, max_bytes=0, heartbeat=True)
        return bool(tasks(A, workdir, "r1")["worker:0"]["state"] == "exited")

    wait_for(a_expired, timeout=8, step=0.3)
    assert tasks(A, workdir, "r1")["worker:0"]["reason"] == "lease expired"
    assert tasks(B, workdir, "r1", heartbeat=True)["worker:0"]["state"] == "running"


def test_a_whole_run_stop_spares_the_other_hosts_processes(workdir: Path, run_id: str) -> None:
    """Hosts sharing a pid namespace see each other's processes: a stop must tell them apart."""
    escaped = {}
    for host in (A, B):
        materialize(host, workdir, run_id)
        task = {"name": "w", "command": ESCAPE, "env": {"TFDEPLOY_RUN_ID": run_id}}
        [started] = on(host, workdir, "start", run_id=run_id, tasks=[task], grace=1)["tasks"]
        escaped[host] = escaped_pid(run_dir(workdir, host, run_id), started["pgid"])
    reply = on(A, workdir, "stop", run_id=run_id, tasks=None, grace=1)
    assert [e["pid"] for e in reply["escaped"]] == [escaped[A]] and not alive(escaped[A])
    assert alive(escaped[B]) and tasks(B, workdir, run_id)["w"]["state"] == "running"
    reply = on(B, workdir, "stop", run_id=run_id, tasks=None, grace=1)
    assert [e["pid"] for e in reply["escaped"]] == [escaped[B]] and not alive(escaped[B])


def test_a_lease_expiry_spares_the_other_hosts_processes(workdir: Path, run_id: str) -> None:
    escaped = {}
    for host, lease in ((A, 1), (B, None)):
        materialize(host, workdir, run_id, lease_seconds=lease)
        task = {"name": "w", "command": ESCAPE, "env": {"TFDEPLOY_RUN_ID": run_id}}
        [started] = on(host, workdir, "start", run_id=run_id, tasks=[task], grace=0.5)["tasks"]
        escaped[host] = escaped_pid(run_dir(workdir, host, run_id), started["pgid"])
    exit_file = run_dir(workdir, A, run_id) / "tasks/w/exit.json"
    record = json.loads(wait_for(lambda: exit_file.exists() and exit_file.read_text(), 10))
    assert record["reason"] == "lease expired"
    assert [e["pid"] for e in record["escaped"]] == [escaped[A]]
    assert alive(escaped[B]) and tasks(B, workdir, run_id)["w"]["state"] == "running"


def test_setup_markers_and_port_reservations_are_per_host(workdir: Path) -> None:
    for host in (A, B):
        materialize(host, workdir, "r1")
        reply = on(host, workdir, "setup", run_id="r1", fingerprint="fp", commands=["true"])
        assert reply["ran"] is True  # what ran on one machine did not run on the other
    port = 23000 + os.getpid() % 2000
    first = on(A, workdir, "hello", ports=[port], run_id="r1", lease_seconds=30)
    other = on(B, workdir, "hello", ports=[port], run_id="r2", lease_seconds=30)
    assert first["reserved_by"] == other["reserved_by"] == {}  # each machine has its own ports
    assert on(A, workdir, "hello", ports=[port], run_id="r2")["reserved_by"] == {str(port): "r1"}
    on(A, workdir, "release", run_id="r1")
    on(B, workdir, "release", run_id="r2")


def test_records_of_the_old_layout_are_left_alone(workdir: Path) -> None:
    """Runs written before records were per host: not listed, never signalled, no crash."""
    old = workdir / "runs" / "old"
    (old / "tasks/worker-0").mkdir(parents=True)
    (old / "run.json").write_text(json.dumps({"run_id": "old", "job": "j", "created": 1.0}))
    decoy = subprocess.Popen(["sleep", "30"])
    try:
        pids = {"supervisor": decoy.pid, "pid": decoy.pid, "pgid": decoy.pid, "started": 1.0}
        ticks = int(Path(f"/proc/{decoy.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        pids.update(start_ticks=ticks, supervisor_ticks=ticks)
        (old / "tasks/worker-0/pid.json").write_text(json.dumps(pids))
        (workdir / "ports/somehost").mkdir(parents=True)
        (workdir / "ports/somehost/1234.json").write_text('{"run_id": "old"}')
        on(A, workdir, "hello", ports=[1234], run_id="new", lease_seconds=5)
        # "new" is listed from its reservation on (issue 47: a starting run); "old" never.
        assert [r["run_id"] for r in on(A, workdir, "runs")["runs"]] == ["new"]
        assert on(A, workdir, "stop", run_id="old", tasks=None, grace=0)["tasks"] == []
        assert decoy.poll() is None
    finally:
        decoy.send_signal(signal.SIGKILL)
        decoy.wait()
