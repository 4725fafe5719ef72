"""The setup op: a job's setup commands, run once per host and fingerprint, stoppable mid-way."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, BinaryIO

import interpreters
import layout
import params
import procs
import protocol

TAIL_LINES = 20


def op_setup(req: dict[str, Any]) -> protocol.SetupReply:
    run_dir = layout.run_path(req)
    commands = params.param(req, "commands", list)
    if not all(isinstance(c, str) for c in commands):
        raise params.AgentError("parameter 'commands' must be a list of strings")
    env = params.check_env(params.param(req, "env", dict, {}))
    venv, python = params.param(req, "venv", str, None), params.param(req, "python", str, None)
    fingerprint = params.check_name(params.param(req, "fingerprint", str), "fingerprint")
    # Per host, even on a shared workdir: a marker says what ran on this machine.
    setup_dir = layout.make_private_dir(layout.host_dir(layout.workdir_path(req)) / "setup")
    marker = setup_dir / f"{fingerprint}.ok"
    # Two runs sharing a host and a fingerprint must not run the same setup side by side.
    with layout.open_lock(setup_dir / f"{fingerprint}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return {"ran": False, "code": 0, "tail": []}
        if layout.run_stopped(run_dir):  # `down` before setup: its `up` is told, not a failure
            raise layout.StoppedRun(run_dir.name)
        layout.touch(run_dir / "lease")
        code, tail = _run_setup(run_dir, commands, env, venv, python)
        if code != 0 and layout.run_stopped(run_dir):  # stopped under way (`down`): say so
            raise layout.StoppedRun(run_dir.name)
        if code == 0:
            layout.write_json(marker, {"run_id": run_dir.name, "ended": time.time()})
    return {"ran": True, "code": code, "tail": tail}


def _run_setup(
    run_dir: Path, commands: list[str], env: dict[str, str], venv: str | None, python: str | None
) -> tuple[int, list[str]]:
    log_path = run_dir / "setup.log"
    # Inside the job's venv (built before setup runs), or with the host python first on PATH.
    full_env = interpreters.task_env(venv, python, {**os.environ, **env})
    code = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    with os.fdopen(os.open(log_path, flags, 0o600), "ab") as log:
        start = log.tell()
        for command in commands:
            log.write(f"tfdeploy setup: {command}\n".encode())
            log.flush()
            returncode = _run_one(run_dir, command, full_env, log)
            if returncode != 0:
                code = returncode if returncode > 0 else 128 - returncode  # shell convention
                break
    return code, _tail(log_path, start)


def _run_one(run_dir: Path, command: str, env: dict[str, str], log: BinaryIO) -> int:
    """One setup command in its own process group, recorded so a whole-run stop can end it.

    Ctrl-C during setup must not leave a long `pip install` running on the hosts; the stop op
    reads setup.json under the run lock, and a stopped run starts no further command.
    """
    with layout.run_lock(run_dir):
        if layout.run_stopped(run_dir):
            log.write(b"tfdeploy setup: the run was stopped; not running this command\n")
            return 128 + signal.SIGTERM
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=run_dir / "code",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group (and session), no tty
        )
        record = {"pgid": proc.pid, "start_ticks": procs.start_ticks(proc.pid)}
        layout.write_json(run_dir / "setup.json", record)
    try:
        return proc.wait()
    finally:
        (run_dir / "setup.json").unlink(missing_ok=True)


def _tail(path: Path, start: int) -> list[str]:
    with open(path, "rb") as f:
        # Only the end matters; a pip install can log megabytes.
        f.seek(max(start, f.seek(0, os.SEEK_END) - 64 * 1024))
        text = f.read().decode("utf-8", errors="replace")
    return text.splitlines()[-TAIL_LINES:]
