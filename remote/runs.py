"""Host layout of tfdeploy runs: request params, name validation, paths and atomic files."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

PROTOCOL_VERSION = 1
AGENT_DIR = Path(__file__).resolve().parent

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_TASK_RE = re.compile(r"[A-Za-z0-9._-]+(:[0-9]+)?")
_HASH_RE = re.compile(r"[0-9a-f]{64}")
_MISSING: Any = object()


class AgentError(Exception):
    """A request the agent cannot honour; the message becomes the reply's error sentence."""


def param(
    req: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = _MISSING
) -> Any:
    """One request parameter, type-checked so a bad request gets a sentence, not a traceback."""
    if key not in req or (req[key] is None and default is not _MISSING):
        if default is _MISSING:
            raise AgentError(f"op {req.get('op')!r} needs the parameter {key!r}")
        return default
    value = req[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int subclass; a JSON true must not pass as a port number or a byte count.
    if isinstance(value, bool) and bool not in kinds:
        raise AgentError(f"parameter {key!r} must be {_kind_name(kinds)}, got a boolean")
    if not isinstance(value, kinds):
        raise AgentError(f"parameter {key!r} must be {_kind_name(kinds)}, got {value!r:.60}")
    return value


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "an object"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def check_name(value: Any, what: str) -> str:
    """Run ids and fingerprints become directory names, so only a tame alphabet passes."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value in {".", ".."}:
        raise AgentError(f"{what} {value!r} is not allowed: use letters, digits, '.', '_', '-'")
    return value


def task_dirname(name: Any) -> str:
    """Task "worker:1" lives in tasks/worker-1."""
    if not isinstance(name, str) or not _TASK_RE.fullmatch(name) or name in {".", ".."}:
        raise AgentError(f"task name {name!r} is not allowed: use ROLE or ROLE:INDEX")
    return name.replace(":", "-")


def check_hash(value: Any) -> str:
    if not isinstance(value, str) or not _HASH_RE.fullmatch(value):
        raise AgentError(f"{value!r:.80} is not a sha256 hex digest (64 lowercase hex digits)")
    return value


def check_relpath(value: Any) -> PurePosixPath:
    """A path under code/: never absolute, never climbing out with '..'."""
    path = PurePosixPath(value) if isinstance(value, str) and value and "\0" not in value else None
    if path is None or path.is_absolute() or ".." in path.parts or not path.parts:
        raise AgentError(f"unsafe relative path {value!r}: it must stay inside the run's code/")
    return path


def workdir_path(req: dict[str, Any]) -> Path:
    raw = param(req, "workdir", str)
    if not raw or "\0" in raw:
        raise AgentError(f"workdir {raw!r} is not a usable path")
    return Path(os.path.abspath(os.path.expanduser(raw)))


def run_path(req: dict[str, Any], *, must_exist: bool = True) -> Path:
    """The run directory named by the request's workdir and run_id."""
    workdir = workdir_path(req)
    run_id = check_name(param(req, "run_id", str), "run id")
    path = workdir / "runs" / run_id
    if must_exist and not (path / "run.json").is_file():
        raise AgentError(f"there is no run {run_id!r} in {workdir}: materialize it first")
    return path


def task_cwd(run_dir: Path, cwd: str | None) -> Path:
    """Relative cwds are under code/; absolute ones (or ~) are taken as given."""
    if cwd is None:
        return run_dir / "code"
    if cwd.startswith(("/", "~")):
        return Path(os.path.expanduser(cwd))
    return run_dir / "code" / check_relpath(cwd)


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
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    os.utime(path)


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


def run_stopped(run_dir: Path) -> bool:
    """A whole-run stop happened: nothing of this run may start any more."""
    return (run_dir / "stop").exists()


def make_private_dir(path: Path) -> Path:
    """Creates path and any missing parents as 0700 (mkdir's parents=True would use 0777-umask)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def agent_id(directory: Path = AGENT_DIR) -> str:
    """Content id of the agent's files, computed exactly as the control side names the directory."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.py"), key=lambda p: p.name):
        if path.name != "__init__.py":  # the package marker is not pushed to hosts
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


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
