"""Each task's progress and resources, as the agent reads them for a poll or `status`.

A task writes its progress (one JSON object a line: `step`, and `total_steps`, `loss` or any
other numbers) to the file named by TFDEPLOY_METRICS in its own task directory, with
tfdeploy_metrics.py (beside this agent, put on the task's PYTHONPATH) or by hand. The agent
only reads: new lines from the offset the controller asks for (bounded, so a task that writes
megabytes of metrics cannot swell a poll), and the last line for `status`. What the lines say
is the task's word: the controller parses them at its reply edge as untrusted input.

CPU and RSS come from /proc, per process group (the task and everything it started that stayed
in its group), in one pass over /proc for every task of the reply: 64 tasks cost one scan, not
64.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import protocol

METRICS_FILE = "metrics.jsonl"
HELPER = "tfdeploy_metrics.py"
HELPER_DIR = "lib"  # in the task's directory: what the task's PYTHONPATH gets
PROFILER_STARTER = "tfdeploy_profiler.py"  # [job] profiler = true: lib/sitecustomize.py
MAX_LINE = 2048  # a longer line is skipped: no metrics record needs more
MAX_LINES = 256  # per task and reply
DEFAULT_BUDGET = 64 * 1024  # bytes of metric lines per reply, all tasks together
TAIL = 4096  # what `last` reads from the end of the file

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# pgid -> (CPU seconds, wall clock) of this agent's recent looks: a session agent answers every
# poll, so the CPU share is over the last CPU_WINDOW seconds; a first look averages since start.
_SEEN: dict[int, list[tuple[float, float]]] = {}
CPU_WINDOW = 2.0


def metrics_path(task_dir: Path) -> Path:
    return task_dir / METRICS_FILE


def task_env(task_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """TFDEPLOY_METRICS, and the helper's folder first on PYTHONPATH (copied into the task's
    directory, which a container task sees too: the workdir is mounted at its own path). With
    [job] profiler = true the profiler's starter goes there too, as the folder's
    sitecustomize.py (taskside/tfdeploy_profiler.py says why)."""
    lib = task_dir / HELPER_DIR
    _copy_helper(HELPER, lib / HELPER)
    if env.get(protocol.PROFILER_START_ENV) == protocol.PROFILER_BY_TFDEPLOY:
        _copy_helper(PROFILER_STARTER, lib / "sitecustomize.py")
    path = env.get("PYTHONPATH")
    return {
        **env,
        protocol.METRICS_ENV: str(metrics_path(task_dir)),
        "PYTHONPATH": str(lib) + (os.pathsep + path if path else ""),
    }


def _copy_helper(name: str, to: Path) -> None:
    here = Path(__file__).resolve().parent
    # Installed on a host, the helpers lie beside this file; in a checkout, in taskside/.
    source = here / name if (here / name).is_file() else here / "taskside" / name
    try:
        to.parent.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(str(source), str(to))
        os.chmod(str(to), 0o600)
    except OSError:
        pass  # no helper: the task can still write its metrics, or start its profiler, itself


def new_lines(task_dir: Path, offset: int, budget: int) -> tuple[int, list[str]]:
    """Whole lines after `offset`, at most `budget` bytes and MAX_LINES: (offset after them,
    the lines). A line without its newline yet waits for the next poll."""
    try:
        with open(str(metrics_path(task_dir)), "rb") as f:
            f.seek(offset)
            data = f.read(max(0, budget))
    except OSError:
        return offset, []
    end = data.rfind(b"\n")
    if end < 0:
        # A line longer than the budget: skipped whole, or it would block every later line.
        return (offset + len(data), []) if len(data) >= budget > MAX_LINE else (offset, [])
    lines: list[str] = []
    used = 0
    for raw in data[: end + 1].split(b"\n")[:-1]:
        if len(lines) >= MAX_LINES:
            break
        used += len(raw) + 1
        if 0 < len(raw) <= MAX_LINE:
            lines.append(raw.decode("utf-8", "replace"))
    return offset + used, lines


def last_lines(task_dir: Path, count: int = 8) -> list[str]:
    """The task's newest metrics records (raw, oldest first), for `status`: enough for a
    step rate as well as the last values."""
    try:
        with open(str(metrics_path(task_dir)), "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL))
            data = f.read(TAIL)
    except OSError:
        return []
    lines = [x for x in data.split(b"\n")[:-1] if 0 < len(x) <= MAX_LINE]
    return [x.decode("utf-8", "replace") for x in lines[-count:]]


def group_usage(pgids: list[int]) -> dict[int, tuple[float, int, int]]:
    """pgid -> (CPU seconds of its live members, their RSS in bytes, member count)."""
    wanted = {str(p).encode(): p for p in pgids}
    found: dict[int, tuple[float, int, int]] = {}
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(entry.path + "/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) < 22 or fields[2] not in wanted or fields[0] in (b"Z", b"X"):
            continue
        pgid = wanted[fields[2]]
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS
        rss = int(fields[21]) * _PAGE
        before = found.get(pgid, (0.0, 0, 0))
        found[pgid] = (before[0] + cpu, before[1] + rss, before[2] + 1)
    return found


def add_usage(statuses: list[protocol.TaskStatusShape]) -> None:
    """Each running task's `usage`: CPU percent (100 = one core busy) and RSS bytes."""
    running = [s for s in statuses if s.get("state") == protocol.STATE_RUNNING]
    pgids = [s["pgid"] for s in running if isinstance(s["pgid"], int) and s["pgid"] > 1]
    seen = group_usage(pgids)
    now = time.time()
    for status in running:
        pgid = status.get("pgid")
        if pgid not in seen:
            continue
        cpu_s, rss, count = seen[pgid]
        share = _cpu_share(pgid, cpu_s, now, status.get("started"))
        status["usage"] = {"cpu": round(share * 100, 1), "rss": rss, "procs": count}
    for gone in set(_SEEN) - set(seen):
        del _SEEN[gone]


def _cpu_share(pgid: int, cpu_s: float, now: float, started: Any) -> float:
    """Cores busy over the last CPU_WINDOW seconds or more (polls come every quarter second,
    and the kernel counts CPU in 10 ms ticks: a shorter window would read 0% or 40% at
    random), from this agent's earlier looks; on a first look, since the task started."""
    looks = _SEEN.setdefault(pgid, [])
    looks.append((cpu_s, now))
    while len(looks) > 1 and now - looks[1][1] >= CPU_WINDOW:
        looks.pop(0)  # keep the newest look that is at least CPU_WINDOW old, and the rest
    first_cpu, first_at = looks[0]
    if now - first_at >= 0.2:
        return max(0.0, (cpu_s - first_cpu) / (now - first_at))
    if isinstance(started, (int, float)) and now - started > 0:
        return max(0.0, cpu_s / (now - started))
    return 0.0


def add_last(run_dir: Path, statuses: list[protocol.TaskStatusShape]) -> None:
    """Each task's newest metrics lines as `last` (status, runs)."""
    import params

    for status in statuses:
        name = status.get("name")
        if not isinstance(name, str):
            continue
        try:
            lines = last_lines(run_dir / "tasks" / params.task_dirname(name))
        except params.AgentError:
            continue
        if lines:
            status["last"] = lines


def read_metrics(
    run_dir: Path, offsets: dict[str, Any], budget: int
) -> list[protocol.MetricLinesShape]:
    """New metric lines of each task named in `offsets`, fairly shared within `budget`."""
    import params

    out: list[protocol.MetricLinesShape] = []
    left = max(0, budget)
    names = list(offsets)
    for rank, name in enumerate(names):
        offset = offsets[name]
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise params.AgentError(f"the metrics offset of {name} must be a byte count")
        share = left // (len(names) - rank)
        task_dir = run_dir / "tasks" / params.task_dirname(name)
        at, lines = new_lines(task_dir, offset, share)
        left -= at - offset
        if at != offset or lines:
            out.append({"task": name, "offset": at, "lines": lines})
    return out
