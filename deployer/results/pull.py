"""`tfdeploy pull`: the push in reverse. Tasks' files come home, only the contents missing here.

Each host lists what the patterns name (remote/results.py). Into a folder that holds nothing of
the run yet, every file travels, and the host hashes it as it sends it (one read, not two). Into
one that does (an earlier or interrupted pull), or when two tasks list a file at the same path
with the same size (replicas' checkpoints), the hosts hash first: a file already at its
destination with the same sha256 costs nothing, and a content another task has too travels once
and is copied locally. What travels is fetched into
`DIR/<run-id>/.partial/<sha256>.part` (a short name, so a 250-character file name still fits the
file system's limit; mode 0600 from its first byte; named by its destination's hash until its
content's is known), which an interrupted pull resumes and another pull of the same content into
the same folder waits for (a lock), checked against the host's hash, then renamed into place
with the file's mode. Files land in `DIR/<run-id>/<role>-<index>/`
(what absolute patterns named in `<role>-<index>.abs/`). A problem on this machine (a full or
read-only disk, a file where a folder goes) is a LocalError naming the path, never blamed on a
host. Ctrl-C stops the transfers at once, keeping what arrived.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from deployer.config.model import Job
from deployer.core.digest import sha256_file
from deployer.core.errors import (
    HostError,
    HostsFailed,
    LocalError,
    TfdeployError,
    UsageError,
)
from deployer.core.text import join_names, plural, task_order
from deployer.hosts.agent import Agent
from deployer.hosts.fetching import Fetched, FetchOrder
from deployer.hosts.fleet import Fleet, Member, Pending
from deployer.hosts.replies import PERMISSIONS, task_name_ok
from deployer.hosts.reply_types import Collected, RemoteFile
from remote import protocol

PARTS = ".partial"  # DIR/<run-id>/.partial/: contents on their way (no task folder is so named)
STOP_WAIT_S = 3.0  # after Ctrl-C, how long the transfers get to stop before `pull` returns

Wanted = tuple[Member, str, RemoteFile, Path]  # host, task, the file as listed, where it lands


@dataclass(frozen=True)
class PullResult:
    files: int  # files the patterns named, over all tasks
    fetched_bytes: int  # content bytes that travelled
    fetched_files: int
    refused: tuple[str, ...]  # "worker:1@h2: ../x: ..." what the hosts would not give
    destination: Path
    patterns: tuple[str, ...] = ()
    places: tuple[str, ...] = ()  # "worker:0@h1": the tasks that were asked
    # Files listed to come that did not (they changed while sent; in `refused` too): a pull
    # again may get them. A pattern or link the host refused is not counted: it never comes.
    not_kept: int = 0
    # Files and folders the hosts found and could not read (a path past PATH_MAX): never came.
    unread: int = 0
    # "worker:0 and worker:1 of h1 share ...": tasks of one host whose files landed once.
    shared: tuple[str, ...] = ()

    def summary(self) -> str:
        if not self.files and not self.unread:
            return self.nothing_matched()
        news = f"{self.fetched_bytes} bytes sent ({plural(self.fetched_files, 'file')})"
        if not self.fetched_files:
            news = "0 bytes sent, every file was already here"
        elif self.fetched_files < self.files:  # a file was here, or a content came for two
            news += ", the rest already here"
        shared = "".join(f"; {note}" for note in self.shared)
        if self.unread:  # each is named in a `not pulled:` line above
            shared += f"; {plural(self.unread, 'file or folder', 'files or folders')} the hosts "
            shared += "could not read did not come (named above)"
        return f"pulled {plural(self.files, 'file')} into {self.destination}: {news}{shared}"

    def nothing_matched(self) -> str:
        where = ", ".join(self.places) or "any task"
        return f"no file matched {', '.join(self.patterns)} on {where}; nothing was pulled"


def artifacts_home(fleet: Fleet, job: Job, run_id: str, hosts: Iterable[str]) -> list[str]:
    """job.artifacts from `hosts`, once the tasks were stopped; the lines to show. A failure is
    one of those lines, never raised: it must not hide how the job itself ended. Ctrl-C is
    raised (the caller says how to resume: `resume_command`)."""
    members = [fleet.member(h) for h in sorted(hosts)]
    if not job.artifacts or not members:
        return []
    try:
        result = pull(fleet, run_id, job.artifacts, Path(job.artifacts_to), members=members)
    except TfdeployError as exc:
        lines = [f"artifacts were not pulled: {exc.message}"]
        return lines + ([f"hint: {exc.hint}"] if exc.hint else [])
    refused = [f"artifact not pulled: {refusal}" for refusal in result.refused]
    return [*refused, f"artifacts: {result.summary()}"]


def resume_command(
    run_id: str,
    patterns: Sequence[str],
    to: str | Path,
    *,
    tasks: Sequence[str] | None = None,
    inventory: str | None = None,
) -> str:
    """The pull that fetches what an interrupted one left: the same patterns into the same
    folder (its `.partial/` holds what arrived)."""
    words = ["tfdeploy", "pull", run_id]
    words += ["-i", inventory] if inventory else []
    for task in tasks or ():
        words += ["--task", task]
    words += [*patterns, "--to", str(to)]
    return " ".join(shlex.quote(w) for w in words)


def task_folder(name: str) -> str:
    """`worker-0` of `worker:0`. Task names come from hosts: checked at the edge
    (deployer/hosts/replies.py) and again here, so a name never climbs out of the run."""
    if not task_name_ok(name):
        raise ValueError(f"{name!r} is not a task name: no folder is named after it")
    return name.replace(":", "-")


def landing(base: Path, task: str, path: str) -> tuple[Path, Path]:
    """(folder, file) where a listed file lands: a task's own files in `<role>-<index>/`, the
    files absolute patterns named (listed with their leading /) in `<role>-<index>.abs/`, so
    the host's /etc/hostname and the task's etc/hostname never land on each other."""
    if path.startswith("/"):
        folder = base / f"{task_folder(task)}.abs"
        return folder, folder / path.lstrip("/")
    folder = base / task_folder(task)
    return folder, folder / path


def pull(
    fleet: Fleet,
    run_id: str,
    patterns: Sequence[str],
    to: Path,
    *,
    tasks: Sequence[str] | None = None,
    members: Sequence[Member] | None = None,
) -> PullResult:
    """Pulls what `patterns` name of every task (or `tasks`) of the run, from every host (or
    `members`)."""
    check_destination(to)
    umask.cache_clear()  # read once a pull, here, before its threads
    base = to / run_id
    listed = _collect(fleet, run_id, patterns, tasks, members, hashed=base.exists())
    if not any(listed.values()):
        raise UsageError(
            f"no host of the inventory knows run {run_id}"
            + (f" or task {', '.join(tasks)}" if tasks else "")
        )
    listed, shared = _once_per_host(listed)
    wanted: list[Wanted] = []
    refused: list[str] = []
    unread = 0
    for host, by_task in sorted(listed.items()):
        for name, collected in sorted(by_task.items()):
            refused += [f"{name}@{host}: {why}" for why in collected.refused]
            unread += collected.unread
            wanted += _destinations(fleet.member(host), name, collected, base)
    top = base.resolve()
    for _, _, _, dest in wanted:
        _in_the_way(dest, top)
    missing = [w for w in wanted if not _has(w[3], w[2].sha256)]  # all when unhashed
    # Listed unhashed, but likely copies of one content: each travels once, and the hosts
    # hash their other copies while it does (_Replicas).
    likely_replicas = _replicas(listed)
    key = _Replicas.key if likely_replicas else _content_key
    sources = _one_source_per_content(missing, key)
    replicas = _Replicas(fleet, run_id, patterns, missing, sources) if likely_replicas else None
    fetch = _Fetch(run_id, patterns, base / PARTS)
    sent = fetch.all(fleet, sources) if sources else 0
    copies = missing
    if replicas is not None:
        copies, again = replicas.sorted_out(missing, sources, fetch.landed)
        if again:  # copies that turned out to differ: each from its own host
            again_fetch = _Fetch(run_id, patterns, base / PARTS)
            sent += again_fetch.all(fleet, _one_source_per_content(again, _content_key))
            fetch.fetched += again_fetch.fetched
            fetch.refused += again_fetch.refused
            fetch.not_kept |= again_fetch.not_kept
    refused += fetch.refused
    not_kept = len(fetch.not_kept)
    for member, name, remote, dest in copies:
        first = sources[key(remote, dest)][3]
        if dest == first:
            continue
        if first in fetch.not_kept:  # the same content changed while it came from elsewhere
            refused.append(_refusal(member.name, name, remote.path))
            not_kept += 1
            continue
        _copy(first, dest, remote.mode, base / PARTS)  # the same content: not sent again
    with contextlib.suppress(OSError):
        (base / PARTS).rmdir()  # empty once everything arrived
    return PullResult(
        files=len(wanted) - not_kept,
        not_kept=not_kept,
        unread=unread,
        fetched_bytes=sent,
        fetched_files=fetch.fetched,
        refused=tuple(refused),
        destination=base,
        patterns=tuple(patterns),
        places=tuple(f"{n}@{h}" for h, by_task in sorted(listed.items()) for n in sorted(by_task)),
        shared=tuple(shared),
    )


def _once_per_host(
    listed: dict[str, dict[str, Collected]],
) -> tuple[dict[str, dict[str, Collected]], list[str]]:
    """Each host's files listed once: the tasks of one host run in the run's one code directory
    on it (remote/layout.py, `task_cwd`), so a path two of them list is one file (an absolute
    path is the host's anyway). It lands in the folder of the first of them in task order
    (chief before worker, worker:0 before worker:1) and nowhere else; the notes say so, per host.
    """
    out: dict[str, dict[str, Collected]] = {}
    notes: list[str] = []
    for host, by_task in sorted(listed.items()):
        first_of: dict[str, str] = {}  # path -> the first task that listed it
        sharers: dict[str, set[str]] = {}  # a first task -> the later ones that listed its paths
        once: dict[str, set[str]] = {}  # a first task -> its paths the later ones listed too
        out[host] = {}
        for name in sorted(by_task, key=task_order):
            own = []
            for remote in by_task[name].files:
                first = first_of.setdefault(remote.path, name)
                if first == name:
                    own.append(remote)
                else:
                    sharers.setdefault(first, set()).add(name)
                    once.setdefault(first, set()).add(remote.path)
            out[host][name] = replace(by_task[name], files=tuple(own))
        for first, others in sharers.items():
            names = join_names([first, *sorted(others, key=task_order)])
            files = plural(len(once[first]), "file")
            notes.append(
                f"{names} share one directory on {host}: "
                f"{files} landed once, in {task_folder(first)}/"
            )
    return out, notes


def _collect(
    fleet: Fleet,
    run_id: str,
    patterns: Sequence[str],
    tasks: Sequence[str] | None,
    members: Sequence[Member] | None,
    *,
    hashed: bool,
    hash_only: Mapping[str, Mapping[str, list[str]]] | None = None,
) -> dict[str, dict[str, Collected]]:
    """What each host lists (hashing, with `hash_only`, just the paths it names for the host's
    tasks). Ctrl-C drops the connections of the hosts still walking and hashing, which ends
    their agents (remote/caller.py)."""

    def one(m: Member) -> dict[str, Collected]:
        only = hash_only.get(m.name, {}) if hash_only is not None else None
        return m.agent.collect(run_id, patterns, tasks, hashed=hashed, hash_only=only)

    try:
        listed, failures = fleet.each_settled(one, members)
    except KeyboardInterrupt:
        fleet.interrupt()
        raise
    failures = [f for f in failures if f.code != protocol.FAIL_NO_RUN]  # a host it did not use
    if failures:
        raise HostsFailed(failures, what="listing the files to pull failed", outcome=None)
    return listed


# ---- this machine's side ------------------------------------------------------------------

_HINTS = {
    errno.ENOSPC: "free some space there, or pull --to a folder on another disk",
    errno.EDQUOT: "free some space there, or pull --to a folder on another disk",
    errno.EROFS: "that file system is read-only: pull --to a writable folder",
    errno.EACCES: "you may not write there: pull --to a folder of yours",
    errno.EPERM: "you may not write there: pull --to a folder of yours",
    errno.ENOTDIR: "a file is where a folder goes: move it away, or pull --to another folder",
    errno.EEXIST: "a file is where a folder goes: move it away, or pull --to another folder",
    errno.EISDIR: "a folder is where a file goes: move it away, or pull --to another folder",
    errno.ENAMETOOLONG: "the path is too long for this file system: pull --to a shorter folder",
}
KEPT = "what arrived is kept, and the same pull again fetches only the rest"


def local_error(path: Path, exc: OSError) -> LocalError:
    """An OSError of this machine's disk, as the user must read it: the path, the cause, what
    to do."""
    cause = exc.strerror or str(exc)
    hint = _HINTS.get(exc.errno or 0, "fix that here, or pull --to another folder")
    return LocalError(f"cannot write {path} here: {cause}", hint=f"{hint}; {KEPT}")


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Local file operations on `path`: their OSError becomes a LocalError naming it. Only
    for this machine's disk: a socket's OSError is a host's problem."""
    try:
        yield
    except OSError as exc:
        raise local_error(path, exc) from exc


def check_destination(to: Path) -> None:
    """`--to` (or artifacts_to) must be, or be creatable as, a writable folder: checked before
    any host is asked, and without creating anything."""
    probe = to
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise LocalError(
            f"cannot pull into {to}: {probe} is a file, not a folder",
            hint="name a folder (--to, or artifacts_to in the inventory)",
        )
    if os.statvfs(probe).f_flag & os.ST_RDONLY:
        raise local_error(to, OSError(errno.EROFS, os.strerror(errno.EROFS)))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise local_error(to, OSError(errno.EACCES, os.strerror(errno.EACCES)))


def _in_the_way(dest: Path, base: Path) -> None:
    """A folder where a file lands, or a file where one of its folders goes (an earlier pull's,
    or the user's): said before any byte travels."""
    if dest.is_dir():
        raise local_error(dest, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
    for folder in dest.parents:
        if folder == base or not folder.is_relative_to(base):
            return
        if os.path.lexists(folder) and not folder.is_dir():
            raise LocalError(
                f"cannot write {dest} here: {folder} is a file, not a folder",
                hint=f"{_HINTS[errno.ENOTDIR]}; {KEPT}",
            )


def _destinations(member: Member, name: str, collected: Collected, base: Path) -> list[Wanted]:
    out = []
    top = base.resolve()
    for remote in collected.files:
        folder, dest = landing(base, name, remote.path)
        dest = dest.resolve()
        # A host's path must not climb out of its task's folder, nor (links resolved) the run's.
        if not dest.is_relative_to(folder.resolve()) or not dest.is_relative_to(top):
            raise HostError(member.name, f"{name}: {remote.path!r} would land outside {folder}")
        out.append((member, name, remote, dest))
    return out


def _inside_run(dest: Path, root: Path) -> None:
    """Right before a file is written from a host's data: it is in the run's folder
    (`DIR/<run-id>`), links resolved, whatever folder was derived from the host's names."""
    if not dest.parent.resolve().is_relative_to(root.resolve()):
        raise LocalError(
            f"refusing to write {dest}: it is outside the run's folder {root}",
            hint="a link in that folder leads out of it, or a host sent a name that climbs out",
        )


def _has(dest: Path, sha256: str | None) -> bool:
    return sha256 is not None and dest.is_file() and sha256_file(dest) == sha256


def _replicas(listed: dict[str, dict[str, Collected]]) -> bool:
    """Two tasks list a file at the same path with the same size, unhashed: replicas' identical
    checkpoints look like that, and their content should travel once, which takes hashes."""
    seen: set[tuple[str, int]] = set()
    for by_task in listed.values():
        for collected in by_task.values():
            for remote in collected.files:
                if remote.sha256 is None:
                    if (remote.path, remote.size) in seen:
                        return True
                    seen.add((remote.path, remote.size))
    return False


def _arrived(dest: Path, sha256: str | None) -> bool:
    """The pull this one waited for put the content in place: checked by hash when listed
    hashed; listed unhashed, that pull fetched the same host's same file and checked it."""
    return dest.is_file() if sha256 is None else _has(dest, sha256)


def _content_key(remote: RemoteFile, dest: Path) -> str:
    """The name its part file gets: the content's sha256, or, listed unhashed, one derived from
    where it lands (a resumed pull lists it hashed and renames that part: `_adopt_part`)."""
    return remote.sha256 or "dest-" + hashlib.sha256(os.fsencode(dest)).hexdigest()[:40]


class _Replicas:
    """Replicas' files, listed unhashed, checked while they travel instead of before.

    Tasks that list a file at one path with one size (replicas' identical checkpoints) likely
    hold one content: each such group is fetched once, from one of its hosts, while the hosts
    hash their other copies (a listing that hashes just those, on a thread of its own; what a
    host sends it hashes as it sends). Hashing first held the first byte back by a whole pass
    over the files on the hosts, and hashing every file read the sent ones twice. Once both
    are done, a copy whose hash is the fetched one is copied here, and one that differs is
    fetched from its own host."""

    def __init__(
        self,
        fleet: Fleet,
        run_id: str,
        patterns: Sequence[str],
        missing: list[Wanted],
        sources: dict[str, Wanted],
    ) -> None:
        self._listed: dict[str, dict[str, Collected]] = {}  # stays empty if the listing fails
        sent = {id(item) for item in sources.values()}
        copies: dict[str, dict[str, list[str]]] = {}  # host -> task -> the paths to hash
        for member, name, remote, _ in (item for item in missing if id(item) not in sent):
            copies.setdefault(member.name, {}).setdefault(name, []).append(remote.path)
        holders = [fleet.member(host) for host in copies]
        tasks = sorted({name for by_task in copies.values() for name in by_task})

        def hash_them() -> None:
            with contextlib.suppress(BaseException):  # no hashes: every copy is fetched
                self._listed = _collect(
                    fleet, run_id, patterns, tasks, holders, hashed=True, hash_only=copies
                )

        self._thread: threading.Thread | None = None  # none when no host holds a copy
        if copies:
            self._thread = threading.Thread(target=hash_them, name="replica hashes", daemon=True)
            self._thread.start()

    @staticmethod
    def key(remote: RemoteFile, dest: Path) -> str:
        """One group per path and size, for the files listed unhashed."""
        if remote.sha256 is not None:
            return remote.sha256
        return f"{remote.size}:{remote.path}"

    def sorted_out(
        self, missing: list[Wanted], sources: dict[str, Wanted], landed: dict[Path, str]
    ) -> tuple[list[Wanted], list[Wanted]]:
        """(the files to copy from their group's fetched one, those to fetch themselves)."""
        if self._thread is not None:
            self._thread.join()
        hashes = {
            (host, task, remote.path): (remote.size, remote.sha256)
            for host, by_task in self._listed.items()
            for task, collected in by_task.items()
            for remote in collected.files
        }
        copies: list[Wanted] = []
        again: list[Wanted] = []
        contents: dict[Path, tuple[int, str]] = {}  # each group's fetched file: size, sha256
        for item in missing:
            source = sources[self.key(item[2], item[3])]
            dest = source[3]
            if dest not in contents:  # not in `landed`: another pull here brought it meanwhile
                sha256 = landed.get(dest) or (sha256_file(dest) if dest.is_file() else "")
                contents[dest] = (source[2].size, sha256)
            if (
                item is source
                or hashes.get((item[0].name, item[1], item[2].path)) == contents[dest]
            ):
                copies.append(item)
            else:
                again.append(item)
        return copies, again


class _Changed(HostError):
    """A file that did not stand still while it was sent: that file's refusal, not its host's
    failure (a task still writing its log or TensorBoard events). Nothing of it is kept."""


def _changed(host: str, name: str, remote: RemoteFile) -> HostError:
    return _Changed(host, f"{name}: {remote.path} changed while being pulled; pull again")


def _refusal(host: str, name: str, path: str) -> str:
    """As PullResult.refused says it: the task, its host, the file and what to do."""
    return (
        f"{name}@{host}: {path}: changed while it was pulled (still being written?); "
        "nothing of it was kept, pull it again once it stands still"
    )


def _one_source_per_content(
    missing: list[Wanted], key: Callable[[RemoteFile, Path], str]
) -> dict[str, Wanted]:
    """Each content once, from one of the hosts that have it: replicas' identical checkpoints
    are shared out, so every host sends a part at once instead of one host sending it all.
    A content only one host has goes to that host; the others go, largest first, to the host
    with the fewest bytes to send so far (the earliest in the listing on a tie)."""
    holders: dict[str, list[Wanted]] = {}
    for item in missing:
        holders.setdefault(key(item[2], item[3]), []).append(item)
    load = {item[0].name: 0 for item in missing}
    sources: dict[str, Wanted] = {}
    shared = sorted(holders.items(), key=lambda kv: (len(kv[1]) > 1, -kv[1][0][2].size))
    for content, items in shared:
        source = min(items, key=lambda item: load[item[0].name])  # min keeps the first on ties
        load[source[0].name] += source[2].size
        sources[content] = source
    return sources


def local_mode(mode: int) -> int:
    """A pulled file's mode, as scp gives it: the host's permission bits less this process's
    umask (a group- or world-writable bit a host chose never lands unasked; 0644 for none)."""
    return ((mode & PERMISSIONS) or 0o644) & ~umask()


@functools.cache
def umask() -> int:
    """This process's umask, read without setting it (os.umask sets it, for every thread)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as status:
            line = next(x for x in status if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    mask = os.umask(0o022)  # no /proc (not Linux): the one read, before any pull thread
    os.umask(mask)
    return mask


def _copy(first: Path, dest: Path, mode: int, parts: Path) -> None:
    """A content already here, copied to another task's file: through a private temporary
    file in `parts` (never a longer name beside `dest`), renamed into place."""
    with _writing(dest):
        _inside_run(dest, parts.parent)
        dest.parent.mkdir(parents=True, exist_ok=True)
        parts.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parts, suffix=".copy")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as out, first.open("rb") as src:
                _copy_contents(src, out)
                os.fchmod(out.fileno(), local_mode(mode))
            _inside_run(dest, parts.parent)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _copy_contents(src: BinaryIO, out: BinaryIO) -> None:
    """In the kernel where it can (copy_file_range: a reflink on XFS or btrfs, which costs
    neither time nor disk space for a checkpoint of gigabytes); through this process where the
    file systems cannot (two of them, an old kernel)."""
    copied = 0
    try:
        while n := os.copy_file_range(src.fileno(), out.fileno(), 1 << 30):
            copied += n
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        src.seek(copied)
        out.seek(copied)
        shutil.copyfileobj(src, out, 1 << 20)


class _Cancelled(Exception):
    """Raised in a transfer's sink once the pull was stopped: no byte is written after it."""


class _Fetch:
    """Each missing content once, hosts in parallel, each on a session of its own; Ctrl-C (or
    a local error) stops every transfer at once, keeping what arrived."""

    def __init__(self, run_id: str, patterns: Sequence[str], parts: Path) -> None:
        self.run_id = run_id
        self.patterns = patterns
        self.parts = parts
        self.cancelled = threading.Event()
        self.sent = 0  # bytes that travelled
        self.fetched = 0  # contents this pull fetched (not those another pull brought meanwhile)
        self.landed: dict[Path, str] = {}  # where each fetched content is, and its sha256
        self.refused: list[str] = []  # files that changed while they were sent (_refusal)
        self.not_kept: set[Path] = set()  # and where they would have landed
        self.local: list[LocalError] = []
        self._lock = threading.Lock()
        self._open: list[Agent] = []  # the sessions carrying bytes now

    def all(self, fleet: Fleet, sources: dict[str, Wanted]) -> int:
        """Fetches `sources`; returns how many bytes travelled (a resumed content counts only
        its rest); `fetched` counts the contents."""
        with _writing(self.parts):
            self.parts.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.parts, 0o700)  # contents may be private: only their owner looks in
        by_host: dict[str, list[tuple[str, RemoteFile, Path]]] = {}
        for member, name, remote, dest in sources.values():
            by_host.setdefault(member.name, []).append((name, remote, dest))
        pendings = [
            fleet.submit(functools.partial(self._host, items=items), fleet.member(host))
            for host, items in by_host.items()
        ]
        try:
            for pending in pendings:
                pending.wait()
        except KeyboardInterrupt:
            self._stop(pendings)  # a second Ctrl-C here ends the wait at once
            raise
        return self._outcome(pendings)

    def _outcome(self, pendings: list[Pending[None]]) -> int:
        if self.local:  # this machine's problem, whatever the hosts did meanwhile
            raise self.local[0]
        failures = []
        for pending in pendings:
            try:
                pending.result()
            except HostError as exc:
                failures.append(exc)
        if failures:
            raise HostsFailed(failures, what="pulling files failed", outcome=None)
        return self.sent

    def _stop(self, pendings: list[Pending[None]]) -> None:
        """No byte written from now on; the sessions closed (which ends the hosts' sends), and
        the transfers given STOP_WAIT_S to notice."""
        self.cancelled.set()
        with self._lock:
            sessions = list(self._open)
        for agent in sessions:  # closing a local session waits for its process: not here
            threading.Thread(target=agent.close_session, daemon=True).start()
        deadline = time.monotonic() + STOP_WAIT_S
        for pending in pendings:
            pending.wait(max(0.0, deadline - time.monotonic()))

    def _host(self, member: Member, items: list[tuple[str, RemoteFile, Path]]) -> None:
        landings: collections.deque[_Landing] = collections.deque()  # requested, not yet done
        try:
            with member.agent.dedicated() as agent:  # bulk bytes: a session of their own
                with self._lock:
                    if self.cancelled.is_set():
                        return
                    self._open.append(agent)
                orders = self._orders(items, landings)
                fetches = agent.fetch_each(self.run_id, self.patterns, orders)
                with contextlib.closing(fetches):  # an error here ends the session at once
                    for _, got in fetches:
                        landing = landings.popleft()
                        try:
                            fetched = landing.finish(member.name, got)
                        except _Changed:  # that file only: the host's next ones still come
                            why = _refusal(member.name, landing.name, landing.remote.path)
                            with self._lock:
                                self.refused.append(why)
                                self.not_kept.add(landing.dest)
                            continue
                        with self._lock:
                            self.sent += fetched
                            self.fetched += 1
                            self.landed[landing.dest] = landing.sha256
        except _Cancelled:
            return
        except LocalError as exc:  # a full disk fails every host's transfers: stop them all
            with self._lock:
                self.local.append(exc)
            self.cancelled.set()
        finally:
            for landing in landings:  # requested, never fetched: their parts stay to resume
                _let_go(landing)

    def _orders(
        self, items: list[tuple[str, RemoteFile, Path]], landings: collections.deque[_Landing]
    ) -> Iterator[FetchOrder]:
        """Each content's fetch, its part file resumed and locked just before it is requested
        (a content another pull put in place meanwhile is skipped).

        A host's fetches hold several part locks at once (those requested ahead), so every pull
        takes them in one order, by content: two pulls into one folder wait for each other's
        parts, never in a circle."""
        for name, remote, dest in sorted(items, key=lambda i: _content_key(i[1], i[2])):
            if self.cancelled.is_set():
                raise _Cancelled
            landing = self._landing(name, remote, dest)
            if landing is None:
                continue
            landings.append(landing)
            listed = remote.size
            yield FetchOrder(name, remote.path, landing.offset, landing.sink, listed_size=listed)

    def _landing(self, name: str, remote: RemoteFile, dest: Path) -> _Landing | None:
        """The content's part file, open, locked and ready to append to; None when another
        pull brought the content meanwhile."""
        _inside_run(dest, self.parts.parent)
        with _writing(dest.parent):
            dest.parent.mkdir(parents=True, exist_ok=True)
        part = self.parts / f"{_content_key(remote, dest)}.part"
        _adopt_part(part, self.parts / f"{_content_key(replace(remote, sha256=None), dest)}.part")
        if remote.sha256 is not None and _has(dest, remote.sha256):  # a first pull beside us
            return None
        while True:
            out = _open_part(part, self.parts)
            if out is not None:
                break
            if _arrived(dest, remote.sha256):  # the pull we waited for brought it
                return None
        return _Landing(out, part, name, remote, dest, self.cancelled, self.parts.parent)


class _Landing:
    """Where one fetched content lands: its part file, appended to, then checked and renamed.

    The host hashes the whole file as it sends it. From offset 0 that hash is the check: the
    bytes came over SSH's authenticated encryption, so what landed is what the host hashed, and
    hashing it again here cost a third of this machine's CPU per MB. A resumed part is hashed
    here, its old bytes included: they came from an earlier attempt."""

    def __init__(
        self,
        out: BinaryIO,
        part: Path,
        name: str,
        remote: RemoteFile,
        dest: Path,
        cancelled: threading.Event,
        root: Path,
    ) -> None:
        self.out, self.part, self.name, self.remote, self.dest = out, part, name, remote, dest
        self.cancelled, self.root = cancelled, root
        self.sha256 = ""  # the whole content's, once it is in place
        try:
            self.offset = os.fstat(out.fileno()).st_size
            if self.offset > remote.size:
                out.truncate(0)
                self.offset = 0
            self.hasher = _hasher(out, self.offset) if self.offset else None
        except BaseException:
            out.close()
            raise

    def sink(self, data: bytes | memoryview) -> None:
        if self.cancelled.is_set():
            raise _Cancelled
        with _writing(self.dest):
            _write_all(self.out, data)
        if self.hasher is not None:
            self.hasher.update(data)

    def finish(self, host: str, got: Fetched) -> int:
        """Checks what arrived against what the host listed and hashed; renames it into place.
        Returns the bytes fetched."""
        remote = self.remote
        with self.out:
            want = remote.sha256 or got.sha256
            landed = got.sha256 if self.hasher is None else self.hasher.hexdigest()
            whole = self.offset + got.count == remote.size and got.steady
            if not whole or want is None or got.sha256 != want or landed != want:
                with contextlib.suppress(OSError):
                    os.unlink(self.part)
                raise _changed(host, self.name, remote)
            self.sha256 = want
            with _writing(self.dest):
                os.fchmod(self.out.fileno(), local_mode(remote.mode))
                _inside_run(self.dest, self.root)
                os.replace(self.part, self.dest)
        return got.count


def _let_go(landing: _Landing) -> None:
    """A part requested but never fetched stays to be resumed, unless nothing arrived in it:
    an empty part resumes nothing (removed while still locked, so no other pull holds it)."""
    with landing.out, contextlib.suppress(OSError):
        if os.fstat(landing.out.fileno()).st_size == 0:
            os.unlink(landing.part)


def _adopt_part(part: Path, by_dest: Path) -> None:
    """What an interrupted first pull left under its destination's name, resumed as this
    content's part (the final hash check catches a file that changed on the host meanwhile).
    Taken under its lock: a pull still writing it is waited for, and then it is in place."""
    if part == by_dest or part.exists():
        return
    try:
        fd = os.open(by_dest, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return  # none: the usual case
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_ino == os.stat(by_dest).st_ino and not part.exists():
            os.rename(by_dest, part)
    except OSError:
        pass  # renamed into place meanwhile: nothing to adopt
    finally:
        os.close(fd)


def _open_part(part: Path, parts: Path) -> BinaryIO | None:
    """`part` open for appending, mode 0600 from its first byte (the content may be private),
    and locked: another pull of this content into this folder waits here until the first is
    done. None when the part waited for was renamed into place meanwhile."""
    for _ in range(3):  # another pull may remove an empty `parts` between mkdir and open
        with _writing(part):
            parts.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
                break
            except FileNotFoundError:
                continue
    else:
        raise local_error(part, FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT)))
    out = os.fdopen(fd, "r+b", buffering=0)
    try:
        os.fchmod(fd, 0o600)  # a part an older tfdeploy left readable to all
        fcntl.flock(fd, fcntl.LOCK_EX)
        same = os.fstat(fd).st_ino == os.stat(part).st_ino
    except FileNotFoundError:
        same = False
    except BaseException:
        out.close()
        raise
    if not same:
        out.close()
        return None
    return out


def _write_all(out: BinaryIO, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[out.write(view) or 0 :]


def _hasher(f: BinaryIO, size: int) -> Any:
    """sha256 over the first `size` bytes of `f`: what an earlier pull already fetched."""
    hasher = hashlib.sha256()
    f.seek(0)
    left = size
    while left:
        chunk = f.read(min(1 << 20, left))
        if not chunk:
            break
        hasher.update(chunk)
        left -= len(chunk)
    return hasher
