"""Results going home (`tfdeploy pull`): which files a task's patterns name, and their bytes.

`collect` lists the files (path, size, mode, sha256) under a task's working directory that the
patterns match: globs relative to it, or absolute paths the user named. A pattern that climbs
out with `..`, and a match whose real path (symlinks resolved) leaves its root, is refused and
reported, never read. `fetch` returns a byte range of one listed file, checked the same way.
The control side compares hashes with what it already has, so only missing contents travel.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import layout
import params
import protocol

MAX_FILES = 100000  # per task and pull: a pattern like "/**" must not list a whole disk


def op_collect(req: dict[str, Any]) -> dict[str, Any]:
    run_dir = layout.run_path(req)
    patterns = [p for p in params.param(req, "patterns", list) if isinstance(p, str)]
    names = params.param(req, "tasks", list, None)
    found: dict[str, Any] = {}
    for task_dir in layout.task_dirs(run_dir):
        spec = layout.read_json(task_dir / "spec.json")
        if not isinstance(spec, dict) or (names is not None and spec.get("name") not in names):
            continue
        cwd = layout.task_cwd(run_dir, spec.get("cwd"))
        files, refused = collect(cwd, patterns)
        found[str(spec["name"])] = {"files": files, "refused": refused}
    return {"tasks": found}


def collect(cwd: Path, patterns: list[str]) -> tuple[list[list[Any]], list[str]]:
    """([[path, size, mode, sha256]], [refusals]) for `patterns` under `cwd`."""
    files: dict[str, list[Any]] = {}
    skipped: set[str] = set()
    refused: list[str] = []
    for pattern in patterns:
        try:
            root, matches = _matches(cwd, pattern)
        except params.AgentError as exc:
            refused.append(str(exc))
            continue
        for path in matches:
            if len(files) >= MAX_FILES:
                refused.append(f"{pattern}: more than {MAX_FILES} files; name fewer")
                break
            shown = _shown(cwd, path)
            if shown in files or shown in skipped:
                continue
            if not _inside(path, root):
                skipped.add(shown)
                refused.append(f"{shown}: a symlink out of {root}; not pulled")
                continue
            info = path.stat()
            files[shown] = [shown, info.st_size, info.st_mode & 0o777, _sha256(path)]
    return sorted(files.values()), list(dict.fromkeys(refused))


def _matches(cwd: Path, pattern: str) -> tuple[Path, Iterator[Path]]:
    """The root a pattern must stay in, and the regular files it names (directories: all
    files below them)."""
    if not pattern or "\0" in pattern:
        raise params.AgentError(f"{pattern!r}: not a path")
    if ".." in Path(pattern).parts:
        raise params.AgentError(f"{pattern}: '..' may not climb out of the task's directory")
    absolute = pattern.startswith("/")
    root = _fixed_prefix(pattern) if absolute else cwd
    full = pattern if absolute else str(cwd / pattern)
    hits = sorted(glob.glob(full, recursive=True))

    def walk() -> Iterator[Path]:
        for hit in map(Path, hits):
            if hit.is_dir() and not hit.is_symlink():
                for folder, dirs, names in os.walk(hit):
                    dirs.sort()
                    for name in sorted(names):
                        if (Path(folder) / name).is_file():
                            yield Path(folder) / name
            elif hit.is_file():
                yield hit

    return root, walk()


def _fixed_prefix(pattern: str) -> Path:
    """/data/run*/x -> /data: the part of an absolute pattern before its first wildcard."""
    parts = []
    for part in Path(pattern).parts:
        if any(c in part for c in "*?["):
            break
        parts.append(part)
    prefix = Path(*parts)
    return prefix if prefix.is_dir() else prefix.parent


def _inside(path: Path, root: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def _shown(cwd: Path, path: Path) -> str:
    """Relative to the task's directory, or the absolute path the user named (without its
    leading /): where the file goes below the task's folder on the controller."""
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path).lstrip("/")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def op_fetch(req: dict[str, Any]) -> dict[str, Any]:
    """Bytes [offset, offset+length) of a file `collect` lists for the task and `patterns`.

    The bytes follow the reply line as they are (the reply's "raw" counts them), read and
    written in CHUNK pieces: no base64, and no whole range in memory on either side.
    """
    path = _fetchable(req)
    offset = params.param(req, "offset", int, 0)
    if offset < 0:
        raise params.AgentError(f"offset must be 0 or more, got {offset}")
    size = path.stat().st_size
    length = max(0, min(params.param(req, "length", int, size), size - offset))
    send = functools.partial(_send_range, path=path, offset=offset, length=length)
    return {"size": size, "raw": length, protocol.RAW_BODY: send}


def _fetchable(req: dict[str, Any]) -> Path:
    run_dir = layout.run_path(req)
    name = params.param(req, "task", str)
    shown = params.param(req, "path", str)
    patterns = [p for p in params.param(req, "patterns", list) if isinstance(p, str)]
    spec = layout.read_json(run_dir / "tasks" / params.task_dirname(name) / "spec.json")
    if not isinstance(spec, dict):
        raise params.AgentError(f"run {run_dir.name} has no task {name}")
    cwd = layout.task_cwd(run_dir, spec.get("cwd"))
    if not shown or ".." in Path(shown).parts:
        raise params.AgentError(f"{shown!r}: '..' may not climb out of the task's directory")
    path = cwd / shown
    if not (path.is_file() and _inside(path, cwd)):
        path = Path("/" + shown)  # listed under an absolute pattern's root
        roots = [_fixed_prefix(p) for p in patterns if p.startswith("/")]
        if not (path.is_file() and any(_inside(path, root) for root in roots)):
            raise params.AgentError(f"{shown}: not a file of task {name} that the paths name")
    return path


CHUNK = 1 << 20


def _send_range(out: BinaryIO, path: Path, offset: int, length: int) -> None:
    """Exactly `length` bytes: a file that shrank meanwhile is padded with zeros, which the
    controller's hash check then reports as a file that changed while being pulled."""
    with path.open("rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                chunk = bytes(min(CHUNK, left))
            out.write(chunk)
            left -= len(chunk)
