"""The `profile` op: TensorFlow's profiler traces every TF task of a run on this host at once
(docs/profile.md, PROTOCOL.md `profile`).

Each task that serves a profiler (its TFDEPLOY_PROFILER_PORT, [job] profiler) gets a client
process of its own Python, the one preflight approved and the task runs with (its venv's, the
host's, or its image's inside its container), which asks the task's server over loopback for a
trace of `seconds` and writes it into the task's directory, profile/<stamp>/, where `tfdeploy
profile` pulls it from. Every client waits for one instant, `start_in` after the request
arrived, so the traces of all the tasks, on every host the controller asked at once, cover the
same interval: TensorFlow's own `delay_ms` is not honoured by a server asked over gRPC (2.21:
the trace starts at once), so the wait is the client's. A client imports TensorFlow first
(seconds), which is what `start_in` leaves room for.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import containers
import layout
import params
import procs
import protocol

_CLIENT = r"""
import json, sys, time
port, logdir, seconds, at = sys.argv[1:5]
def said(**fields):
    sys.stdout.write("\n" + json.dumps(fields) + "\n")
    sys.stdout.flush()
def first_line(exc):
    return ((str(exc).strip().splitlines() or [type(exc).__name__])[0])[:300]
try:
    import tensorflow as tf
    trace = tf.profiler.experimental.client.trace
except Exception as exc:
    said(error="TensorFlow's profiler cannot be imported by its Python: " + first_line(exc))
    sys.exit(3)
wait = float(at) - time.time()
if wait > 0:
    time.sleep(wait)
began = time.time()
try:
    trace("grpc://127.0.0.1:" + port, logdir, int(float(seconds) * 1000), num_tracing_attempts=2)
except Exception as exc:
    said(error=first_line(exc), began=began)
    sys.exit(4)
said(began=began)
"""
_TAIL = 4096  # what is read of a client's output: its last line says how it went


def op_profile(req: dict[str, Any]) -> protocol.ProfileReply:
    arrived = time.time()
    run_dir = layout.run_path(req)
    seconds = float(params.param(req, "seconds", (int, float)))
    start_in = float(params.param(req, "start_in", (int, float)))
    if not 0 < seconds <= protocol.MAX_PROFILE_SECONDS:
        raise params.AgentError(f"seconds must be above 0, at most {protocol.MAX_PROFILE_SECONDS}")
    if not 0 <= start_in <= protocol.MAX_PROFILE_START_IN:
        raise params.AgentError(f"start_in must be 0 to {protocol.MAX_PROFILE_START_IN}")
    stamp = params.check_name(params.param(req, "stamp", str), "stamp")
    wanted = params.param(req, "tasks", list, None)
    if wanted is not None and not all(isinstance(n, str) for n in wanted):
        raise params.AgentError("tasks must be task names (role:index)")
    clients: list[_Client] = []
    replies: list[protocol.ProfiledShape] = []
    for task_dir in sorted((run_dir / "tasks").glob("*")):
        spec = layout.read_json(task_dir / "spec.json")
        if not isinstance(spec, dict) or (wanted is not None and spec.get("name") not in wanted):
            continue
        why = _untraceable(task_dir, spec)
        if why is not None:
            replies.append(_not_traced(str(spec.get("name")), why, serves=_port(spec) is not None))
            continue
        clients.append(_Client.start(run_dir, task_dir, spec, stamp, arrived + start_in, seconds))
    deadline = arrived + start_in + seconds + protocol.PROFILE_WRITE_SECONDS
    replies += [client.result(deadline, arrived) for client in clients]
    return {"tasks": sorted(replies, key=lambda r: r["name"])}


def _untraceable(task_dir: Path, spec: dict[str, Any]) -> str | None:
    state = procs.task_state(task_dir)[0]
    if state != protocol.STATE_RUNNING:
        return f"it is not running ({state})"
    port = _port(spec)
    if port is None:
        return (
            "it serves no profiler: not a TensorFlow task, or the job's profiler is off "
            "([job] profiler = true)"
        )
    if not _listening(int(port)):
        return (
            f"nothing listens on its profiler port {port}: it has not imported TensorFlow (yet), "
            'or, with profiler = "task", its code started no server there'
        )
    return None


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _port(spec: dict[str, Any]) -> str | None:
    """The task's profiler port, as its start request set it (None: it serves none)."""
    env = spec.get("env")
    port = str(env.get(protocol.PROFILER_PORT_ENV, "")) if isinstance(env, dict) else ""
    return port if port.isdigit() else None


def _not_traced(name: str, why: str, *, serves: bool = True) -> protocol.ProfiledShape:
    return {
        "name": name,
        "serves": serves,
        "traced": False,
        "why": why,
        "started_after": None,
        "files": 0,
        "folder": None,
    }


class _Client:
    """One task's trace client, running."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log: Path, out: Path):
        self.name, self.process, self.log, self.out = name, process, log, out

    @classmethod
    def start(
        cls,
        run_dir: Path,
        task_dir: Path,
        spec: dict[str, Any],
        stamp: str,
        at: float,
        seconds: float,
    ) -> _Client:
        name = str(spec["name"])
        out = layout.make_private_dir(layout.make_private_dir(task_dir / "profile") / stamp)
        log = task_dir / "profile" / f"{stamp}.client.log"
        port = str(_port(spec))
        args = ["-I", "-c", _CLIENT, port, str(out), repr(seconds), repr(at)]
        with open(str(log), "wb") as sink:
            process = subprocess.Popen(
                [*_python(run_dir, spec), *args],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=_client_env(spec),
                start_new_session=True,  # a client past its deadline goes with its children
            )
        return cls(name, process, log, out)

    def result(self, deadline: float, arrived: float) -> protocol.ProfiledShape:
        try:
            self.process.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            _end(self.process)
            return _not_traced(self.name, "the trace did not end in time (the task busy?)")
        said = _last_json(self.log)
        began = said.get("began")
        files = sum(1 for _ in self.out.rglob("*.xplane.pb"))
        error = said.get("error")
        if error is not None or self.process.returncode != 0 or files == 0:
            why = str(error or f"its client exited {self.process.returncode}, no trace written")
            return _not_traced(self.name, why)
        return {
            "name": self.name,
            "serves": True,
            "traced": True,
            "why": None,
            "started_after": max(0.0, began - arrived) if isinstance(began, float) else None,
            "files": files,
            "folder": str(self.out),
        }


def _python(run_dir: Path, spec: dict[str, Any]) -> list[str]:
    """The task's own Python: in its container, its venv's, or the host's it was started with."""
    box = spec.get("container")
    if isinstance(box, dict):
        name = containers.container_name(run_dir.name, str(spec["name"]))
        return [str(box["runtime"]), "exec", name, "python3"]
    if isinstance(spec.get("venv"), str):
        return [str(Path(spec["venv"]) / "bin" / "python")]
    return [str(spec.get("python") or "python3")]


def _client_env(spec: dict[str, Any]) -> dict[str, str]:
    """The task's environment (its libraries' paths) without its cluster: the client joins no
    cluster and takes no GPU."""
    env = {**os.environ, **{str(k): str(v) for k, v in spec.get("env", {}).items()}}
    env.pop("TF_CONFIG", None)
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _last_json(log: Path) -> dict[str, Any]:
    try:
        with open(str(log), "rb") as f:
            f.seek(max(0, log.stat().st_size - _TAIL))
            tail = f.read(_TAIL).decode("utf-8", "replace")
    except OSError:
        return {}
    for line in reversed(tail.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return {}


def _end(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
