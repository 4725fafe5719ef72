"""Contents on their way: `.partial/<sha256>.part` files that an interrupted pull resumes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import threading
from pathlib import Path
from typing import Any, BinaryIO

from deployer.core.errors import HostError
from deployer.hosts.fetching import Fetched
from deployer.hosts.reply_types import RemoteFile
from deployer.results.pull.localdisk import inside_run, local_error, local_mode, writing


class Changed(HostError):
    """A file that did not stand still while it was sent: that file's refusal, not its host's
    failure (a task still writing its log or TensorBoard events). Nothing of it is kept."""


def changed(host: str, name: str, remote: RemoteFile) -> HostError:
    return Changed(host, f"{name}: {remote.path} changed while being pulled; pull again")


def refusal(host: str, name: str, path: str) -> str:
    """As PullResult.refused says it: the task, its host, the file and what to do."""
    return (
        f"{name}@{host}: {path}: changed while it was pulled (still being written?); "
        "nothing of it was kept, pull it again once it stands still"
    )


class Cancelled(Exception):
    """Raised in a transfer's sink once the pull was stopped: no byte is written after it."""


PARTS = ".partial"  # DIR/<run-id>/.partial/: contents on their way (no task folder is so named)


class Landing:
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
            raise Cancelled
        with writing(self.dest):
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
                raise changed(host, self.name, remote)
            self.sha256 = want
            with writing(self.dest):
                os.fchmod(self.out.fileno(), local_mode(remote.mode))
                inside_run(self.dest, self.root)
                os.replace(self.part, self.dest)
        return got.count


def let_go(landing: Landing) -> None:
    """A part requested but never fetched stays to be resumed, unless nothing arrived in it:
    an empty part resumes nothing (removed while still locked, so no other pull holds it)."""
    with landing.out, contextlib.suppress(OSError):
        if os.fstat(landing.out.fileno()).st_size == 0:
            os.unlink(landing.part)


def adopt_part(part: Path, by_dest: Path) -> None:
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


def open_part(part: Path, parts: Path) -> BinaryIO | None:
    """`part` open for appending, mode 0600 from its first byte (the content may be private),
    and locked: another pull of this content into this folder waits here until the first is
    done. None when the part waited for was renamed into place meanwhile."""
    for _ in range(3):  # another pull may remove an empty `parts` between mkdir and open
        with writing(part):
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
