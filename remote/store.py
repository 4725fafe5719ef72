"""Content store and run code: the have and materialize ops.

WORKDIR/store may be shared by several hosts (an NFS home): every writer uses a temporary name
of its own, content is published by an atomic link that never replaces what is there, and the
mode of a published file never changes. So hosts storing the same content at once all succeed,
and a host can place content that another host stored.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, Collection

import daemon
import hashing
import hostid
import layout
import params
import protocol

_LINK_FALLBACK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES}
DEFAULT_MODE = 0o644  # of content whose blob names no mode: what most files want


def op_have(req: dict[str, Any]) -> protocol.HaveReply:
    store = layout.workdir_path(req) / "store"
    hashes = [params.check_hash(h) for h in params.param(req, "hashes", list)]
    return {"missing": _absent(store, hashes)}


def _absent(store: Path, digests: list[str]) -> list[str]:
    """The digests with no content in the store, as the file server sees it now.

    An NFS client remembers that a name did not exist until the directory's cached attributes
    expire (up to a minute), so content another host stored meanwhile would look missing.
    Listing the directory opens it, which revalidates it (close-to-open consistency): misses are
    confirmed that way before they are reported.
    """
    missing = [d for d in digests if not (store / d).is_file()]
    if not missing:
        return []
    try:
        names = set(os.listdir(store))
    except OSError:
        return missing  # no store yet
    return [d for d in missing if d not in names or not (store / d).is_file()]


def op_materialize(req: dict[str, Any]) -> protocol.MaterializeReply:
    workdir = layout.workdir_path(req)
    run_dir = layout.run_path(req, must_exist=False)
    # The run's code arriving ends its network check: the stand-ins go now, not in a round of
    # their own (the fan-out's relay and the tasks bind these ports next).
    daemon.stop_stand_ins(req, run_dir.name)
    entries = [_file_entry(item) for item in params.param(req, "files", list)]
    store = layout.make_private_dir(workdir / "store")
    blobs = params.param(req, "blobs", list, [])
    try:
        if blobs:
            receive(store, blobs, sys.stdin.buffer)
    except (params.AgentError, OSError) as exc:
        raise params.StreamError.of(exc) from exc
    # `keep`: contents the store must hold that no code file names (the job's wheels).
    keep = [params.check_hash(h) for h in params.param(req, "keep", list, [])]
    lacking = set(_absent(store, sorted({digest for _, digest, _ in entries} | set(keep))))
    missing = [str(rel) for rel, digest, _ in entries if digest in lacking]
    missing += [f"a stored content {digest[:12]}" for digest in keep if digest in lacking]
    if missing and params.param(req, "or_missing", bool, False) and not blobs:
        return {"missing": sorted(lacking)}  # what `have` would say: send these, then again
    if missing:
        count, first = len(missing), missing[0]
        raise params.AgentError(f"the store lacks the content of {count} file(s), {first!r} first")
    if layout.run_stopped(run_dir):  # `down` while this code was on its way: it starts nothing
        raise layout.StoppedRun(run_dir.name)
    layout.make_private_dir(run_dir)
    _write_run_json(req, run_dir)
    layout.touch(run_dir / "lease")
    code = run_dir / "code"
    code.mkdir(mode=0o700, exist_ok=True)
    checked: set[Path] = set()  # directories already known to lie inside code/
    for rel, digest, mode in entries:
        _place(store, digest, code, rel, mode, checked)
    return {"files": len(entries)}


CHUNK = 1 << 20  # bytes read from the stream at a time: memory stays bounded whatever the size


def receive(
    store: Path,
    blobs: list[Any],
    stream: BinaryIO,
    tee: Callable[[bytes], None] | None = None,
    only: Collection[str] | None = None,
) -> None:
    """Stores contents sent raw after the request line, each checked against its hash.

    One stream per host instead of one SFTP open/write/close/rename per file: with hundreds of
    small files the round trips, not the bytes, were the cost. Each content is copied through
    in CHUNK pieces and hashed as it arrives, so a 1 GB file needs 1 MB of memory here; `tee`
    gets every piece too (the fan-out's next host), contents already here included. `only`:
    the contents this host keeps; the others are checked and passed on, never written here
    (the fan-out relays what other hosts need through hosts that do not).
    """
    for item in blobs:
        if not (
            isinstance(item, list)
            and len(item) in (2, 3)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in item[1:])
        ):
            raise params.AgentError(
                f"each of 'blobs' must be [sha256, size] or [sha256, size, mode], got {item!r:.80}"
            )
        digest, size = params.check_hash(item[0]), item[1]
        mode = _mode(item[2]) if len(item) == 3 else DEFAULT_MODE
        if (only is not None and digest not in only) or (store / digest).is_file():
            # relayed only, or stored meanwhile (another host): read, not written
            _copy_through(stream, size, digest, None, tee)
        else:
            fill = functools.partial(
                _fill, stream=stream, size=size, digest=digest, mode=mode, tee=tee
            )
            _store(store, digest, store / digest, fill)


def _fill(
    path: Path,
    stream: BinaryIO,
    size: int,
    digest: str,
    mode: int,
    tee: Callable[[bytes], None] | None,
) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb", buffering=0) as f:
        _copy_through(stream, size, digest, f, tee)
        os.fchmod(f.fileno(), mode)


def _copy_through(
    stream: BinaryIO,
    size: int,
    digest: str,
    out: Any,
    tee: Callable[[bytes], None] | None,
) -> None:
    """Reads exactly `size` bytes of `stream` into `out` (an unbuffered file, or nowhere);
    their hash must be `digest`. A short or damaged content is an error, and nothing of it is
    published."""
    left = size
    with hashing.Sha256(size) as hasher:
        while left:
            chunk = stream.read(min(CHUNK, left))
            if not chunk:
                break
            hasher.update(chunk)
            if out is not None:
                _write_all(out, chunk)
            if tee is not None:
                tee(chunk)
            left -= len(chunk)
        damaged = left or hasher.hexdigest() != digest
    if damaged:
        raise params.AgentError(
            f"the content of {digest[:12]} arrived damaged or short",
            protocol.FAIL_DAMAGED,
            subject=digest,
        )


def _write_all(out: Any, data: bytes) -> None:
    """An unbuffered write may take less than it was given (a signal, a full pipe)."""
    view = memoryview(data)
    while view:
        view = view[out.write(view) :]


def _store(store: Path, digest: str, final: Path, fill: Callable[[Path], None]) -> None:
    """Fills a temporary file, then publishes it as `final` unless that is there already.

    The temporary name is this writer's alone (hosts sharing a store may run the same pid). A
    published inode never changes, content nor mode: code/ directories on every host sharing
    the store link to it. So an existing file wins (it has the same content), and it is never
    replaced under a reader.
    """
    unique = f"{hostid.identity()}.{os.getpid()}.{os.urandom(4).hex()}"
    tmp = store / f".{digest}.{unique}.part"
    try:
        fill(tmp)
        os.link(tmp, final)
    except FileExistsError:
        pass  # another writer was first: same content, so this is success
    except OSError as exc:
        if exc.errno not in _LINK_FALLBACK:
            raise
        if not final.exists():  # no hard links on this file system: rename instead
            os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _file_entry(item: Any) -> tuple[PurePosixPath, str, int]:
    if not isinstance(item, list) or len(item) != 3 or not isinstance(item[2], int):
        raise params.AgentError(
            f"each of 'files' must be [relpath, sha256, mode], got {item!r:.80}"
        )
    return params.check_relpath(item[0]), params.check_hash(item[1]), item[2]


def _write_run_json(req: dict[str, Any], run_dir: Path) -> None:
    old = layout.read_json(run_dir / "run.json")
    lease = params.param(req, "lease_seconds", (int, float), None)
    meta = {
        "run_id": run_dir.name,
        "job": params.param(req, "job", str),
        # A second materialize (new code, same run) keeps the run's age.
        "created": old.get("created") if isinstance(old, dict) else time.time(),
        "detached": params.param(req, "detached", bool, False),
        "lease_seconds": lease,
        "controller": req.get("controller"),
        "hosts": _run_hosts(req),
        "hosts_at": params.param(req, "hosts_at", (int, float), None),
    }
    layout.write_json(run_dir / "run.json", meta)


def _run_hosts(req: dict[str, Any]) -> list[list[str]] | None:
    """Every host of the run, [name, address]: `down` and `status` from a shell whose inventory
    lacks one of them can say so instead of leaving its tasks running unseen."""
    hosts: list[list[str]] | None = params.param(req, "hosts", list, None)
    for item in hosts or []:
        if not (
            isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
        ):
            raise params.AgentError(f"each of 'hosts' must be [name, address], got {item!r:.80}")
    return hosts


def _mode(value: int) -> int:
    """Only permission bits, and always readable by the owner (setuid and the like never pass)."""
    return (value & 0o777) | 0o400


def _source(store: Path, digest: str, mode: int) -> Path:
    """A store inode holding the content with exactly `mode`, to be hard-linked into code/.

    Modes are fixed when an inode is published and never changed afterwards: another run, or
    another host sharing the store, may have linked it already (and over NFS the link count
    that would tell is cached). The content as received has the mode its blob carried; another
    mode gets a copy of its own, `<sha256>.<mode>`, shared by every later file wanting it.
    """
    base = store / digest
    if os.stat(base).st_mode & 0o777 == mode:
        return base
    variant = store / f"{digest}.{mode:03o}"
    if not variant.is_file():
        _store(store, digest, variant, lambda tmp: _copy(base, tmp, mode))
    return variant


def _place(
    store: Path, digest: str, code: Path, rel: PurePosixPath, mode: int, checked: set[Path]
) -> None:
    """Hard-link one file into code/; copy when linking is impossible."""
    dest = code.joinpath(*rel.parts)
    if dest.parent not in checked:  # resolve() lstats every component: once per directory
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        parent, inside = dest.parent.resolve(), code.resolve()
        if parent != inside and inside not in parent.parents:
            where = f"unsafe relative path {str(rel)!r}"
            raise params.AgentError(f"{where}: a symlink leads out of code/")
        checked.add(dest.parent)
    want = _mode(mode)
    src = _source(store, digest, want)
    copy = False
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
