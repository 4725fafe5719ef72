"""Short-lived detached servers (netcheck's stand-in listeners, the push's store server).

An op binds its sockets itself, so a bind error is its answer; the serving then goes to a
process that is nobody's child and holds no pipe of the SSH session, so the op returns at once.
Each server has a deadline of its own: a controller that dies mid-push leaves no port open
for long. Its record (pid and start ticks) lets a later op stop exactly that process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import layout
import params
import procs


def spawn(record: Path, serve: Callable[[], object], name: bytes = b"") -> int:
    """Runs `serve` in a detached grandchild, records it, returns its pid. `name` is what
    ps -e and top show for it (its command line stays the agent's)."""

    def body() -> None:
        quiet_stdio()
        if name:
            with contextlib.suppress(OSError):
                Path("/proc/self/comm").write_bytes(name)
        serve()

    pid = detach(body)
    try:
        layout.make_private_dir(record.parent)
        layout.write_json(record, {"pid": pid, "ticks": ticks_of(pid)})
    except OSError:  # a full disk: unrecorded, no stop could ever find it
        os.kill(pid, signal.SIGKILL)
        raise
    return pid


def detach(body: Callable[[], None]) -> int:
    """Forks twice and runs `body` in the grandchild, which then exits: nobody's child, in the
    session the first fork made and left (no run's stop signals it; never a session leader, so
    it can never get a terminal), holding no pipe of the SSH channel. Returns its pid."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked processes
        try:
            os.close(read_end)
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                os.write(write_end, str(grandchild).encode())
                os._exit(0)
            os.close(write_end)
            body()
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        pid = int(pipe.read() or b"0")
    os.waitpid(child, 0)
    if pid <= 0:
        raise params.AgentError("the detached process could not be started")
    return pid


class Stopped(Exception):
    """SIGTERM to a detached server (`stop`), raised where it was: a blocking accept or select
    ends at once instead of at its next timeout, and the unwinding closes what it holds."""


def stop_on_sigterm() -> None:
    """From here on SIGTERM raises `Stopped` in this process's main thread."""

    def raise_stopped(signum: int, frame: Any) -> None:
        raise Stopped

    signal.signal(signal.SIGTERM, raise_stopped)


def stop(record: Path) -> bool:
    """Stops the recorded server (SIGTERM, then SIGKILL) and waits until it is gone."""
    found = layout.read_json(record)
    if not isinstance(found, dict):
        return False
    pid, ticks = found.get("pid"), found.get("ticks")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not isinstance(pid, int) or not procs.process_alive(pid, ticks):
            break  # gone, or no pid recorded (process_alive says False for both)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        end = time.monotonic() + 2.0
        while procs.process_alive(pid, ticks) and time.monotonic() < end:
            time.sleep(0.01)
    with contextlib.suppress(FileNotFoundError):
        record.unlink()
    return True


def stop_stand_ins(req: dict[str, Any], run_id: str) -> None:
    """Stops the run's network-check stand-ins on this host, if a check left them: the request
    that ends the check (release, the push's materialize, a stop) does it, not a round of its
    own."""
    record = layout.netcheck_record(req, run_id)
    if record.exists():
        stop(record)


def ticks_of(pid: int) -> int | None:
    for _ in range(50):  # the grandchild exists once spawn returns; /proc may lag a moment
        ticks = procs.start_ticks(pid)
        if ticks is not None:
            return ticks
        time.sleep(0.01)
    return None


def quiet_stdio(stderr_fd: int | None = None) -> None:
    """stdin and stdout to /dev/null, stderr to `stderr_fd` (/dev/null too when None): a
    detached process must hold none of the SSH channel's pipes (sshd would wait for them)."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(null if stderr_fd is None else stderr_fd, 2)
    os.close(null)
