"""This machine's side of a pull: where files may land, what its disk says, modes as scp gives."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from deployer.core.errors import (
    LocalError,
)
from deployer.hosts.replies import PERMISSIONS

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
def writing(path: Path) -> Iterator[None]:
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


def in_the_way(dest: Path, base: Path) -> None:
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


def inside_run(dest: Path, root: Path) -> None:
    """Right before a file is written from a host's data: it is in the run's folder
    (`DIR/<run-id>`), links resolved, whatever folder was derived from the host's names."""
    if not dest.parent.resolve().is_relative_to(root.resolve()):
        raise LocalError(
            f"refusing to write {dest}: it is outside the run's folder {root}",
            hint="a link in that folder leads out of it, or a host sent a name that climbs out",
        )


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


def copy_content(first: Path, dest: Path, mode: int, parts: Path) -> None:
    """A content already here, copied to another task's file: through a private temporary
    file in `parts` (never a longer name beside `dest`), renamed into place."""
    with writing(dest):
        inside_run(dest, parts.parent)
        dest.parent.mkdir(parents=True, exist_ok=True)
        parts.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parts, suffix=".copy")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as out, first.open("rb") as src:
                _copy_contents(src, out)
                os.fchmod(out.fileno(), local_mode(mode))
            inside_run(dest, parts.parent)
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
