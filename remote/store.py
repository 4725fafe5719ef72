"""Content store and run code: the have, materialize and setup ops."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import procs
import runs

TAIL_LINES = 20
_LINK_FALLBACK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES}


def op_have(req: dict[str, Any]) -> dict[str, Any]:
    store = runs.workdir_path(req) / "store"
    hashes = [runs.check_hash(h) for h in runs.param(req, "hashes", list)]
    return {"missing": [h for h in hashes if not (store / h).is_file()]}


def op_materialize(req: dict[str, Any]) -> dict[str, Any]:
    workdir = runs.workdir_path(req)
    run_dir = runs.run_path(req, must_exist=False)
    entries = [_file_entry(item) for item in runs.param(req, "files", list)]
    store = runs.make_private_dir(workdir / "store")
    blobs = runs.param(req, "blobs", list, [])
    if blobs:
        _receive(store, blobs, sys.stdin.buffer)
    missing = [str(rel) for rel, digest, _ in entries if not (store / digest).is_file()]
    if missing:
        count, first = len(missing), missing[0]
        raise runs.AgentError(f"the store lacks the content of {count} file(s), {first!r} first")
    runs.make_private_dir(workdir / "runs")
    runs.make_private_dir(run_dir)
    _write_run_json(req, run_dir)
    runs.touch(run_dir / "lease")
    code = run_dir / "code"
    code.mkdir(mode=0o700, exist_ok=True)
    checked: set[Path] = set()  # directories already known to lie inside code/
    for rel, digest, mode in entries:
        _place(store / digest, code, rel, mode, checked)
    return {"files": len(entries)}


def _receive(store: Path, blobs: list[Any], stream: BinaryIO) -> None:
    """Stores contents sent raw after the request line, each checked against its hash.

    One stream per host instead of one SFTP open/write/close/rename per file: with hundreds of
    small files the round trips, not the bytes, were the cost.
    """
    for item in blobs:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[1], int):
            raise runs.AgentError(f"each of 'blobs' must be [sha256, size], got {item!r:.80}")
        digest, size = runs.check_hash(item[0]), item[1]
        data = stream.read(size)
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise runs.AgentError(f"the content of {digest[:12]} arrived damaged or short")
        tmp = store / f".{digest}.{os.getpid()}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, store / digest)


def _file_entry(item: Any) -> tuple[PurePosixPath, str, int]:
    if not isinstance(item, list) or len(item) != 3 or not isinstance(item[2], int):
        raise runs.AgentError(f"each of 'files' must be [relpath, sha256, mode], got {item!r:.80}")
    return runs.check_relpath(item[0]), runs.check_hash(item[1]), item[2]


def _write_run_json(req: dict[str, Any], run_dir: Path) -> None:
    old = runs.read_json(run_dir / "run.json")
    lease = runs.param(req, "lease_seconds", (int, float), None)
    meta = {
        "run_id": run_dir.name,
        "job": runs.param(req, "job", str),
        # A second materialize (new code, same run) keeps the run's age.
        "created": old.get("created") if isinstance(old, dict) else time.time(),
        "detached": runs.param(req, "detached", bool, False),
        "lease_seconds": lease,
        "controller": req.get("controller"),
    }
    runs.write_json(run_dir / "run.json", meta)


def _place(src: Path, code: Path, rel: PurePosixPath, mode: int, checked: set[Path]) -> None:
    """Hard-link one file into code/; copy when linking is impossible or would change a mode."""
    dest = code.joinpath(*rel.parts)
    if dest.parent not in checked:  # resolve() lstats every component: once per directory
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not dest.parent.resolve().is_relative_to(code.resolve()):
            where = f"unsafe relative path {str(rel)!r}"
            raise runs.AgentError(f"{where}: a symlink leads out of code/")
        checked.add(dest.parent)
    want = (mode & 0o777) | 0o400
    st = os.stat(src)
    if st.st_mode & 0o777 != want and st.st_nlink == 1:
        os.chmod(src, want)  # only the store holds this inode, so nobody else sees the change
    copy = st.st_nlink > 1 and st.st_mode & 0o777 != want  # linking would change another run's
    if not copy:
        try:
            os.link(src, dest)  # a new run's code/ is empty: link in place, atomically
            return
        except FileExistsError:
            pass  # a repeated materialize: replace by rename below
        except OSError as exc:
            if exc.errno not in _LINK_FALLBACK:
                raise
            copy = True
    tmp = dest.with_name(f".{dest.name}.tfdeploy-tmp")
    if copy:
        _copy(src, tmp, want)
    else:
        _link_or_copy(src, tmp, want)
    os.replace(tmp, dest)


def _link_or_copy(src: Path, tmp: Path, mode: int) -> None:
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError as exc:
        if exc.errno not in _LINK_FALLBACK:
            raise
        _copy(src, tmp, mode)


def _copy(src: Path, tmp: Path, mode: int) -> None:
    tmp.unlink(missing_ok=True)
    shutil.copyfile(src, tmp)
    os.chmod(tmp, mode)


def op_setup(req: dict[str, Any]) -> dict[str, Any]:
    run_dir = runs.run_path(req)
    commands = runs.param(req, "commands", list)
    if not all(isinstance(c, str) for c in commands):
        raise runs.AgentError("parameter 'commands' must be a list of strings")
    env = check_env(runs.param(req, "env", dict, {}))
    fingerprint = runs.check_name(runs.param(req, "fingerprint", str), "fingerprint")
    setup_dir = runs.make_private_dir(run_dir.parent.parent / "setup")
    marker = setup_dir / f"{fingerprint}.ok"
    # Two runs sharing a host and a fingerprint must not run the same setup side by side.
    with runs.open_lock(setup_dir / f"{fingerprint}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return {"ran": False, "code": 0, "tail": []}
        runs.touch(run_dir / "lease")
        code, tail = _run_setup(run_dir, commands, env)
        if code == 0:
            runs.write_json(marker, {"run_id": run_dir.name, "ended": time.time()})
    return {"ran": True, "code": code, "tail": tail}


def _run_setup(run_dir: Path, commands: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    log_path = run_dir / "setup.log"
    full_env = {**os.environ, **env}
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
    with runs.run_lock(run_dir):
        if runs.run_stopped(run_dir):
            log.write(b"tfdeploy setup: the run was stopped; not running this command\n")
            return 128 + signal.SIGTERM
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=run_dir / "code",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            process_group=0,
        )
        record = {"pgid": proc.pid, "start_ticks": procs.start_ticks(proc.pid)}
        runs.write_json(run_dir / "setup.json", record)
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


def check_env(env: dict[str, Any]) -> dict[str, str]:
    """Env values reach execve as-is, so only string keys/values without NUL or '=' in keys."""
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or not isinstance(value, str) or "\0" in value:
            raise runs.AgentError(f"environment variable {key!r} needs a name and a string value")
    return env
