"""Where a run lives on a host (workdir, host, run and task directories); how files are written."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hostid
import params
import protocol

AGENT_DIR = Path(__file__).resolve().parent


def workdir_path(req: dict[str, Any]) -> Path:
    raw = params.param(req, "workdir", str)
    if not raw or "\0" in raw:
        raise params.AgentError(f"workdir {raw!r} is not a usable path")
    return Path(os.path.abspath(os.path.expanduser(raw)))


def host_dir(workdir: Path) -> Path:
    """WORKDIR/hosts/<identity>: what belongs to this machine's processes, apart from other hosts'.

    A workdir may be shared by several hosts (an NFS home): pids, leases, locks and port
    reservations only mean something on the machine that wrote them.
    """
    return workdir / "hosts" / hostid.identity()


def netcheck_record(req: dict[str, Any], run_id: str) -> Path:
    """Where a run's network-check stand-in listener is recorded (close and release stop it)."""
    return host_dir(workdir_path(req)) / "netcheck" / f"{run_id}.json"


def runs_dir(workdir: Path) -> Path:
    return host_dir(workdir) / "runs"


class StoppedRun(params.AgentError):
    """A run stopped on this host: no reservation, code, setup or task of it any more."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"run {run_id} was stopped on this host (`tfdeploy down`, or its own `up`'s "
            "teardown) before it started; nothing of it starts here",
            protocol.FAIL_RUN_STOPPED,
        )


def run_path(req: dict[str, Any], *, must_exist: bool = True) -> Path:
    """This host's directory of the run named by the request's workdir and run_id."""
    workdir = workdir_path(req)
    run_id = params.check_name(params.param(req, "run_id", str), "run id")
    path = runs_dir(workdir) / run_id
    if must_exist and not (path / "run.json").is_file():
        if run_stopped(path):  # stopped before its code came (`down` during the push)
            raise StoppedRun(run_id)
        raise params.AgentError(
            f"there is no run {run_id!r} of this host in {workdir}: materialize it first",
            protocol.FAIL_NO_RUN,
        )
    return path


def task_cwd(run_dir: Path, cwd: str | None) -> Path:
    """Relative cwds are under code/; absolute ones (or ~) are taken as given."""
    if cwd is None:
        return run_dir / "code"
    if cwd.startswith(("/", "~")):
        return Path(os.path.expanduser(cwd))
    return run_dir / "code" / params.check_relpath(cwd)


def read_json(path: Path) -> Any:
    """None for a missing or unreadable file: half-written runs must not break listings."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: Any, mode: int = 0o600) -> None:
    """Write to a temp file and rename, so readers never see half a file (private by default)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
    except BaseException:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)


def touch(path: Path) -> None:
    """Sets mtime to now by this host's clock, which judges the lease.

    On NFS an utime(None) would take the file server's time, and the clocks may differ.
    """
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    now = time.time()
    os.utime(path, (now, now))


def open_lock(path: Path) -> Any:
    """A lock file, private like everything the agent writes (flock: released on exit)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a")


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Serialises start, setup launches and whole-run stops of one run.

    Without it a stop arriving while a start is still creating task directories would list the
    tasks too early and leave the late ones running (Ctrl-C during the start phase).
    """
    with open_lock(run_dir / ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def lease_held(run_dir: Path, meta: dict[str, Any], now: float) -> bool:
    """Whether the run's lease is held: not detached, not stopped as a whole, and renewed
    (by its `up` or its keeper) within lease_seconds; a run that names no lease is judged as a
    port reservation is (DEFAULT_RESERVATION_S). `runs` reports it, prune spares such a run."""
    if run_stopped(run_dir) or meta.get("detached"):
        return False
    lease = meta.get("lease_seconds")
    if not isinstance(lease, (int, float)) or isinstance(lease, bool):
        lease = protocol.DEFAULT_RESERVATION_S
    try:
        return now - (run_dir / "lease").stat().st_mtime <= float(lease)
    except OSError:
        return False


def drop_lease(run_dir: Path) -> None:
    """The run outlives whoever renewed its lease: a detached `up` returning, or a keeper that
    ended the run (its last poll would otherwise keep the run "leased" for lease_seconds)."""
    with run_lock(run_dir):
        meta = read_json(run_dir / "run.json")
        if not isinstance(meta, dict):
            raise params.AgentError("the run's run.json cannot be read")
        meta.update(detached=True, lease_seconds=None)
        write_json(run_dir / "run.json", meta)


WARNED = "warned"  # a task dir's marker: a scheduler's warning was passed to its group (relay.py)


def run_stopped(run_dir: Path) -> bool:
    """A whole-run stop happened: nothing of this run may start any more."""
    return (run_dir / "stop").exists()


def make_private_dir(path: Path) -> Path:
    """Creates path and any missing parents as 0700 (mkdir's parents=True would use 0777-umask).

    Only what it creates: an existing directory keeps its mode (a workdir of "/tmp" or "~" must
    never make those private to one user).
    """
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue  # another host of a shared workdir made it first
        os.chmod(directory, 0o700)  # mkdir's mode is narrowed by the umask, never widened
    return path


def agent_id() -> str:
    """The id of the files next to this one, computed as the control side names their directory."""
    files = [(p.name, p.read_bytes()) for p in AGENT_DIR.glob("*.py")]
    return protocol.agent_id(files)


def task_dirs(run_dir: Path) -> list[Path]:
    """Task directories in role order, numeric index order within a role."""
    try:
        found = [p for p in (run_dir / "tasks").iterdir() if p.is_dir()]
    except OSError:
        return []

    def key(path: Path) -> tuple[str, int, str]:
        role, _, index = path.name.rpartition("-")
        return (role, int(index), "") if index.isdigit() and role else (path.name, -1, "")

    return sorted(found, key=key)
