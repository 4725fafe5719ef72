"""Results going home (`tfdeploy pull`): which files a task's patterns name, and their bytes.

`collect` lists the files (path, size, mode, sha256) under a task's working directory that the
patterns match: globs relative to it, or absolute paths the user named. Each match is named
unambiguously: relative to the task's directory, or, for an absolute pattern, by its absolute
path (with its leading `/`), so `fetch` reads exactly the file `collect` listed even when the
task's directory holds `etc/hostname` and the user named `/etc/hostname`.

The walk is lazy and bounded: a path the user spelt out is followed (symlinks included), but a
symlink to a directory that a wildcard or a directory walk comes upon is reported and never
entered, so a symlink loop (`loop/a -> .`) costs one entry, not a walk without end. A pattern
that names more than MAX_FILES files, or makes the walk look at more than MAX_ENTRIES entries,
is refused as soon as it does, and nothing of it is hashed; `/` (or a wildcard right below it)
is refused before any walk. A pattern that climbs out with `..`, and a match whose real path
(symlinks resolved) leaves its root, is refused and reported, never read. Walking and hashing
stop when the controller goes away (caller.py).
The control side compares hashes with what it already has, so only missing contents travel.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator

import caller
import hashing
import layout
import params
import protocol

if TYPE_CHECKING:

    class _Fetched(protocol.FetchReply, protocol.RawBody):
        """A fetch's reply, and what sends the bytes it counts."""


MAX_FILES = 100000  # per task and pull: a pattern like "/data/**" must not list a whole disk
MAX_ENTRIES = 1000000  # directory entries one task's patterns may look through
MAX_REFUSED = 100  # refusals listed per task; the rest are counted
_MAGIC = frozenset("*?[")


def op_collect(req: dict[str, Any]) -> protocol.CollectReply:
    run_dir = layout.run_path(req)
    patterns = [p for p in params.param(req, "patterns", list) if isinstance(p, str)]
    names = params.param(req, "tasks", list, None)
    hashed = params.param(req, "hash", bool, True)
    only = params.param(req, "hash_only", dict, None)
    found: dict[str, Any] = {}
    for task_dir in layout.task_dirs(run_dir):
        spec = layout.read_json(task_dir / "spec.json")
        if not isinstance(spec, dict) or (names is not None and spec.get("name") not in names):
            continue
        name = str(spec["name"])
        cwd = layout.task_cwd(run_dir, spec.get("cwd"))
        which = _paths(only, name) if only is not None else None
        files, refused, unread = collect(cwd, patterns, hashed, which)
        found[name] = {"files": files, "refused": refused, "unread": unread}
    return {"tasks": found}


def _paths(only: dict[str, Any], task: str) -> frozenset[str]:
    paths = only.get(task, [])
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise params.AgentError(f"hash_only's {task!r} must be a list of paths as listed")
    return frozenset(paths)


def collect(
    cwd: Path,
    patterns: list[str],
    hashed: bool = True,
    only: frozenset[str] | None = None,
) -> tuple[list[list[Any]], list[str], int]:
    """([[path, size, mode, sha256]], [refusals], unread) for `patterns` under `cwd`: every pattern
    walked (within the limits) before anything is hashed. Unhashed (sha256 null) when the
    controller has nothing to compare with: `fetch` hashes as it sends instead, so a first pull
    reads each file once, not twice (for a checkpoint no longer in the page cache, the time of
    a whole extra pass over the disk). With `only`, just those paths (as listed) are hashed:
    replicas' copies, whose contents the controller compares with what another host sent.
    `unread` counts the files and folders that are there but could not be read (a path past
    PATH_MAX, no permission): each is in the refusals too, and the pull is incomplete (exit 4),
    where a refused pattern or link is the user's to change."""
    walk = _Walk(cwd)
    listed: dict[str, Path] = {}
    refused: list[str] = []
    for pattern in patterns:
        try:
            for shown, path in walk.pattern(pattern, len(listed)):
                listed.setdefault(shown, path)
        except params.CallerGone:
            raise
        except params.AgentError as exc:
            refused.append(str(exc))
    files = []
    for shown, path in sorted(listed.items()):
        try:
            info = path.stat()
            digest = _sha256(path) if hashed and (only is None or shown in only) else None
            files.append([shown, info.st_size, info.st_mode & 0o777, digest])
        except OSError as exc:  # gone or unreadable since the walk: the others still come
            refused.append(f"{shown}: could not be read ({exc.strerror or exc}); not pulled")
            walk.unread += 1
    refused = list(dict.fromkeys(refused + walk.notes))
    if len(refused) > MAX_REFUSED:
        more = len(refused) - MAX_REFUSED
        refused = [*refused[:MAX_REFUSED], f"... and {more} more not pulled"]
    return files, refused, walk.unread


class _Walk:
    """One task's patterns expanded lazily, within the limits (see the module's docstring)."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.entries = 0  # looked at, over all patterns of the task
        self.notes: list[str] = []  # matches not pulled, and why
        self.unread = 0  # of those, files and folders there that could not be read
        self._pattern = ""
        self._real_dirs: dict[str, str] = {}  # folder -> its real path (one realpath each)

    def pattern(self, pattern: str, listed: int) -> list[tuple[str, Path]]:
        """(name to list, path) of every file `pattern` names; AgentError refuses it whole."""
        if not pattern or "\0" in pattern:
            raise params.AgentError(f"{pattern!r}: not a path")
        parts = PurePosixPath(pattern).parts
        if ".." in parts:
            raise params.AgentError(f"{pattern}: '..' may not climb out of the task's directory")
        absolute = pattern.startswith("/")
        if absolute and _whole_disk(pattern):
            raise params.AgentError(
                f"{pattern}: names the host's whole file system; name a folder below / "
                "(e.g. /data/**)"
            )
        self._pattern = pattern
        root = _fixed_prefix(pattern) if absolute else self.cwd
        start, steps = (Path("/"), parts[1:]) if absolute else (self.cwd, parts)
        top = os.path.realpath(root)
        hits = []
        for path in self._expand(start, list(steps), named=True):
            shown = str(path) if absolute else str(path.relative_to(self.cwd))
            if not _below(self._real(path), top):
                self.notes.append(f"{shown}: a symlink out of {root}; not pulled")
                continue
            hits.append((shown, path))
            if listed + len(hits) > MAX_FILES:
                raise params.AgentError(
                    f"{pattern}: names more than {MAX_FILES} files; nothing of it was pulled: "
                    "name fewer"
                )
        return hits

    def _expand(self, base: Path, steps: list[str], named: bool) -> Iterator[Path]:
        """Files below `base` that `steps` (the pattern's remaining components) name; `named`:
        `base` was spelt out (or is the start), so a symlink there may be followed."""
        if not steps:
            yield from self._hit(base, named)
            return
        head, rest = steps[0], steps[1:]
        if head == "**":
            if not rest:  # everything below: the walk of base
                yield from self._hit(base, named)
                return
            yield from self._expand(base, rest, named)  # ** as no folder at all
            for entry in self._children(base, hidden=False):
                if self._real_dir(entry):
                    yield from self._expand(Path(entry.path), steps, False)
        elif not _MAGIC & set(head):
            path = base / head
            if rest and path.is_dir():
                yield from self._expand(path, rest, True)
            elif not rest and os.path.lexists(path):
                yield from self._hit(path, True)
        else:
            for entry in self._children(base, hidden=head.startswith(".")):
                if not fnmatch.fnmatchcase(entry.name, head):
                    continue
                if not rest:
                    yield from self._hit(Path(entry.path), False)
                elif self._real_dir(entry):
                    yield from self._expand(Path(entry.path), rest, False)

    def _hit(self, path: Path, named: bool) -> Iterator[Path]:
        """A match: a file, or a folder whose files all count."""
        if path.is_dir():
            if named or not path.is_symlink():
                yield from self._walk(path)
            else:
                self._not_followed(path)
        elif path.is_file():
            yield path

    def _walk(self, top: Path) -> Iterator[Path]:
        """Every file below `top`, depth first in name order, never through a symlinked folder."""
        stack = [top]
        while stack:
            folder = stack.pop()
            below = []
            for entry in self._children(folder, hidden=True):
                if entry.is_dir(follow_symlinks=False):
                    below.append(Path(entry.path))
                elif entry.is_file():  # a symlink to a file too: its real path is checked
                    yield Path(entry.path)
                elif entry.is_symlink() and entry.is_dir():
                    self._not_followed(Path(entry.path))
            stack.extend(reversed(below))

    def _children(self, folder: Path, hidden: bool) -> list[os.DirEntry[str]]:
        """A folder's entries by name (none if unreadable), counted against MAX_ENTRIES."""
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            return []  # gone since it was seen: nothing there to pull
        except OSError as exc:  # past PATH_MAX, no permission: what it holds is not pulled
            shown = (
                str(folder) if self._pattern.startswith("/") else os.path.relpath(folder, self.cwd)
            )
            why = exc.strerror or str(exc)
            self.notes.append(f"{shown}/: could not be listed ({why}); nothing in it was pulled")
            self.unread += 1
            return []
        self.entries += len(entries)
        if self.entries > MAX_ENTRIES:
            raise params.AgentError(
                f"{self._pattern}: looked through more than {MAX_ENTRIES} files and folders; "
                "nothing of it was pulled: name a narrower path"
            )
        caller.check()
        return entries if hidden else [e for e in entries if not e.name.startswith(".")]

    def _real_dir(self, entry: os.DirEntry[str]) -> bool:
        """A folder a wildcard may enter: a real one, not a symlink to one (reported)."""
        if entry.is_dir(follow_symlinks=False):
            return True
        if entry.is_symlink() and entry.is_dir():
            self._not_followed(Path(entry.path))
        return False

    def _real(self, path: Path) -> str:
        """os.path.realpath(path), with each folder's resolved once: a walk of 100,000 files
        would otherwise resolve every component of every path."""
        if os.path.islink(path):
            return os.path.realpath(path)
        folder = str(path.parent)
        real = self._real_dirs.get(folder)
        if real is None:
            real = self._real_dirs[folder] = os.path.realpath(folder)
        return os.path.join(real, path.name)

    def _not_followed(self, path: Path) -> None:
        shown = str(path) if self._pattern.startswith("/") else str(path.relative_to(self.cwd))
        self.notes.append(
            f"{shown}: a symlink to a folder, not followed (name a path through it to pull it)"
        )


def _whole_disk(pattern: str) -> bool:
    """/, /*, /**, /x*: an absolute pattern whose walk would start at the root itself."""
    parts = PurePosixPath(pattern).parts
    return len(parts) == 1 or bool(_MAGIC & set(parts[1]))


def _fixed_prefix(pattern: str) -> Path:
    """/data/run*/x -> /data: the part of an absolute pattern before its first wildcard."""
    parts = []
    for part in Path(pattern).parts:
        if _MAGIC & set(part):
            break
        parts.append(part)
    prefix = Path(*parts)
    return prefix if prefix.is_dir() else prefix.parent


def _inside(path: Path, root: Path) -> bool:
    return _below(os.path.realpath(path), os.path.realpath(root))


def _below(real: str, top: str) -> bool:
    return real == top or real.startswith(top.rstrip("/") + "/")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            caller.check()  # gigabytes take seconds: stop when nobody waits for them
    return digest.hexdigest()


def op_fetch(req: dict[str, Any]) -> _Fetched:
    """Bytes [offset, offset+length) of a file `collect` lists for the task and `patterns`.

    The bytes follow the reply line as they are (the reply's "raw" counts them), read and
    written in CHUNK pieces: no base64, and no whole range in memory on either side. With
    `hash`, protocol.FETCH_TRAILER follows them, counted in "raw" (see send_range).
    """
    path = _fetchable(req)
    offset = params.param(req, "offset", int, 0)
    if offset < 0:
        raise params.AgentError(f"offset must be 0 or more, got {offset}")
    size = path.stat().st_size
    length = max(0, min(params.param(req, "length", int, size), size - offset))
    if params.param(req, "hash", bool, False):
        send = functools.partial(_send_hashed, path=path, offset=offset, length=length)
        return {"size": size, "raw": length + protocol.FETCH_TRAILER, protocol.RAW_BODY: send}
    send = functools.partial(send_range, path=path, offset=offset, length=length)
    return {"size": size, "raw": length, protocol.RAW_BODY: send}


def _fetchable(req: dict[str, Any]) -> Path:
    """The file `collect` listed under this name: relative to the task's directory, or an
    absolute path inside the root of one of the absolute patterns; never one for the other."""
    run_dir = layout.run_path(req)
    name = params.param(req, "task", str)
    shown = params.param(req, "path", str)
    patterns = [p for p in params.param(req, "patterns", list) if isinstance(p, str)]
    spec = layout.read_json(run_dir / "tasks" / params.task_dirname(name) / "spec.json")
    if not isinstance(spec, dict):
        raise params.AgentError(f"run {run_dir.name} has no task {name}")
    cwd = layout.task_cwd(run_dir, spec.get("cwd"))
    if not shown or "\0" in shown or ".." in Path(shown).parts:
        raise params.AgentError(f"{shown!r}: '..' may not climb out of the task's directory")
    if shown.startswith("/"):
        path = Path(shown)
        roots = [_fixed_prefix(p) for p in patterns if p.startswith("/") and not _whole_disk(p)]
    else:
        path, roots = cwd / shown, [cwd]
    if not (path.is_file() and any(_inside(path, root) for root in roots)):
        raise params.AgentError(f"{shown}: not a file of task {name} that the paths name")
    return path


CHUNK = 1 << 20


def send_range(out: BinaryIO, path: Path, offset: int, length: int, digest: Any = None) -> None:
    """Exactly `length` bytes: a file that shrank meanwhile is padded with zeros, which the
    controller's hash check then reports as a file that changed while being pulled. `digest`
    gets every piece sent."""
    with path.open("rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                chunk = bytes(min(CHUNK, left))
            if digest is not None:
                digest.update(chunk)  # first: on hashing.Sha256's thread while it is written
            out.write(chunk)
            left -= len(chunk)


def _send_hashed(out: BinaryIO, path: Path, offset: int, length: int) -> None:
    """The range, then protocol.FETCH_TRAILER: the sha256 of the file's first `offset` bytes
    (read here: what an interrupted pull already holds) and of what was sent, and whether the
    file stood still meanwhile (size, times and inode the same before and after). The
    controller checks its own hash of the same bytes against it; a file written to while it
    was read is reported as changed, never taken."""
    before = _identity(path)
    with hashing.Sha256(offset + length) as digest:
        with path.open("rb") as f:
            left = offset
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    break
                digest.update(chunk)
                left -= len(chunk)
                caller.check()
        send_range(out, path, offset, length, digest)
        hexdigest = digest.hexdigest()
    steady = before == _identity(path) and before[0] == offset + length
    out.write(hexdigest.encode() + (b"1" if steady else b"0"))


def _identity(path: Path) -> tuple[int, int, int, int]:
    info = path.stat()
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino
