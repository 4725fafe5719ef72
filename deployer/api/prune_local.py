"""`tfdeploy prune --local`: frees this machine's caches by the hosts' rules (docs/results.md
"Pruning this machine").

The caches: resolved environments (`<state>/envs/<hash>/`: a job's wheels, and uv's wheel
per host platform, hard links into the wheel store `<state>/envs/.wheels/`, which keeps a
wheel while an entry links it) and images saved for `image_from = "controller"`
(`<state>/images/<id>/`). Each `up` records its run id in the entries it used
(deployer/envs/uses.py). As on a host, an entry stays while a recent run uses it (the newest
`keep` runs of each job this machine has a record of) or while it was used within `grace`;
with `older_than`, only entries last used before it go.
Whatever goes is resolved or saved again by the next `up` that needs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from deployer.api.prune import DEFAULT_GRACE_S, DEFAULT_KEEP
from deployer.core.errors import UsageError
from deployer.core.statedir import state_dir
from deployer.core.text import join_names, plural, size
from deployer.envs import uses, wheelhouse
from deployer.envs.resolve import cache_root
from deployer.results import runstore

GRAVE = ".pruned-"
# Written under a temporary name and renamed when whole: a leftover is a killed resolve or save.
_LEFTOVER = (".tmp", ".partial", ".old")


@dataclass(frozen=True)
class LocalPruned:
    """What a local prune removed (or, dry, would remove)."""

    environments: tuple[str, ...]
    images: tuple[str, ...]
    kept: int  # entries kept because a recent run uses them, or within the grace
    bytes: int
    dry_run: bool

    def line(self) -> str:
        verb = "would free" if self.dry_run else "freed"
        what = [plural(len(self.environments), "environment"), plural(len(self.images), "image")]
        return (
            f"this machine: {verb} {join_names(what)}, {size(self.bytes)}; "
            f"kept {plural(self.kept, 'entry', 'entries')} that recent runs use"
        )


def prune_local(
    *,
    keep: int = DEFAULT_KEEP,
    older_than: float | None = None,
    dry_run: bool = False,
    grace: float = DEFAULT_GRACE_S,
    say: Callable[[str], None] | None = None,
) -> LocalPruned:
    """Removes the cache entries of this machine that no recent run uses (see the module)."""
    if keep < 0 or grace < 0:
        raise UsageError(f"keep and grace must be 0 or more, got {keep} and {grace}")
    recent = recent_runs(keep)
    now = time.time()
    gone: dict[str, list[str]] = {"environment": [], "image": []}
    doomed: list[Path] = []
    kept = 0
    for kind, root in (("environment", cache_root()), ("image", state_dir() / "images")):
        for entry in _dirs(root):
            if entry.name.startswith("."):
                if entry.name.endswith(_LEFTOVER) and now - _mtime(entry) >= grace:
                    doomed.append(entry)
                continue
            last = uses.last_used(entry)
            if (
                uses.runs(entry) & recent
                or now - last < grace
                or (older_than is not None and last >= older_than)
            ):
                kept += 1
                continue
            doomed.append(entry)
            gone[kind].append(entry.name[:12])
    store = wheelhouse.store_of(cache_root())
    freed = _freed(doomed, store)
    if not dry_run:
        for entry in doomed:
            _remove(entry)
        _sweep(store, now - grace)
    result = LocalPruned(tuple(gone["environment"]), tuple(gone["image"]), kept, freed, dry_run)
    if say is not None:
        say(result.line())
    return result


def recent_runs(keep: int) -> set[str]:
    """The ids of the newest `keep` runs of each job among this machine's run records."""
    by_job: dict[str, list[tuple[float, str]]] = {}
    records, _ = runstore.listed_runs()
    for run_id in records:
        data = runstore.read_record(run_id).found  # None: damaged, or no file (a folder)
        with contextlib.suppress(ValueError, TypeError, OverflowError):
            if data is not None:
                created = float(data.get("created", 0.0))
                by_job.setdefault(str(data.get("job")), []).append((created, run_id))
    return {run for runs in by_job.values() for _, run in sorted(runs, reverse=True)[:keep]}


def _remove(entry: Path) -> None:
    """The entry removed (renamed aside first: never half there)."""
    grave = entry.with_name(f"{GRAVE}{entry.name}-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        entry.rename(grave)
        shutil.rmtree(grave, ignore_errors=True)


def _freed(doomed: list[Path], store: Path) -> int:
    """The bytes that removing `doomed` and then sweeping the wheel store frees: a file counts
    once all of its hard links are among them (entries share wheels through the store)."""
    found: dict[tuple[int, int], list[int]] = {}  # inode -> [size, links, links seen here]
    for top in (*doomed, store):
        for path in _walk(top):
            with contextlib.suppress(OSError):
                st = path.lstat()
                seen = found.setdefault((st.st_dev, st.st_ino), [st.st_size, st.st_nlink, 0])
                seen[2] += 1
    return sum(size for size, links, seen in found.values() if seen >= links)


def _sweep(store: Path, before: float) -> None:
    """The stored wheels no entry links any more (and parts of stores cut short) removed."""
    for path in _walk(store):
        with contextlib.suppress(OSError):
            st = path.lstat()
            if st.st_nlink == 1 and (not path.name.startswith(".") or st.st_mtime < before):
                path.unlink()


def _walk(root: Path) -> Iterator[Path]:
    for top, _, files in os.walk(root):
        for name in files:
            path = Path(top) / name
            if not path.is_symlink():
                yield path


def _dirs(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
