"""TF ports held for a run from its preflight until it stops, so two `up` at once cannot both pass.

Preflight checks that each TF port can be bound, but nothing binds it until the task starts,
seconds later: two `up` of one inventory started together both saw free ports and one died on
bind. A hello carrying a run id therefore records the run's ports under
WORKDIR/hosts/<id>/ports (per host: a shared workdir must not mix hosts' ports), checked and
written under one flock, and a later hello of another run finds them busy. A reservation lives
while its run does: it ends when the run is stopped (stop marker, whole-run stop) and lapses
when neither the reservation nor the run's lease was renewed for `lease_seconds` (a crashed
controller). Only runs sharing this workdir see each other's reservations.

Once the run's tasks are started here (`release`, or `start` with `release`), a TF task still
binds its port seconds later, after `import tensorflow`. So a released reservation is handed
over instead of dropped: it lasts until its port is seen bound or no task of the run runs on
this host, whichever comes first. Whoever looks at it next decides (a later hello), so a
detached run, which no controller will release, needs nobody to end it; heartbeats no longer
matter to it (a detached run has none).
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from pathlib import Path
from typing import Any, Callable

import layout
import params
import procs
import protocol


def _ports_dir(workdir: Path) -> Path:
    """Per host: a workdir on a shared (NFS) home must not mix the hosts' ports."""
    return layout.host_dir(workdir) / "ports"


def reserve(
    workdir: Path,
    run_id: str,
    ports: list[int],
    lease_seconds: float | None,
    bindable: Callable[[int], bool],
    job: str | None = None,
    *,
    resuming: bool = False,
) -> tuple[list[int], dict[int, str]]:
    """(busy ports, {port: run id holding it}); reserves all of `ports` only when none is busy.
    A run stopped here (`down` while its `up` pushed) is refused: nothing of it starts; unless
    `resuming` (`up --resume`, resume.py), whose hello lifts the stop once this reserved. Under
    the same lock a resuming hello is refused while another `up` of the run holds its ports
    here (two `up --resume` of one run at once), and its records hold although the stop is
    still there (until its hello lifts it), so no other run's hello takes them meanwhile."""
    if not resuming and layout.run_stopped(layout.runs_dir(workdir) / run_id):
        raise layout.StoppedRun(run_id)
    directory = layout.make_private_dir(_ports_dir(workdir))
    lease = protocol.DEFAULT_RESERVATION_S if lease_seconds is None else float(lease_seconds)
    now = time.time()
    with layout.open_lock(directory / ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if resuming and any(
            _holder(workdir, directory / f"{port}.json", now, port, bindable) == run_id
            for port in ports
        ):
            raise params.AgentError(f"an `up` of run {run_id} is starting here already")
        held = {}
        for port in ports:
            path = directory / f"{port}.json"
            holder = _holder(workdir, path, now, port, bindable)
            if holder is None:
                path.unlink(missing_ok=True)  # ended or lapsed: leave nothing behind
            elif holder != run_id:
                held[port] = holder
        busy = [p for p in ports if p in held or not bindable(p)]
        if not busy:
            record = {"run_id": run_id, "reserved": now, "lease_seconds": lease, "job": job}
            if resuming:
                record["resuming"] = True  # it holds before its hello lifts the run's stop
            for port in ports:
                layout.write_json(directory / f"{port}.json", record)
    return busy, held


def _holder(
    workdir: Path, path: Path, now: float, port: int, bindable: Callable[[int], bool]
) -> str | None:
    """The run holding a reservation file, or None when there is none or it ended or lapsed."""
    record: Any = layout.read_json(path)
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        return None
    run_dir = layout.runs_dir(workdir) / record["run_id"]
    if layout.run_stopped(run_dir) and not record.get("resuming"):
        return None
    if record.get("until_bound"):
        # Handed over to the run's tasks: a bound port needs no reservation (the bind check
        # sees it busy), and one whose tasks all ended here has nobody left to bind it.
        return record["run_id"] if bindable(port) and _tasks_run(run_dir) else None
    beat = float(record.get("reserved") or 0)
    # Renewed by the run's heartbeats; before materialize only the reservation's own time counts.
    with contextlib.suppress(OSError):
        beat = max(beat, (run_dir / "lease").stat().st_mtime)
    return record["run_id"] if now - beat <= float(record.get("lease_seconds") or 0) else None


def reserving(workdir: Path, run_id: str) -> bool:
    """Whether an `up` holds a live reservation of `run_id` here that no task took over yet:
    between its hello and its start. A resumed run's folder is there all that while, its lease
    lapsed long ago until its push: prune spares it (prune.py)."""
    return run_id in reserving_runs(workdir)


def reserving_runs(workdir: Path) -> set[str]:
    """The runs whose `up` holds a live reservation here that no task took over yet (read
    once for a whole runs reply: a resumed run is starting again until its tasks start)."""
    directory, now = _ports_dir(workdir), time.time()
    found: set[str] = set()
    for path in directory.glob("*.json") if directory.is_dir() else []:
        record: Any = layout.read_json(path)
        if not isinstance(record, dict) or record.get("until_bound"):
            continue
        run_id = record.get("run_id")
        if isinstance(run_id, str) and _holder(workdir, path, now, 0, _never) == run_id:
            found.add(run_id)
    return found


def _never(port: int) -> bool:
    return False  # not asked: only a reservation handed to tasks is judged by its port


def claims(workdir: Path) -> dict[str, dict[str, Any]]:
    """The runs an `up` is preparing here that have no run folder yet (it is pushing their
    code): {run id: {"job", "reserved"}} of the live reservations not handed to tasks. From
    its preflight on, a run exists for `down`, `status` and `prune` (issue 47)."""
    directory = _ports_dir(workdir)
    if not directory.is_dir():
        return {}
    now, found = time.time(), {}
    for path in directory.glob("*.json"):
        record: Any = layout.read_json(path)
        if not isinstance(record, dict) or record.get("until_bound"):
            continue
        run_id = record.get("run_id")
        if not isinstance(run_id, str) or (layout.runs_dir(workdir) / run_id).exists():
            continue
        beat = record.get("reserved")
        lease = record.get("lease_seconds")
        if not isinstance(beat, (int, float)) or not isinstance(lease, (int, float)):
            continue
        if now - float(beat) <= float(lease):
            job = record.get("job")
            found[run_id] = {"job": job if isinstance(job, str) else None, "reserved": beat}
    return found


def state(workdir: Path, run_id: str) -> str:
    """Whether a run holding ports here is "running" (a task of it runs on this host) or
    "starting" (reserved by an `up` between its preflight and its start)."""
    return "running" if _tasks_run(layout.runs_dir(workdir) / run_id) else "starting"


def release(workdir: Path, run_id: str) -> int:
    """Drops every reservation of the run on this host; how many ports it held."""
    directory = _ports_dir(workdir)
    if not directory.is_dir():
        return 0
    released = 0
    with layout.open_lock(directory / ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for path in directory.glob("*.json"):
            record = layout.read_json(path)
            if isinstance(record, dict) and record.get("run_id") == run_id:
                path.unlink()
                released += 1
    return released


def hand_over(workdir: Path, run_id: str) -> int:
    """The run's tasks are started here: each of its reservations now lasts until its port is
    seen bound or no task of the run runs here (see the module's docstring); how many."""
    directory = _ports_dir(workdir)
    if not directory.is_dir():
        return 0
    handed = 0
    with layout.open_lock(directory / ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for path in directory.glob("*.json"):
            record = layout.read_json(path)
            if isinstance(record, dict) and record.get("run_id") == run_id:
                if _tasks_run(layout.runs_dir(workdir) / run_id):
                    with contextlib.suppress(OSError):  # a full disk: it lapses with its lease
                        layout.write_json(path, {**record, "until_bound": True})
                else:  # nothing started (check, a failed preflight), or all ended already
                    path.unlink()
                handed += 1
    return handed


def _tasks_run(run_dir: Path) -> bool:
    """A task of the run is running on this host (it, or its restart, may still bind)."""
    return any(
        procs.task_state(task_dir)[0] == protocol.STATE_RUNNING
        for task_dir in layout.task_dirs(run_dir)
    )
