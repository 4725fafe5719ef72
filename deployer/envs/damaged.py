"""A file of one of this machine's caches (a resolved environment's wheel, a saved image's blob)
found damaged on its way to a host: named as the cache's, and its entry removed.

The host hashes every content it receives and refuses one whose hash is not the manifest's. For
a file of the job's code that means it changed while being pushed; for a cached wheel or blob,
which nothing should write, it means the cache entry is damaged (a disk error, an edit by hand,
a copy cut short then padded). The entry's manifest was checked by size only (wheelhouse.load:
hashing gigabytes of wheels on every `up` would cost more than it saves), so a same-size damage
was reported as "job.code changed" on every `up`, forever. Removing the entry makes the next
`up` resolve (or save) it afresh.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from deployer.core.errors import LocalError
from deployer.envs import wheelhouse

_ENTRY_MARKERS = (wheelhouse.MANIFEST, "index.json")  # a wheelhouse, an OCI layout


def cache_entry(path: Path) -> Path | None:
    """The cache entry (wheelhouse or saved image) that holds `path`, if any."""
    return next((p for p in path.parents if any((p / m).is_file() for m in _ENTRY_MARKERS)), None)


def damaged(path: Path) -> LocalError:
    """The error for a cached file that reached a host damaged; its entry is removed now."""
    entry = cache_entry(path)
    if entry is not None:
        shutil.rmtree(entry, ignore_errors=True)
    removed = f"; its cache entry {entry} was removed" if entry is not None else ""
    return LocalError(
        f"{path} in tfdeploy's cache on this machine is damaged: its content is not the one "
        f"the cache recorded for it{removed}",
        hint="run `tfdeploy up --refresh-env` (the environment is resolved again and the image "
        "saved again); a damage that comes back points at this machine's disk",
    )
