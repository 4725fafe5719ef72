"""A run's warden on one host: the way into this host's agent for the run's keeper.

The keeper (keeper.py, on one host of the run) holds the run's failure policy once the
controller has handed it over, so it must reach every host without an SSH key of its own. Each
host runs one warden per kept run: a detached listener on the host's cluster address (never
the wildcard), that answers only requests proved with the run's keeper secret (keepwire.py),
only about its own run, and only the ops a policy needs:

- `poll`: the run's task states here, and a heartbeat (the run's lease, as the controller's
  polls were): the keeper gone, the hosts stop the run by the lease rule, so it is never orphaned;
  with `gpus`, this host's GPU utilization for the keeper's idle-GPU guard (guards.py);
- `stop`: named tasks of the run (and what escaped them), as a whole-job restart stops them;
- `restart`: named tasks started again exactly as the controller's start recorded them, with
  only TFDEPLOY_ATTEMPT changed (taskops.relaunch): no command the controller did not send;
- `end`: the run is over; its lease is dropped (no heartbeat comes any more) and the warden leaves.

What a compromised host of the run can make the others do is therefore bounded by the run
itself: stop its tasks, start them again as they were, and keep its lease alive (or let it
lapse). It can start no other command, read no file, and reach no other run (docs/security.md).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import daemon
import keepwire
import kept
import layout
import params
import procs
import protocol
import rejoin

# What a keeper may ask (the request's "ask"): a vocabulary of its own, not the agent's ops.
POLL, STOP, RESTART, END = "poll", "stop", "restart", "end"
WARDEN_OPS = (POLL, STOP, RESTART, END)
ACCEPT_WAIT_S = 1.0
GPU_SAMPLE_S = 10.0  # nvidia-smi at most this often for the idle guard, whose window is minutes


def start(req: dict[str, Any]) -> dict[str, Any]:
    """Binds the cluster address (a free port), then serves in a detached process."""
    workdir = layout.workdir_path(req)
    run_dir = layout.run_path(req)
    address = params.param(req, "address", str)
    secret = secret_of(req)
    idle_s = float(params.param(req, "idle_seconds", (int, float), 120.0))
    fixed = params.param(req, "port", int, 0)  # a rejoin (rejoin.py): the port the keeper knows
    if not 0 <= fixed < 65536:
        raise params.AgentError(f"port must be 0 (any) or a port number, got {fixed}")
    record = kept.record_path(workdir, run_dir.name, "warden")
    daemon.stop(record)  # a warden of an earlier hand-over of this run
    family = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    # The keeper's finished polls leave this port in TIME_WAIT for a minute after a warden
    # ends: a rejoining warden binds it again all the same.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, fixed))
        sock.listen(16)
    except OSError as exc:
        sock.close()
        raise params.AgentError(f"cannot listen on {address}: {exc.strerror}") from None
    port = sock.getsockname()[1]
    pid = daemon.spawn(
        record, lambda: _serve(sock, workdir, run_dir, secret, idle_s), b"tfd-warden"
    )
    sock.close()
    rejoin.record(req, run_dir, port)
    return {"port": port, "pid": pid}


def secret_of(req: dict[str, Any]) -> bytes:
    text = params.param(req, "secret", str)
    if len(text) < 32 or any(c not in "0123456789abcdef" for c in text):
        raise params.AgentError("the keeper's secret must be at least 32 lowercase hex digits")
    return bytes.fromhex(text)


def _serve(sock: socket.socket, workdir: Path, run_dir: Path, secret: bytes, idle_s: float) -> None:
    """Answers until `end`, SIGTERM, or `idle_s` without a proved request while no task of the
    run runs here (a keeper that died leaves nothing listening for long). Each connection has a
    thread of its own: a poll (the heartbeat) is answered while a stop of grace seconds runs."""
    daemon.stop_on_sigterm()
    sock.settimeout(ACCEPT_WAIT_S)
    ended = threading.Event()
    last = [time.monotonic()]
    gpus = GpuSampler()

    def answer(conn: socket.socket) -> None:
        with conn:
            done = _answer_one(conn, workdir, run_dir, secret, gpus)
        if done is not None:
            last[0] = time.monotonic()
            if done:
                ended.set()

    try:
        while not ended.is_set():
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                if time.monotonic() - last[0] > idle_s and not _running(run_dir):
                    return
                continue
            threading.Thread(target=answer, args=(conn,), daemon=True).start()
    except daemon.Stopped:
        return
    finally:
        sock.close()


def _answer_one(
    conn: socket.socket, workdir: Path, run_dir: Path, secret: bytes, gpus: GpuSampler
) -> bool | None:
    """One connection: None when it proved nothing; else whether the run is over."""
    conn.settimeout(keepwire.IO_TIMEOUT_S)
    nonce = keepwire.new_nonce()
    try:
        conn.sendall(keepwire.GREETING + nonce + b"\n")
        line = keepwire.read_line(conn)
        request = keepwire.verified(secret, keepwire.ASK, nonce, "request", line)
    except (OSError, keepwire.WireError):
        return None
    try:
        reply: dict[str, Any] = {"ok": True, **_op(request, workdir, run_dir, gpus)}
    except (params.AgentError, layout.StoppedRun, OSError) as exc:
        reply = {"ok": False, "error": str(exc)[:2000]}
    with contextlib.suppress(OSError):
        conn.sendall(keepwire.signed(secret, keepwire.ANSWER, nonce, "reply", reply))
    return isinstance(request, dict) and request.get("ask") == END


def _op(request: Any, workdir: Path, run_dir: Path, gpus: GpuSampler) -> dict[str, Any]:
    if not isinstance(request, dict) or request.get("ask") not in WARDEN_OPS:
        raise params.AgentError(f"a warden answers only {', '.join(WARDEN_OPS)}")
    if request.get("run_id") != run_dir.name:
        raise params.AgentError(f"this warden answers only for run {run_dir.name}")
    op = request["ask"]
    if op == POLL:
        layout.touch(run_dir / "lease")  # the keeper's poll is the run's heartbeat
        found: dict[str, Any] = {
            "tasks": _with_metrics_bytes(run_dir),
            "listening": _listening(request),
        }
        return {**found, "gpus": gpus.read()} if request.get("gpus") is True else found
    if op == END:  # the keeper ended the run: no lease is renewed from now on
        layout.drop_lease(run_dir)
        if request.get("final") is True:  # and no requeue brings it back (rejoin.py)
            rejoin.forget(run_dir)
        return {}
    import taskops  # stops and starts pay for their imports

    names = _names(request, run_dir)
    if op == STOP:
        grace = taskops.grace_param(request)
        req = {"workdir": str(workdir), "run_id": run_dir.name, "grace": grace}
        return dict(taskops.op_stop({**req, "tasks": names, "escaped": True}))
    return {"tasks": taskops.relaunch(run_dir, names, params.param(request, "attempt", int))}


def _names(request: dict[str, Any], run_dir: Path) -> list[str]:
    names: list[str] = params.param(request, "tasks", list)
    known = {d.name for d in layout.task_dirs(run_dir)}
    for name in names:
        if not isinstance(name, str) or params.task_dirname(name) not in known:
            raise params.AgentError(f"run {run_dir.name} has no task {name!r:.60} here")
    return names


def _listening(request: dict[str, Any]) -> list[int]:
    ports = request.get("ports") or []
    found = []
    for port in ports[:256] if isinstance(ports, list) else []:
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    found.append(port)
            except OSError:
                pass
    return found


def _running(run_dir: Path) -> bool:
    return any(procs.task_state(d)[0] == protocol.STATE_RUNNING for d in layout.task_dirs(run_dir))


def _with_metrics_bytes(run_dir: Path) -> list[dict[str, Any]]:
    """The tasks' statuses, each with the size of its metrics file: the keeper's sign that an
    attempt trains again (its first new step record after a restart)."""
    import taskmetrics

    statuses: list[dict[str, Any]] = [dict(s) for s in procs.run_statuses(run_dir)]
    for status in statuses:
        try:
            task_dir = run_dir / "tasks" / params.task_dirname(str(status.get("name")))
            status["metrics_bytes"] = taskmetrics.metrics_path(task_dir).stat().st_size
        except (OSError, params.AgentError):
            status["metrics_bytes"] = 0
    return statuses


class GpuSampler:
    """This host's GPU utilization for the keeper's idle-GPU guard: nvidia-smi runs on a thread
    of its own at most every GPU_SAMPLE_S, and a poll answers the last sample with its age, so
    a poll never waits for it (a hung driver must not make its host look lost). None: no sample
    yet, no nvidia-smi here, or one that failed; the guard counts no idle time on it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sample: tuple[float, list[list[float]]] | None = None
        self.asked = -GPU_SAMPLE_S  # when the last sample began (monotonic)
        self.busy = False

    def read(self) -> dict[str, Any] | None:
        now = time.monotonic()
        with self.lock:
            if not self.busy and now - self.asked >= GPU_SAMPLE_S:
                self.busy, self.asked = True, now
                threading.Thread(target=self._take, daemon=True).start()
            if self.sample is None:
                return None
            at, utilization = self.sample
        return {"age": round(now - at, 3), "utilization": utilization}

    def _take(self) -> None:
        found = None
        try:
            found = _utilization()
        finally:
            with self.lock:
                self.busy = False
                self.sample = None if found is None else (time.monotonic(), found)


def _utilization() -> list[list[float]] | None:
    """[[GPU index, utilization %], ...] as nvidia-smi reports them (gpuinfo.py); None where
    the host has none or it failed."""
    import gpuinfo

    reply = gpuinfo.op_gpus({})
    if reply["nvidia_smi"] is None or reply["error"] is not None:
        return None
    return [[g["index"], g["utilization"]] for g in reply["gpus"] if g["utilization"] is not None]
