"""Processes of a run that left their task's process group (setsid/nohup sidecars), and their stop.

A task is stopped as its process group, but a child that calls setsid() leaves the group and
would outlive the run. Every task's environment carries TFDEPLOY_RUN_ID, and children inherit
it, so a whole-run stop looks for that exact entry in the environment of this user's processes.
It never touches a process of another user, another run (a run id that is a prefix of ours is
another run), another host (TFDEPLOY_HOST_ID, set by the supervisor, names a host other than
this one), a group still run by a supervisor, or the agent's own processes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import hostid
import layout
import procs
import protocol

POLL = 0.1
SLACK = 5.0  # after SIGKILL, how long a stray gets to vanish before the stop gives up on it
CMD_CHARS = 200


class Stray(NamedTuple):
    pid: int
    ticks: int
    cmd: str


def find(run_id: str, spare_pids: Iterable[int], spare_groups: Iterable[int]) -> list[Stray]:
    """Live processes of this uid whose environment holds TFDEPLOY_RUN_ID=<run_id> exactly."""
    needle = b"\0" + f"{protocol.RUN_ID_ENV}={run_id}".encode() + b"\0"
    other_host = _other_host(hostid.identity())
    spare, groups, uid = set(spare_pids), set(spare_groups), os.getuid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            environ = Path(entry.path, "environ").read_bytes()
            if needle not in b"\0" + environ:  # whole NUL-delimited entries, never a prefix
                continue
            if other_host(b"\0" + environ):
                continue  # the same run on another host that shares our processes' namespace
            stat = Path(entry.path, "stat").read_bytes()
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "(comm)", which may hold spaces
        if len(fields) < 20 or fields[0] in (b"Z", b"X") or int(fields[2]) in groups:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if not _is_agent(words):
            found.append(Stray(int(entry.name), int(fields[19]), " ".join(words)[:CMD_CHARS]))
    return found


def _other_host(me: str) -> Callable[[bytes], bool]:
    """Whether an environment names another host (one without the variable counts as ours)."""
    key = b"\0" + protocol.HOST_ID_ENV.encode() + b"="
    ours = key + me.encode() + b"\0"

    def other(environ: bytes) -> bool:
        return key in environ and ours not in environ + b"\0"

    return other


def _is_agent(argv: list[str]) -> bool:
    """The agent itself (serve, one-shot, the bootstrap, and the supervisors forked from them,
    which keep its command line) may carry the variable too."""
    if "-c" in argv[1:3]:  # the bootstrap: PYTHON -S -c "...import agent...serve..."
        return any("import agent" in arg for arg in argv)
    script = str(layout.AGENT_DIR / "agent.py")
    return any(a.endswith("/agent.py") and os.path.realpath(a) == script for a in argv[1:3])


def ancestors() -> set[int]:
    """This process and its parents: the session serving this request must survive the stop."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
            pid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def stop(
    run_id: str, grace: float, spare_pids: Iterable[int], spare_groups: Iterable[int]
) -> list[protocol.EscapedShape]:
    """SIGTERM every stray, SIGKILL those left after grace; rescans, so late forks are caught.

    Returns [{"pid", "cmd", "signal"}] for the reply (signal: the last one sent).
    """
    spare, groups = set(spare_pids) | ancestors(), set(spare_groups)
    seen: dict[int, protocol.EscapedShape] = {}
    kill_at = time.time() + grace
    while True:
        now = time.time()
        strays = find(run_id, spare, groups)
        for stray in strays:
            record = seen.setdefault(
                stray.pid, {"pid": stray.pid, "cmd": stray.cmd, "signal": None}
            )
            wanted = signal.SIGKILL if now >= kill_at else signal.SIGTERM
            if record["signal"] != wanted and _signal(stray, wanted):
                record["signal"] = int(wanted)
        if not strays or now > kill_at + SLACK:
            return sorted(seen.values(), key=lambda r: r["pid"])
        time.sleep(POLL)


def _signal(stray: Stray, sig: int) -> bool:
    if not procs.process_alive(stray.pid, stray.ticks):  # never a recycled pid
        return False
    try:
        os.kill(stray.pid, sig)
    except OSError:
        return False
    return True


def run_groups(run_dir: Path) -> tuple[set[int], set[int]]:
    """(supervisor pids, task groups still running) of a run: theirs to stop, not ours."""
    supervisors, groups = set(), set()
    for task_dir in layout.task_dirs(run_dir):
        state, pids, _ = procs.task_state(task_dir)
        if isinstance(pids, dict):
            if isinstance(pids.get("supervisor"), int):
                supervisors.add(pids["supervisor"])
            if state == protocol.STATE_RUNNING and isinstance(pids.get("pgid"), int):
                groups.add(pids["pgid"])
    return supervisors, groups
