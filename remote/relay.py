"""A scheduler's warning signal, passed to the running tasks of one allocation on this node.

Slurm's `--signal=B:USR1@300` warns only the allocation's batch shell that the time limit is
near (without `B:` it signals every step, and the agent's own steps would die of a USR1). The
shell then runs this on every node as a step: `agent.py signal-tasks WORKDIR SIGNAL JOB_ID`.

What it signals is exactly what the runs recorded: each running task's process group, checked
by its leader's start ticks (procs.signal_group), in this workdir, and only tasks started inside
allocation JOB_ID (in_allocation). Each warned task's folder gets a `warned` marker first: its
supervisor records the end as `preempted` with a time-limit notice, so that a task that saves
its checkpoint and exits 0 is not taken for one that finished its work. Another job of the
same user on a shared node, or a process that merely carries a supervisor's name, is never
touched.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import layout
import procs
import protocol

JOB_ENV = "SLURM_JOB_ID"


def main(argv: list[str]) -> int:
    """signal-tasks WORKDIR SIGNAL JOB_ID; prints one line per task signalled. SIGNAL 0 signals
    nothing and lists the allocation's running tasks (a detached run's body asks whether any
    is left)."""
    if len(argv) != 3:
        sys.stderr.write("usage: agent.py signal-tasks WORKDIR SIGNAL JOB_ID\n")
        return 2
    workdir, name, job_id = argv[0], argv[1], argv[2]
    sig = signal_number(name)
    if sig is None:
        sys.stderr.write(f"signal-tasks: {name!r} is not a signal name\n")
        return 2
    for run_dir, task_dir, pids in running_tasks(Path(workdir).expanduser()):
        if not in_allocation(pids, job_id):
            continue
        if sig:  # before the signal: the task may save and exit at once
            warned = {"signal": signal.Signals(sig).name, "job": job_id, "at": time.time()}
            layout.write_json(task_dir / layout.WARNED, warned)
        if procs.signal_group(pids.get("pgid"), pids.get("start_ticks"), sig):
            said = signal.Signals(sig).name if sig else "running"
            print(f"{run_dir.name} {task_dir.name}: {said}")
    return 0


def signal_number(name: str) -> int | None:
    """USR1, SIGUSR1 or usr1 -> its number; "0" -> 0 (no signal: only whether tasks are left)."""
    if name == "0":
        return 0
    key = name.upper()
    key = key if key.startswith("SIG") else "SIG" + key
    found = getattr(signal.Signals, key, None) if key.isidentifier() else None
    return int(found) if isinstance(found, signal.Signals) else None


def running_tasks(workdir: Path) -> list[tuple[Path, Path, dict[str, Any]]]:
    """(run dir, task dir, pid.json) of every running task of this host in `workdir`."""
    try:
        runs = sorted(p for p in layout.runs_dir(workdir).iterdir() if p.is_dir())
    except OSError:
        return []
    found = []
    for run_dir in runs:
        if layout.run_stopped(run_dir):
            continue
        for task_dir in layout.task_dirs(run_dir):
            state, pids, _ = procs.task_state(task_dir)
            if state == protocol.STATE_RUNNING and isinstance(pids, dict):
                found.append((run_dir, task_dir, pids))
    return found


def in_allocation(pids: dict[str, Any], job_id: str) -> bool:
    """Whether a task was started inside allocation `job_id`: its supervisor's (or, the
    supervisor gone, its group leader's) SLURM_JOB_ID, which every process of a job step has;
    else its cgroup, where Slurm's cgroup plugins put every process of a job, including the
    SSH sessions pam_slurm_adopt adopts (they carry no SLURM_* variable)."""
    for pid in (pids.get("supervisor"), pids.get("pgid")):
        if isinstance(pid, int) and pid > 0:
            env = procs.environ(pid)
            if env is not None and JOB_ENV in env:
                return env[JOB_ENV] == job_id
            if re.search(rf"/job_{re.escape(job_id)}(/|$)", _cgroups(pid), re.MULTILINE):
                return True
    return False


def _cgroups(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text(errors="replace")
    except OSError:
        return ""
