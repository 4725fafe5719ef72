"""The prune op: removes this host's old runs, and the contents and environments no run uses.

What a run uses:
- its code: the files of code/ are hard links to store inodes (store.py _place), so a content is
  in use while any run directory of any host sharing the workdir links it, which its link count
  says (one stat per content; no run's file list is read). A code file that had to be copied
  (a file system without hard links) holds its own bytes: the content is then not needed by
  that run at all. Removing a store name never changes a run's files either way: a link left in
  a code/ keeps the bytes. A content linked by nothing is kept while its inode changed within
  the grace (stored or linked lately: a push stores contents before the materialize that links
  them, a fan-out relay minutes before), since no run directory names it yet.
- its environment: WORKDIR/envs/<hash>/.uses/<run id> (venvs.record_use). An environment is in
  use while a run directory of that id is left under any host of the workdir, or while its last
  use is within the grace (a use recorded before its run directory was written).

Only this host's runs are removed (WORKDIR/hosts/<this host>/runs): whether another host's run
still runs only that host can tell (its pids, its clock for the lease), so its runs count as
users of what they link and name until a prune on that host removes them. A run is never
removed while it may run: a task starting or running, a setup command alive, a lease that
is live (a controller or a keeper deploying or watching it, and no whole-run stop since), or a
live port reservation of it (an `up --resume` between its hello and its push). Each
run is judged and removed under its run lock (start and setup take it), each environment under
its SharedLock (builders take it).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Counter, Tuple

import bytecode
import hostid
import layout
import params
import procs
import protocol
import reservations
import sharedlock
import venvs

_BLOB = re.compile(r"[0-9a-f]{64}(\.[0-7]{3})?")
_PART = re.compile(r"\.[0-9a-f]{64}\..+\.part")
GRAVE = ".pruned-"  # a run or environment renamed aside, being removed
Inode = Tuple[int, int]


class _Tally:
    """What a prune removed (or would remove): names, counts and the bytes freed."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.running: list[str] = []
        self.contents = 0
        self.environments: list[str] = []
        self.checkpoints: list[str] = []  # jobs whose own checkpoint folder went with their runs
        self.bytes = 0


def op_prune(req: dict[str, Any]) -> protocol.PruneReply:
    workdir = layout.workdir_path(req)
    keep = params.param(req, "keep", int)
    if keep < 0:
        raise params.AgentError(f"keep must be 0 or more, got {keep}")
    older_than = params.param(req, "older_than", (int, float), None)
    dry = params.param(req, "dry_run", bool, False)
    grace = float(params.param(req, "grace", (int, float), protocol.PRUNE_GRACE_S))
    tally = _Tally()
    if workdir.is_dir():
        _prune(workdir, keep, older_than, dry, grace, tally)
    return {
        "runs": tally.runs,
        "running": tally.running,
        "contents": tally.contents,
        "environments": tally.environments,
        "checkpoints": tally.checkpoints,
        "bytes": tally.bytes,
        "dry_run": dry,
    }


def _prune(
    workdir: Path, keep: int, older_than: float | None, dry: bool, grace: float, tally: _Tally
) -> None:
    now = time.time()
    if not dry:
        _sweep_graves(layout.host_dir(workdir), venvs.envs_dir(workdir))
    store = _store_entries(workdir / "store")  # before runs go: their unlinks change ctimes
    unlinked: Counter[Inode] = collections.Counter()  # links of store inodes the prune removes
    gone = set()
    for run_dir in _beyond_keep(layout.runs_dir(workdir), keep, older_than):
        if dry:
            removed = _judge_run(workdir, run_dir, now, grace, dry, tally, unlinked)
        else:
            with layout.run_lock(run_dir):  # no start or setup of this run half-way now
                removed = _judge_run(workdir, run_dir, now, grace, dry, tally, unlinked)
        if removed:
            gone.add(run_dir)
    tally.running += sorted(reservations.claims(workdir))  # pushing: no folder to judge yet
    users = _run_ids(workdir, gone)
    _prune_checkpoints(workdir, gone, dry, tally)
    _prune_envs(workdir, users, now, grace, dry, tally)
    if tally.environments:
        _prune_host_wheels(workdir, dry, tally, unlinked)
    _prune_store(workdir / "store", store, unlinked, now, grace, dry, tally)


def _beyond_keep(runs_dir: Path, keep: int, older_than: float | None) -> list[Path]:
    """This host's runs past the newest `keep` of their job, created before `older_than`."""
    by_job: dict[Any, list[tuple[float, str, Path]]] = {}
    for run_dir in _dirs(runs_dir):
        meta = layout.read_json(run_dir / "run.json")
        meta = meta if isinstance(meta, dict) else {}
        created = meta.get("created")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            created = run_dir.stat().st_mtime  # half-written run: its directory's age will do
        job = meta.get("job") if isinstance(meta.get("job"), str) else None
        by_job.setdefault(job, []).append((float(created), run_dir.name, run_dir))
    chosen = []
    for runs in by_job.values():
        runs.sort(reverse=True)
        chosen += [p for created, _, p in runs[keep:] if older_than is None or created < older_than]
    return sorted(chosen)


def _judge_run(
    workdir: Path,
    run_dir: Path,
    now: float,
    grace: float,
    dry: bool,
    tally: _Tally,
    unlinked: Counter[Inode],
) -> bool:
    """Removes the run unless it may still run; whether it did (dry: would)."""
    if _may_run(workdir, run_dir, now, grace):
        tally.running.append(run_dir.name)
        return False
    freed, links = _walk(run_dir)
    if not dry:
        grave = run_dir.parent.parent / f"{GRAVE}{run_dir.name}-{os.urandom(4).hex()}"
        os.rename(str(run_dir), str(grave))  # out of the runs listing at once, then removed
        shutil.rmtree(str(grave), ignore_errors=True)
    tally.runs.append(run_dir.name)
    tally.bytes += freed
    unlinked.update(links)
    return True


def _may_run(workdir: Path, run_dir: Path, now: float, grace: float) -> bool:
    """Whether anything of the run may still run or be about to: when in doubt, True."""
    meta = layout.read_json(run_dir / "run.json")
    if not isinstance(meta, dict):  # written right after its directory: a materialize under way?
        return now - (_mtime(run_dir) or now) < grace
    for task_dir in layout.task_dirs(run_dir):
        state = procs.task_state(task_dir)[0]
        if state == protocol.STATE_RUNNING:
            return True
        # A spec with no pid.json yet: its supervisor is being started, or a start was killed
        # half-way (then, past the grace, nothing will ever start it).
        if state == protocol.STATE_STARTING and now - (_mtime(task_dir) or now) < grace:
            return True
    setup = layout.read_json(run_dir / "setup.json")
    if isinstance(setup, dict) and procs.group_alive(setup.get("pgid"), setup.get("start_ticks")):
        return True
    if reservations.reserving(workdir, run_dir.name):  # `up --resume` before its push
        return True
    return layout.lease_held(run_dir, meta, now)  # a whole-run stop: nothing of it may start


def _walk(root: Path) -> tuple[int, Counter[Inode]]:
    """(bytes freed when `root` goes: inodes whose every link is inside it, each once; the links
    inside it of inodes that have more, i.e. store contents)."""
    seen: Counter[Inode] = collections.Counter()
    sizes: dict[Inode, tuple[int, int]] = {}
    for top, _, files in os.walk(str(root)):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            seen[key] += 1
            sizes[key] = (st.st_size, st.st_nlink)
    freed = sum(size for key, (size, nlink) in sizes.items() if seen[key] >= nlink)
    shared = collections.Counter({k: n for k, n in seen.items() if n < sizes[k][1]})
    return freed, shared


def _prune_checkpoints(workdir: Path, gone: set[Path], dry: bool, tally: _Tally) -> None:
    """A job's own checkpoint folder on this host ([job] checkpoint_dir, relative: jobs/<job>/)
    lives as long as a run of the job is left here, which every later run resumes from; with
    the job's last run it goes. A folder named by an absolute path is the user's: never here."""
    host_dir = layout.host_dir(workdir)
    left = {c.get("job") for c in reservations.claims(workdir).values()}  # runs being pushed
    for run_dir in _dirs(host_dir / "runs"):
        if run_dir in gone:
            continue
        meta = layout.read_json(run_dir / "run.json")
        if not isinstance(meta, dict):
            return  # a run half-written (or unreadable): its job is not known, keep them all
        left.add(meta.get("job"))
    for folder in _dirs(host_dir / "jobs"):
        if folder.name in left or folder.name.startswith(GRAVE):
            continue
        freed, _ = _walk(folder)
        if not dry:  # aside where a killed prune's next run sweeps it (_sweep_graves)
            grave = host_dir / f"{GRAVE}job-{folder.name}-{os.urandom(4).hex()}"
            os.rename(str(folder), str(grave))
            shutil.rmtree(str(grave), ignore_errors=True)
        tally.checkpoints.append(folder.name)
        tally.bytes += freed


def _run_ids(workdir: Path, gone: set[Path]) -> set[str]:
    """The ids of the run directories of every host of the workdir but those in `gone` (a run
    on several hosts of a shared workdir has one directory, of one id, on each)."""
    runs = [run for host in _dirs(workdir / "hosts") for run in _dirs(host / "runs")]
    return {run.name for run in runs if run not in gone}


def _prune_envs(
    workdir: Path, users: set[str], now: float, grace: float, dry: bool, tally: _Tally
) -> None:
    envs = venvs.envs_dir(workdir)
    for venv in _dirs(envs):
        if venv.name.startswith(".") or ".lock" in venv.name:
            continue  # a build's work directory, a grave, a lock (held, or being removed)
        # Half-built (no marker) is a build under way or a killed one, which the next build of
        # that hash removes; a held lock is a builder or another prune: both are left alone.
        if not venvs.is_complete(venv) or (envs / f"{venv.name}.lock").exists():
            continue
        if _env_used(venv, users, now, grace):
            continue
        size = _walk(venv)[0]
        if not dry and not _remove_env(envs, venv, users, now, grace):
            continue
        tally.environments.append(venv.name)
        tally.bytes += size


def _env_used(venv: Path, users: set[str], now: float, grace: float) -> bool:
    try:
        uses = set(os.listdir(str(venv / venvs.USES)))
    except OSError:
        uses = set()
    last = venvs.last_used(venv) or _mtime(venv / venvs.COMPLETE) or now
    return bool(uses & users) or now - last < grace


def _remove_env(envs: Path, venv: Path, users: set[str], now: float, grace: float) -> bool:
    """Removes the venv under its lock, as a builder holds it; False if it became used.

    venvs.ensure records a use before it looks for the marker, without the lock: a use
    recorded before the rename below is seen after it (and the venv goes back in place); one
    after it finds no venv and builds it again under the lock."""
    lock = sharedlock.SharedLock(envs / f"{venv.name}.lock", hostid.identity())
    with lock.held():
        if not venvs.is_complete(venv) or _env_used(venv, users, time.time(), grace):
            return False
        grave = envs / f"{GRAVE}{venv.name}-{lock.token}"
        os.rename(str(venv), str(grave))
        if _env_used(grave, users, time.time(), grace):
            os.rename(str(grave), str(venv))
            return False
    shutil.rmtree(str(grave), ignore_errors=True)
    return True


def _prune_host_wheels(workdir: Path, dry: bool, tally: _Tally, unlinked: Counter[Inode]) -> None:
    """This host's wheel directory, uv cache and bytecode store (venvs.wheels_dir,
    venvs.uv_cache, bytecode.store_dir) go with the environments they served: they only speed
    up builds (a later build links its wheels again from the store, which its push refilled).
    The cache's bytes freed are those no venv links; the wheel directory's links are the
    store's, so its contents may go too. Left alone while any build holds an env lock."""
    here = hostid.identity()
    envs = venvs.envs_dir(workdir)
    if any(p.name.endswith(".lock") for p in _dirs(envs)):
        return
    for path in (
        venvs.uv_cache(workdir, here),
        venvs.wheels_dir(workdir, here),
        bytecode.store_dir(workdir, here),
    ):
        if not path.is_dir():
            continue
        freed, links = _walk(path)
        tally.bytes += freed
        unlinked.update(links)
        if not dry:
            grave = path.with_name(f"{GRAVE}{path.name}-{os.urandom(4).hex()}")
            os.rename(str(path), str(grave))
            shutil.rmtree(str(grave), ignore_errors=True)


def _store_entries(store: Path) -> dict[str, os.stat_result]:
    found = {}
    try:
        entries = list(os.scandir(str(store)))
    except OSError:
        return {}
    for entry in entries:
        if _BLOB.fullmatch(entry.name) or _PART.fullmatch(entry.name):
            with contextlib.suppress(OSError):
                found[entry.name] = entry.stat(follow_symlinks=False)
    return found


def _prune_store(
    store: Path,
    entries: dict[str, os.stat_result],
    unlinked: Counter[Inode],
    now: float,
    grace: float,
    dry: bool,
    tally: _Tally,
) -> None:
    """Contents no run directory links (once the pruned runs are gone), unchanged for the
    grace; and what killed writers left (`.part` files untouched for the grace)."""
    for name, st in sorted(entries.items()):
        part = name.startswith(".")
        if part:
            if now - st.st_mtime < grace:
                continue  # a writer may be filling it now
        elif st.st_nlink - unlinked[(st.st_dev, st.st_ino)] > 1 or now - st.st_ctime < grace:
            continue
        if not dry and not _unlink_unused(store / name, part):
            continue
        tally.contents += 0 if part else 1
        tally.bytes += st.st_size


def _unlink_unused(path: Path, part: bool) -> bool:
    """Unlinks a content only if nothing links it now (a materialize may have just done)."""
    try:
        if not part and os.lstat(str(path)).st_nlink > 1:
            return False
        os.unlink(str(path))
    except FileNotFoundError:
        return False
    return True


def _sweep_graves(host_dir: Path, envs: Path) -> None:
    """What a killed prune left renamed aside."""
    for parent in (host_dir, envs):
        for grave in _dirs(parent):
            if grave.name.startswith(GRAVE):
                shutil.rmtree(str(grave), ignore_errors=True)


def _dirs(path: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(str(path)) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _mtime(path: Path) -> Any:
    try:
        return os.stat(str(path)).st_mtime
    except OSError:
        return None
