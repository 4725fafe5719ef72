"""The host agent driven exactly as the control side drives it: JSON on stdin, real processes.

Its calls and waits (tests/unit/test_agent.py's, shared with the bounds, shared-workdir and
spot/idle tests), and a task that leaves its process group (ESCAPE). The `workdir` and `run_id`
fixtures are in tests/conftest.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote.protocol import HOST_ID_ENV

# The interpreter running the tests: the agent is stdlib-only, so any checkout's venv (or none)
# drives it, as any user; a hard-coded /opt/tfdeploy venv failed the fast tier without one.
PYTHON = sys.executable


AGENT = Path(__file__).resolve().parents[2] / "remote" / "agent.py"


def call(workdir: Path, op: str, *, host: str | None = None, **params: Any) -> dict[str, Any]:
    """One agent call; a crash (non-zero exit, traceback) fails the test outright.

    `host` replaces the agent's host identity (TFDEPLOY_HOST_ID), as if the call were made on
    another machine sharing the workdir.
    """
    request = {"v": 1, "op": op, "workdir": str(workdir), **params}
    return raw_call(json.dumps(request).encode(), host=host)


def raw_call(
    payload: bytes,
    *,
    host: str | None = None,
    python: str = PYTHON,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`env`: variables the agent process runs with besides this one's (e.g. SLURM_JOB_ID, as
    an agent started as a job step has)."""
    env = {**os.environ, **(env or {}), **({HOST_ID_ENV: host} if host else {})}
    proc = subprocess.run(
        [python, str(AGENT)], input=payload, capture_output=True, timeout=30, env=env
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b"", proc.stderr.decode()
    line, _, rest = proc.stdout.partition(b"\n")
    reply: dict[str, Any] = json.loads(line)
    assert reply["v"] == 1
    assert len(rest) == reply.get("raw", 0), "the raw bytes after the reply are not as many as said"
    if "raw" in reply:
        reply["_raw"] = rest  # what poll and fetch send after the reply line
    return reply


def ok(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply["ok"] is True, reply
    return reply


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s")


def ticks(pid: int) -> int | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(data[data.rfind(b")") + 2 :].split()[19])


def alive(pid: int) -> bool:
    """Exists and is not a zombie (orphaned zombies can linger until init reaps them)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def host_dir(workdir: Path) -> Path:
    """WORKDIR/hosts/<identity> of this machine: the only host that used the workdir."""
    [found] = (workdir / "hosts").iterdir()
    return found


def runs_dir(workdir: Path) -> Path:
    return host_dir(workdir) / "runs"


def put_in_store(workdir: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    store = workdir / "store"
    store.mkdir(parents=True, exist_ok=True)
    (store / digest).write_bytes(data)
    os.chmod(store / digest, 0o600)
    return digest


def new_run(workdir: Path, run_id: str = "r1", **fields: Any) -> Path:
    fields = {"job": "demo", "detached": False, "lease_seconds": None, "files": [], **fields}
    ok(call(workdir, "materialize", run_id=run_id, controller="test", **fields))
    return runs_dir(workdir) / run_id


def start(workdir: Path, *tasks: dict[str, Any], run_id: str = "r1", grace: float = 1) -> Any:
    return ok(call(workdir, "start", run_id=run_id, tasks=list(tasks), grace=grace))["tasks"]


def status(workdir: Path, name: str, run_id: str = "r1") -> dict[str, Any]:
    reply = ok(call(workdir, "poll", run_id=run_id, offsets={}, max_bytes=0))
    return next(t for t in reply["tasks"] if t["name"] == name)


def wait_state(workdir: Path, name: str, state: str, timeout: float = 5.0) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        task = status(workdir, name)
        return task if task["state"] == state else None

    return wait_for(reached, timeout, step=0.1)  # type: ignore[no-any-return]


# The shell forks a child, which setsid(1) takes out of the task's process group and session.
ESCAPE = "setsid sleep 600 & echo $! > escaped.pid; sleep 600"


def escaped_pid(run_dir: Path, pgid: int) -> int:
    pid_file = run_dir / "code/escaped.pid"
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip()))
    wait_for(lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "sleep")
    assert os.getpgid(pid) != pgid and os.getsid(pid) == pid  # it really left the group
    return pid
