"""Which runs used an entry of this machine's caches (a resolved environment, uv's wheel, a saved
image): `<entry>/.uses/<run id>`, one empty file per run, its mtime the last use.

The same record the hosts keep for their venvs (remote/venvs.py record_use), so `tfdeploy prune
--local` frees this machine by the hosts' rules: an entry no recent run uses goes
(deployer/api/prune_local.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

USES = ".uses"


def record(entries: Iterable[Path], run_id: str) -> None:
    """Marks each entry as used by run_id now. A cache that cannot be written is no reason to
    stop a deploy: the entry then looks unused and a prune may take it, to be resolved again."""
    now = time.time()
    for entry in entries:
        with contextlib.suppress(OSError):
            (entry / USES).mkdir(mode=0o700, exist_ok=True)
            path = entry / USES / run_id
            path.touch()
            os.utime(path, (now, now))


def runs(entry: Path) -> set[str]:
    try:
        return set(os.listdir(entry / USES))
    except OSError:
        return set()


def last_used(entry: Path) -> float:
    """The newest use, else when the entry was written (its directory's mtime)."""
    try:
        found = [e.stat().st_mtime for e in os.scandir(entry / USES)]
    except OSError:
        found = []
    with contextlib.suppress(OSError):
        found.append(entry.stat().st_mtime)
    return max(found, default=0.0)
