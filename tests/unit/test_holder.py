"""The holder (remote/holder.py): a real `agent.py hold JOB` process, real agent calls.

On a Slurm node the holder runs in a step that lasts as long as the allocation, and a session
started with TFDEPLOY_HOLDER hands it the ops that leave processes behind; the Slurm side (the
step, its cgroup, a detached run that outlives every session) is tested on the lab's cluster in
tests/integration/test_slurm_cgroup.py. Here: what is handed over, what is refused, by whom.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.agent import AGENT, PYTHON, new_run, raw_call, runs_dir, wait_for

pytestmark = pytest.mark.timeout(60)

REMOTE = AGENT.parent
MARK = "TFDEPLOY_TEST_HOLDER_MARK"  # in the holder's environment only


def _job() -> str:
    return str(10**8 + secrets.randbelow(10**8))


@dataclass(frozen=True)
class Holder:
    job: str
    pid: int


@pytest.fixture
def holder() -> Iterator[Holder]:
    """A holder of a job id of its own; its environment carries MARK, a session's does not."""
    job = _job()
    env = {**os.environ, MARK: "from-the-holder", "TFDEPLOY_HOLDER": job}
    proc = subprocess.Popen([PYTHON, "-S", str(AGENT), "hold", job], env=env)
    try:
        wait_for(lambda: _forward(b'{"v": 1, "op": "hello"}', job, 0.0).get("ok") is False, 10)
        yield Holder(job, proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _forward(raw: bytes, job: str, wait_s: float) -> dict[str, object]:
    """holder.forward from a process of its own (remote/ imports its modules flat)."""
    script = (
        "import json, sys\nimport holder, params\n"
        "try:\n"
        "    reply = holder.forward(sys.stdin.buffer.read(), sys.argv[1], float(sys.argv[2]))\n"
        "except params.AgentError as exc:\n"
        "    reply = {'raised': str(exc)}\n"
        "print(json.dumps(reply))\n"
    )
    done = subprocess.run(
        [PYTHON, "-c", script, job, str(wait_s)],
        input=raw,
        capture_output=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(REMOTE)},
        check=True,
    )
    reply: dict[str, object] = json.loads(done.stdout)
    return reply


def _start(workdir: Path, command: str, env: dict[str, str]) -> dict[str, object]:
    request = {
        "v": 1,
        "op": "start",
        "workdir": str(workdir),
        "run_id": "r1",
        "grace": 1,
        "tasks": [{"name": "worker:0", "command": command}],
    }
    return raw_call(json.dumps(request).encode(), env=env)


def _output(workdir: Path) -> str:
    log = runs_dir(workdir) / "r1" / "tasks" / "worker-0" / "output.log"
    return wait_for(lambda: log.exists() and "mark=" in log.read_text() and log.read_text())


def test_a_session_of_the_holders_job_has_its_start_run_by_the_holder(
    workdir: Path, holder: Holder
) -> None:
    """The task is the holder's descendant: it has the holder's environment (MARK), not the
    session's, and no TFDEPLOY_HOLDER (nothing it runs hands anything on again)."""
    new_run(workdir)
    reply = _start(
        workdir,
        'echo "mark=$' + MARK + ' held=${TFDEPLOY_HOLDER:-}"; exec sleep 30',
        {"TFDEPLOY_HOLDER": holder.job},
    )
    assert reply["ok"] is True, reply
    assert "mark=from-the-holder held=\n" in _output(workdir)
    # Its supervisor, orphaned when the holder's child that ran the start exited, is the
    # holder's own child (the holder is its reaper): in the process tree linuxproc tracks.
    pids = json.loads((runs_dir(workdir) / "r1" / "tasks" / "worker-0" / "pid.json").read_text())
    stat = Path(f"/proc/{pids['supervisor']}/stat").read_text()
    assert int(stat[stat.rfind(")") + 2 :].split()[1]) == holder.pid


def test_a_session_without_a_holder_runs_its_start_itself(workdir: Path) -> None:
    new_run(workdir)
    reply = _start(workdir, 'echo "mark=$' + MARK + '"', {})
    assert reply["ok"] is True, reply
    assert "mark=\n" in _output(workdir)


def test_the_holder_runs_only_the_ops_that_leave_processes(holder: Holder) -> None:
    reply = _forward(b'{"v": 1, "op": "poll", "workdir": "/nonexistent"}', holder.job, 5.0)
    assert reply["ok"] is False and "runs only start, keep" in str(reply["error"]), reply


def test_no_holder_is_an_error_that_says_where_to_look() -> None:
    reply = _forward(b'{"v": 1, "op": "start"}', _job(), 0.3)
    said = str(reply.get("raised"))
    assert "no holder of Slurm job" in said and "squeue -s" in said, reply


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a listener as another user")
def test_a_socket_another_user_bound_under_the_holders_name_gets_nothing() -> None:
    """Abstract socket names are anyone's: a listener of uid 65534 under root's holder name is
    refused by its peer's uid before the request is sent."""
    job = _job()
    name = f"\0tfdeploy-holder-{os.getuid()}-{job}"
    squatter = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.bind({name!r})\ns.listen(1)\nprint('up', flush=True)\n"
        "c, _ = s.accept()\nsys.stdout.write(repr(c.recv(100)))\n"
    )
    proc = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYTHON, "-c", squatter],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        reply = _forward(b'{"v": 1, "op": "start", "secret": "s3cr3t"}', job, 5.0)
        assert "belongs to uid 65534" in str(reply.get("raised")), reply
        out, _ = proc.communicate(timeout=10)
        assert "s3cr3t" not in out  # it read nothing but the end of the connection
    finally:
        proc.kill()


def test_a_requeued_holder_rejoins_the_run_it_held_and_its_keeper_restarts_the_job(
    workdir: Path, tmp_path: Path
) -> None:
    """Slurm requeued the allocation (SLURM_RESTART_COUNT=1) and every step's processes ended:
    the run's warden and keeper, started through this node's holder, had left their `keep`
    requests in the run's folder. The requeued allocation's holder starts the warden again on
    the port the keeper knows, then the keeper, which restarts the job (TFDEPLOY_ATTEMPT=1)
    and ends it succeeded; the records, which hold the run's secret, leave with the run; and
    the body's mode file says the allocation holds a detached run again."""
    job, secret = _job(), secrets.token_hex(16)
    new_run(workdir)
    attempt_0 = 'echo "attempt=$TFDEPLOY_ATTEMPT"; [ "$TFDEPLOY_ATTEMPT" = 1 ] || exec sleep 60'
    slurm = {"SLURM_JOB_ID": job}  # a holder's child has its step's variables
    reply = _start(workdir, attempt_0, slurm)
    assert reply["ok"] is True, reply
    keep = {"v": 1, "op": "keep", "workdir": str(workdir), "run_id": "r1", "secret": secret}
    warden = {"action": "warden", "address": "127.0.0.1", "idle_seconds": 60}
    port = raw_call(json.dumps(keep | warden).encode(), env=slurm)["port"]
    plan = {
        "hosts": [{"name": "h1", "address": "127.0.0.1", "port": port}],
        "tasks": [{"name": "worker:0", "host": "h1", "awaited": True}],
        "policy": {"on_failure": "restart-job", "max_restarts": 1, "restart_backoff": 0.1},
        "interval": 0.2,
        "loss_after": 10,
    }
    assert raw_call(json.dumps(keep | {"action": "keeper", "plan": plan}).encode(), env=slurm)["ok"]
    run_dir = runs_dir(workdir) / "r1"
    assert {p.name for p in run_dir.glob("rejoin-*.json")} == {
        "rejoin-warden.json",
        "rejoin-keeper.json",
    }
    assert all(p.stat().st_mode & 0o077 == 0 for p in run_dir.glob("rejoin-*.json"))
    # The requeue: Slurm ended the step, keeper, warden and task alike (SIGKILL, as at the end
    # of KillWait).
    keep_dir = run_dir.parent.parent / "keep"
    for record in keep_dir.glob("r1.*.json"):
        os.kill(json.loads(record.read_text())["pid"], 9)
    task_pids = json.loads((run_dir / "tasks" / "worker-0" / "pid.json").read_text())
    os.killpg(task_pids["pgid"], 9)
    os.kill(task_pids["supervisor"], 9)
    lease = tmp_path / f"tfdeploy-slurm-{job}.lease"
    lease.touch()
    requeued = {**os.environ, "SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": "1"}
    holder = subprocess.Popen(
        [PYTHON, "-S", str(AGENT), "hold", job, str(workdir), str(lease)], env=requeued
    )
    try:

        def ended() -> dict[str, object] | None:
            kept = json.loads((run_dir / "keeper.json").read_text())
            return next((e["ended"] for e in kept["events"] if "ended" in e), None)

        outcome = wait_for(ended, 30)
        assert outcome["outcome"] == "succeeded", outcome
        events = json.loads((run_dir / "keeper.json").read_text())["events"]
        assert {"rejoined": job} in [{k: v for k, v in e.items() if k != "t"} for e in events]
        assert any(e.get("cause") == f"Slurm requeued allocation {job}" for e in events), events
        log = (run_dir / "tasks" / "worker-0" / "output.log").read_text()
        assert log.splitlines() == ["attempt=", "attempt=1"], log  # the first start set none
        assert list(run_dir.glob("rejoin-*.json")) == []
        assert Path(f"{lease}.mode").read_text() == "detached\n"
    finally:
        holder.kill()
        holder.wait()
