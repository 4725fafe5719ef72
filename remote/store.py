"""Content store and run code: the have and materialize ops."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import layout
import params

_LINK_FALLBACK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES}


def op_have(req: dict[str, Any]) -> dict[str, Any]:
    store = layout.workdir_path(req) / "store"
    hashes = [params.check_hash(h) for h in params.param(req, "hashes", list)]
    return {"missing": [h for h in hashes if not (store / h).is_file()]}


def op_materialize(req: dict[str, Any]) -> dict[str, Any]:
    workdir = layout.workdir_path(req)
    run_dir = layout.run_path(req, must_exist=False)
    entries = [_file_entry(item) for item in params.param(req, "files", list)]
    store = layout.make_private_dir(workdir / "store")
    blobs = params.param(req, "blobs", list, [])
    if blobs:
        _receive(store, blobs, sys.stdin.buffer)
    missing = [str(rel) for rel, digest, _ in entries if not (store / digest).is_file()]
    if missing:
        count, first = len(missing), missing[0]
        raise params.AgentError(f"the store lacks the content of {count} file(s), {first!r} first")
    layout.make_private_dir(workdir / "runs")
    layout.make_private_dir(run_dir)
    _write_run_json(req, run_dir)
    layout.touch(run_dir / "lease")
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
            raise params.AgentError(f"each of 'blobs' must be [sha256, size], got {item!r:.80}")
        digest, size = params.check_hash(item[0]), item[1]
        data = stream.read(size)
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise params.AgentError(f"the content of {digest[:12]} arrived damaged or short")
        tmp = store / f".{digest}.{os.getpid()}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, store / digest)


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
    }
    layout.write_json(run_dir / "run.json", meta)


def _place(src: Path, code: Path, rel: PurePosixPath, mode: int, checked: set[Path]) -> None:
    """Hard-link one file into code/; copy when linking is impossible or would change a mode."""
    dest = code.joinpath(*rel.parts)
    if dest.parent not in checked:  # resolve() lstats every component: once per directory
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        parent, inside = dest.parent.resolve(), code.resolve()
        if parent != inside and inside not in parent.parents:
            where = f"unsafe relative path {str(rel)!r}"
            raise params.AgentError(f"{where}: a symlink leads out of code/")
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
