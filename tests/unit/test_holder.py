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
