"""The code directory's hashes, remembered between commands: an unchanged file is not read again.

Every `up` names each file by its sha256, so the hosts receive only contents they lack. Hashing
reads every byte (~0.7 s per GB here), so a code directory holding a dataset or wheels cost
seconds of CPU, and of waiting once it outgrew the hellos it overlaps, on every `up`.

A file counts as unchanged when its size, mtime, ctime, inode and device all equal what they
were when it was hashed: rsync's quick check (size and mtime) and then some, as git's index
does. Any write changes ctime, which a user cannot set back. Two cases are guarded:

- the kernel stamps files from a coarse clock (a tick of a few ms; FAT's mtime ticks every
  2 s), so a file written again within the tick of its hashing could keep every stamp (git's
  "racy" entries): a file whose mtime or ctime is less than RACY_S before its hashing began is
  hashed again next time;
- NFS may answer stat() from attributes cached for up to a minute: each file is opened before
  its stamps are read (fstat), which revalidates them (close-to-open consistency).

The cache is only a shortcut: the hosts still check every content they store by its sha256.
A cache that cannot be read or written costs the hashing, never the push.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from deployer.core.statedir import state_dir

RACY_S = 2.0
VERSION = 1

Stamp = tuple[int, int, int, int, int]  # size, mtime_ns, ctime_ns, inode, device


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


class HashCache:
    """The hashes of one code directory, keyed by path relative to it."""

    def __init__(self, root: Path) -> None:
        self._root = str(root.resolve())
        key = hashlib.sha256(os.fsencode(self._root)).hexdigest()[:32]
        self.path = state_dir() / "hashes" / f"{key}.json"
        self._known = _load(self.path, self._root)
        self._seen: dict[str, list[Any]] = {}

    def lookup(self, rel: str, stamp: Stamp) -> str | None:
        """The sha256 hashed for this path when it had exactly this stamp, if any."""
        entry = self._known.get(rel)
        if entry is None or tuple(entry[:5]) != stamp:
            return None
        self._seen[rel] = entry
        return str(entry[5])

    def remember(self, rel: str, stamp: Stamp, sha256: str, opened_at: float) -> None:
        """Kept for the next scan unless the file changed too shortly before it was opened for
        hashing: a later write in the same clock tick could leave its stamp as it was."""
        if opened_at - max(stamp[1], stamp[2]) / 1e9 >= RACY_S:
            self._seen[rel] = [*stamp, sha256]

    def save(self) -> None:
        """Keeps the files of this scan only (a deleted file's entry goes)."""
        document = {"version": VERSION, "root": self._root, "files": self._seen}
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.part")
            tmp.write_text(json.dumps(document), encoding="utf-8")
            tmp.replace(self.path)


def _load(path: Path, root: str) -> dict[str, list[Any]]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # damaged: hashed again, nothing lost
        return {}
    if not isinstance(document, dict) or document.get("version") != VERSION:
        return {}
    files = document.get("files")
    if document.get("root") != root or not isinstance(files, dict):
        return {}
    return {
        rel: entry
        for rel, entry in files.items()
        if isinstance(entry, list) and len(entry) == 6 and isinstance(entry[5], str)
    }
