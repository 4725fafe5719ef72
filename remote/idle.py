"""The idle watchdog: runs a command (by default a shutdown) once a host ran nothing for a while.

A GPU instance left up after its job ends costs by the hour, and the end often comes when nobody
watches: a detached run, a controller that crashed or lost its link. So the watchdog is a
detached process of its own on the host, armed by the `idle` op and independent of any
controller or SSH session.

One watchdog per host per workdir: its files live in WORKDIR/hosts/<host-id>/ (a workdir may be
an NFS home shared by several hosts, each with its own processes to judge):
    idle.json        the settings {"minutes", "interval", "command", "armed_at"}; re-read every
                     interval, so re-arming takes effect (and restarts the idle clock) at once
    idle.pid         {"pid", "ticks", "started"} of the live watchdog
    idle.log         what it did, one timestamped line each, and the command's output
    idle-fired.json  {"at", "command", "code"} once it fired (code null while the command runs)
    idle.lock        flock: arming, disarming and the watchdog's own exit, one at a time
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import daemon
import layout
import params
import procs
import protocol

SETTINGS, PID, LOG, LOCK = "idle.json", "idle.pid", "idle.log", "idle.lock"
FIRED = "idle-fired.json"
DEFAULT_INTERVAL = 30.0
MIN_SLEEP = 0.05
AGENT = layout.AGENT_DIR / "agent.py"


def op_idle(req: dict[str, Any]) -> protocol.IdleReply:
    """Arms (or re-arms, or with minutes 0 disarms) this host's watchdog for the workdir."""
    workdir = layout.workdir_path(req)
    minutes = _finite(params.param(req, "minutes", (int, float)), "minutes")
    interval = _finite(params.param(req, "interval", (int, float), DEFAULT_INTERVAL), "interval")
    if minutes < 0:
        raise params.AgentError(f"minutes must be 0 (disarm) or more, got {minutes:g}")
    command = params.param(req, "command", str, None)
    if command is not None and (not command.strip() or "\0" in command):
        raise params.AgentError("the idle command must be a non-empty shell command")
    host = layout.host_dir(workdir)
    if minutes == 0:
        disarm(host)
        return {"armed": False, "pid": None, "minutes": 0.0}
    if interval <= 0:
        raise params.AgentError(f"interval must be more than 0 seconds, got {interval:g}")
    settings = {"minutes": minutes, "interval": interval, "command": command}
    layout.make_private_dir(host)
    with _locked(host):
        layout.write_json(host / SETTINGS, {**settings, "armed_at": time.time()})
        pid = live_pid(host)
        if pid is None:
            pid = _start(host)
    return {"armed": True, "pid": pid, "minutes": minutes}


def _finite(value: float, key: str) -> float:
    """JSON as Python reads it allows NaN and Infinity; neither is a duration."""
    if not math.isfinite(value):
        raise params.AgentError(f"{key} must be a finite number, got {value}")
    return float(value)


def disarm(host: Path) -> None:
    """Removes the settings; the watchdog sees that at its next look and exits."""
    if not host.is_dir():
        return  # never armed here: nothing to create, nothing to stop
    with _locked(host):
        (host / SETTINGS).unlink(missing_ok=True)


def live_pid(host: Path) -> int | None:
    """The pid of this host's watchdog if it still runs (same pid and start ticks)."""
    found = layout.read_json(host / PID)
    if isinstance(found, dict) and procs.process_alive(found.get("pid"), found.get("ticks")):
        return int(found["pid"])
    return None


@contextlib.contextmanager
def _locked(host: Path) -> Iterator[None]:
    with layout.open_lock(host / LOCK) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ---- starting it ------------------------------------------------------------------------------


def _start(host: Path) -> int:
    """Starts the watchdog detached and records it (the caller holds the lock)."""
    argv = [sys.executable, "-S", str(AGENT), "idle-watch", str(host)]
    pid = daemon.detach(lambda: _exec(argv, host / LOG))
    record = {"pid": pid, "ticks": daemon.ticks_of(pid), "started": time.time()}
    layout.write_json(host / PID, record)
    return pid


def _exec(argv: list[str], log: Path) -> None:
    """In the detached process: output to the log, no directory kept busy, then the watchdog
    (the agent's files are non-inheritable: all closed by the exec)."""
    try:
        _redirect_stdio(log)
        os.chdir("/")
        os.execv(argv[0], argv)
    except OSError as exc:
        os.write(2, f"tfdeploy idle: cannot start the watchdog: {exc}\n".encode())
        os._exit(127)


def _redirect_stdio(log: Path) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    out = _append(log)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)


# ---- the watchdog -----------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """`agent.py idle-watch HOST_DIR`, started detached by the idle op."""
    if len(argv) != 1:
        print("usage: agent.py idle-watch HOST_DIR", file=sys.stderr)
        return 2
    watch(Path(argv[0]))
    return 0


def watch(host: Path) -> None:
    """Every interval: read the settings, note whether anything runs, fire once idle too long.

    idle_for counts from the later of the last moment something ran and the (re-)arming, so a
    host armed after a long quiet spell still gets its full allowance.
    """
    last_active = 0.0
    while True:
        settings = read_settings(host)
        if settings is None:
            if _retire(host):
                return
            continue  # re-armed while we were about to leave
        now = time.time()
        if active(host / "runs"):
            last_active = now
        idle_for = now - max(last_active, settings["armed_at"])
        if idle_for >= settings["minutes"] * 60:
            fire(host, settings, idle_for)
            return
        time.sleep(max(settings["interval"], MIN_SLEEP))


def read_settings(host: Path) -> dict[str, Any] | None:
    """idle.json if it arms the watchdog; None when disarmed, gone (workdir and all) or unusable."""
    found = layout.read_json(host / SETTINGS)
    if not isinstance(found, dict):
        return None
    numbers = [found.get(k) for k in ("minutes", "interval", "armed_at")]
    if not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
        return None
    if found["minutes"] <= 0 or not isinstance(found.get("command"), (str, type(None))):
        return None
    return found


def _retire(host: Path) -> bool:
    """Leaves unless idle.json came back: checked under the lock, so an arm that found this
    watchdog alive never ends up with none."""
    try:
        with _locked(host):
            if (host / SETTINGS).exists():
                return False
            _drop_pid(host)
    except OSError:
        pass  # the workdir is gone, and with it everything to keep
    return True


def _drop_pid(host: Path) -> None:
    found = layout.read_json(host / PID)
    if isinstance(found, dict) and found.get("pid") == os.getpid():
        (host / PID).unlink(missing_ok=True)


def active(runs: Path) -> bool:
    """Something of a run is under way on this host: a task still running (as `poll` would
    report it), or a setup command (a long pip install must not look idle). Agent calls
    themselves do not count: a controller that only polls is not work."""
    try:
        run_dirs = [p for p in runs.iterdir() if p.is_dir()]
    except OSError:
        return False
    return any(_run_active(run_dir) for run_dir in run_dirs)


def _run_active(run_dir: Path) -> bool:
    setup = layout.read_json(run_dir / "setup.json")
    if isinstance(setup, dict) and procs.group_alive(setup.get("pgid"), setup.get("start_ticks")):
        return True
    return any(procs.task_state(t)[0] == protocol.STATE_RUNNING for t in layout.task_dirs(run_dir))


def default_command() -> str:
    """Power off; a non-root user needs passwordless sudo for it (-n: never wait for a prompt)."""
    return "shutdown -h now" if os.geteuid() == 0 else "sudo -n shutdown -h now"


def fire(host: Path, settings: dict[str, Any], idle_for: float) -> None:
    """Runs the command once and leaves. idle.pid goes first, so an arm that comes while the
    command runs starts a new watchdog rather than trusting this leaving one."""
    with contextlib.suppress(OSError), _locked(host):
        _drop_pid(host)
    command = settings.get("command") or default_command()
    note(
        host,
        f"idle for {idle_for / 60:.1f} minutes (limit {settings['minutes']:g}), "
        f"no active run: running {command}",
    )
    # Written before the command too: a shutdown may not leave time to write it after.
    fired = {"at": time.time(), "command": command, "code": None}
    layout.write_json(host / FIRED, fired)
    fired["code"] = _run(command, host / LOG)
    layout.write_json(host / FIRED, fired)
    note(host, f"the command ended with status {fired['code']}")


def _run(command: str, log: Path) -> int:
    """`/bin/sh -c command`, output to idle.log; the status as a shell reports it (128+N)."""
    with os.fdopen(_append(log), "ab") as out:
        returncode = subprocess.call(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd="/",
        )
    return returncode if returncode >= 0 else 128 - returncode


def note(host: Path, line: str) -> None:
    """One timestamped line (UTC) in idle.log."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with os.fdopen(_append(host / LOG), "a", encoding="utf-8") as log:
        log.write(f"{stamp} tfdeploy idle: {line}\n")


def _append(path: Path) -> int:
    """A private log, appended to (it may hold the output of the user's command)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
