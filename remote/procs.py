"""Process identity and task state: /proc start ticks, process-group signals, task status."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import layout
import protocol


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start_ticks) of a pid, or None when it does not exist.

    comm (field 2) may hold spaces and parentheses, so fields are counted after the LAST ')'.
    """
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[19])  # fields 3 (state) and 22 (starttime)
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    stat = proc_stat(pid)
    return None if stat is None else stat[1]


def environ(pid: int) -> dict[str, str] | None:
    """A process's environment as it was started (/proc/PID/environ); None when this host
    cannot read it (gone, another user's, another PID namespace's). What a task's children
    inherit whatever they do (a launcher, setsid), so it tells whose run a process is of."""
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    found: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            found.setdefault(key.decode(errors="replace"), value.decode(errors="replace"))
    return found


def process_alive(pid: Any, ticks: Any) -> bool:
    """True if pid is still the same live process (not recycled, not a zombie)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    stat = proc_stat(pid)
    return stat is not None and stat[1] == ticks and stat[0] not in {"Z", "X"}


def signal_process(pid: Any, ticks: Any, sig: int = signal.SIGTERM) -> bool:
    """Signal exactly the recorded process (not a recycled pid); False when it is gone."""
    if not process_alive(pid, ticks):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def signal_group(pgid: Any, ticks: Any, sig: int) -> bool:
    """Signal exactly the recorded group; False when it is gone.

    If the leader pid exists with other start ticks it was recycled, and a pid is only
    reused once no group carries it, so our group is gone. If the leader is gone but
    members remain, killpg still reaches them.
    """
    if not isinstance(pgid, int) or pgid <= 1:
        return False
    stat = proc_stat(pgid)
    if stat is not None and stat[1] != ticks:
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: Any, ticks: Any) -> bool:
    return signal_group(pgid, ticks, 0) and bool(live_members(pgid))


def live_members(pgid: int) -> list[int]:
    """Non-zombie processes of a group.

    killpg(pgid, 0) also succeeds for zombies, and orphaned zombies linger until init
    gets round to reaping them, which would make a dead group look alive.
    """
    return [pid for pid, state in _members(pgid) if state not in (b"Z", b"X")]


def frozen_members(pgid: Any) -> list[int]:
    """Members of a group stopped by a signal (SIGSTOP, SIGTSTP): alive but never progressing.

    A frozen peer hangs a ParameterServerStrategy chief silently; naming it in a stall report
    saves the user a search.
    """
    if not isinstance(pgid, int) or pgid <= 1:
        return []
    return [pid for pid, state in _members(pgid) if state in (b"T", b"t")]


def _members(pgid: int) -> list[tuple[int, bytes]]:
    """(pid, state letter) of every process in the group, read from /proc/PID/stat."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            data = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()  # after "(comm)", which may hold spaces
        if len(fields) > 2 and fields[2] == str(pgid).encode():
            members.append((int(entry.name), fields[0]))
    return members


def task_state(task_dir: Path) -> tuple[str, Any, Any]:
    """(state, pid.json, exit.json) of one task, following the state table of PROTOCOL.md."""
    ended = layout.read_json(task_dir / "exit.json")
    if ended is not None:
        return protocol.STATE_EXITED, layout.read_json(task_dir / "pid.json"), ended
    pids = layout.read_json(task_dir / "pid.json")
    if not isinstance(pids, dict):
        return protocol.STATE_STARTING, None, None
    supervisor = process_alive(pids.get("supervisor"), pids.get("supervisor_ticks"))
    if supervisor or group_alive(pids.get("pgid"), pids.get("start_ticks")):
        return protocol.STATE_RUNNING, pids, None
    # The supervisor may have written exit.json and quit between our two reads.
    ended = layout.read_json(task_dir / "exit.json")
    state = protocol.STATE_EXITED if ended is not None else protocol.STATE_LOST
    return state, pids, ended


def task_status(task_dir: Path) -> protocol.TaskStatusShape:
    spec = layout.read_json(task_dir / "spec.json")
    name = spec.get("name") if isinstance(spec, dict) else None
    state, pids, ended = task_state(task_dir)
    pids = pids if isinstance(pids, dict) else {}
    ended = ended if isinstance(ended, dict) else {}
    try:
        log_bytes = (task_dir / "output.log").stat().st_size
    except OSError:
        log_bytes = 0  # no log yet (a task just started): nothing logged, as its shape says
    restarts = spec.get("restarts") if isinstance(spec, dict) else 0
    frozen = state == protocol.STATE_RUNNING and bool(frozen_members(pids.get("pgid")))
    return {
        "name": name if isinstance(name, str) else task_dir.name,
        "state": state,
        "restarts": restarts if isinstance(restarts, int) else 0,
        "frozen": frozen,
        "pid": pids.get("pid"),
        "pgid": pids.get("pgid"),
        "started": pids.get("started"),
        "ended": ended.get("ended"),
        "exit_code": ended.get("code"),
        "signal": ended.get("signal"),
        "reason": ended.get("reason"),
        "notice": ended.get("notice"),  # a spot interruption notice that stopped it
        "disk_full": ended.get("disk_full"),  # the file system that was full when it ended
        "log_bytes": log_bytes,
    }


def run_statuses(run_dir: Path) -> list[protocol.TaskStatusShape]:
    return [task_status(d) for d in layout.task_dirs(run_dir)]


def exit_record(returncode: int | None, reason: str | None, ended: float) -> dict[str, Any]:
    """exit.json content; a negative returncode is death by that signal."""
    code = returncode if returncode is not None and returncode >= 0 else None
    sig = -returncode if returncode is not None and returncode < 0 else None
    if reason is None:
        reason = protocol.REASON_SIGNAL if sig is not None else protocol.REASON_EXITED
    return {"code": code, "signal": sig, "ended": ended, "reason": reason}


def stopped_record(sig: int) -> dict[str, Any]:
    """exit.json written by a stop when no supervisor is left to record the real status."""
    return {"code": None, "signal": sig, "ended": time.time(), "reason": protocol.REASON_STOPPED}


def reap_children() -> None:
    """Collects every child of this process that has ended, without waiting: a long-lived
    process (an agent session, a Slurm holder) leaves none of its supervisors or helpers as a
    zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
