"""A task's exit record (exit.json) that a full disk cannot lose.

Checkpoints filling a disk are the most common way a training host runs out of space, and then
the task ends: writing exit.json needs a new file and a block, so its supervisor failed and the
task, finished with its own status, read as lost (host crash or kill -9). So each supervisor
reserves the space of its record while the disk has room: `exit.reserve`, RESERVE_BYTES of
spaces written (real blocks, not a sparse or fallocated hole that a later write would still
have to allocate). When the record cannot be written the usual way, it goes into those blocks
in place and the file is renamed to exit.json (a rename needs no data blocks), with
`disk_full` naming the file system that was full. JSON ignores the trailing spaces.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import layout

RESERVE = "exit.reserve"
RESERVE_BYTES = 4096  # a record is ~100 bytes; the rest is room for a lease expiry's `escaped`
FULL = (errno.ENOSPC, errno.EDQUOT)


def reserve(task_dir: Path) -> None:
    """Takes the blocks the exit record may need later. Best effort: a disk already full now
    fails the task's own writes at once, and its record is then written the usual way or lost
    as before (the only case left: a supervisor that could not even start its reservation)."""
    try:
        fd = os.open(
            task_dir / RESERVE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
        )
    except OSError:
        return
    try:
        os.write(fd, b" " * RESERVE_BYTES)
    except OSError:
        (task_dir / RESERVE).unlink()
    finally:
        os.close(fd)


def write(task_dir: Path, record: dict[str, Any]) -> None:
    """exit.json, the usual way; on a full disk, into the reserved blocks, saying so."""
    try:
        layout.write_json(task_dir / "exit.json", record)
    except OSError as exc:
        if exc.errno not in FULL or not (task_dir / RESERVE).exists():
            raise
        _write_reserved(task_dir, {**record, "disk_full": mount_point(task_dir)})
    else:
        (task_dir / RESERVE).unlink(missing_ok=True)


def _write_reserved(task_dir: Path, record: dict[str, Any]) -> None:
    data = json.dumps(record).encode()
    if len(data) > RESERVE_BYTES and "escaped" in record:
        # Only a lease expiry's list of stopped strays can be this long: its count must do.
        record = {**record, "escaped": [], "escaped_count": len(record["escaped"])}
        data = json.dumps(record).encode()
    fd = os.open(task_dir / RESERVE, os.O_WRONLY | os.O_NOFOLLOW)  # no O_TRUNC: keep the blocks
    try:
        os.pwrite(fd, data.ljust(RESERVE_BYTES), 0)
    finally:
        os.close(fd)
    os.replace(task_dir / RESERVE, task_dir / "exit.json")


def mount_point(path: Path) -> str:
    """The mount point of the file system holding `path`: what the user has to clean up."""
    path = path.resolve()
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return str(path)
