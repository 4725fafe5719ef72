"""A kept run's keeper and warden on this host, as the rest of the agent sees them: where each is
recorded, whether either still lives, and ending both (a whole-run stop).

The warden (warden.py) stops and starts the run's tasks for the keeper (taskops), while a
whole-run stop (taskops) ends the warden and the keeper first: what the stop needs is here, below
both, so neither imports the other's module for it; the runs op and a resume's checks read it
without the warden's own imports.
"""

from __future__ import annotations

from pathlib import Path

import daemon
import layout
import procs
import rejoin


def record_path(workdir: Path, run_id: str, kind: str) -> Path:
    """Where this host records the run's warden or keeper (a whole-run stop ends both)."""
    return layout.host_dir(workdir) / "keep" / f"{run_id}.{kind}.json"


def alive(workdir: Path, run_id: str) -> bool:
    """Whether the run's keeper or warden recorded here is still that live process."""
    for kind in ("keeper", "warden"):
        found = layout.read_json(record_path(workdir, run_id, kind))
        if isinstance(found, dict) and procs.process_alive(found.get("pid"), found.get("ticks")):
            return True
    return False


def stop_all(workdir: Path, run_id: str) -> None:
    """A whole-run stop ends the run's keeper and warden here first: no restart races it,
    and no requeue of its Slurm allocation starts them again (rejoin.py)."""
    for kind in ("keeper", "warden"):
        daemon.stop(record_path(workdir, run_id, kind))
    rejoin.forget(layout.host_dir(workdir) / "runs" / run_id)
