"""Reading processes and listening TCP sockets from /proc without entering any namespace."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.lab.model import Proc

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


@dataclass(frozen=True)
class RawProc:
    """A process as the root namespace sees it, with its pid inside its own PID namespace."""

    pid: int  # pid in the root namespace
    inner_pid: int  # last entry of NSpid: the pid the process has in its innermost namespace
    ppid: int
    pgid: int
    uid: int
    state: str
    cmdline: str
    comm: str = ""


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def ns_inode(pid: int, kind: str) -> int | None:
    """Inode of a process's namespace of `kind` (pid, mnt, net, uts); None if it is gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def read_raw(pid: int) -> RawProc | None:
    """One process's facts, or None when it vanished while being read (a normal race)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    # The comm field may hold spaces and parentheses: everything after the last ')' is fixed.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2 :].split()
    cmdline = cmd.replace(b"\0", b" ").decode(errors="replace").strip() or f"[{comm}]"
    return RawProc(
        pid=pid,
        inner_pid=int(fields["NSpid"].split()[-1]),
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        uid=int(fields["Uid"].split()[0]),
        state=rest[0],
        cmdline=cmdline,
        comm=comm,
    )


def in_pidns(inode: int) -> list[RawProc]:
    """Every process whose PID namespace is `inode`."""
    found = []
    for pid in all_pids():
        if ns_inode(pid, "pid") == inode:
            raw = read_raw(pid)
            if raw is not None:
                found.append(raw)
    return found


def by_pidns(inodes: set[int]) -> dict[int, list[RawProc]]:
    """`in_pidns` for several namespaces in one pass over /proc: the leftover check of every
    host of a lab reads each process once, not once per host."""
    found: dict[int, list[RawProc]] = {inode: [] for inode in inodes}
    for pid in all_pids():
        inode = ns_inode(pid, "pid")
        if inode in found:
            raw = read_raw(pid)
            if raw is not None:
                found[inode].append(raw)
    return found


def descendants(root_pid: int, *, marked: bytes | None = None) -> list[RawProc]:
    """`root_pid` and all its descendants (loopback hosts have no namespace to scan).

    With `marked` ("NAME=value"), also every process whose environment holds it, and their
    descendants: what detached from `root_pid` but carries the host's mark (e.g. a daemon).
    """
    raws = [r for r in (read_raw(p) for p in all_pids()) if r is not None]
    children: dict[int, list[RawProc]] = {}
    for r in raws:
        children.setdefault(r.ppid, []).append(r)
    found = [r for r in raws if r.pid == root_pid or (marked and _has_env(r.pid, marked))]
    seen = {r.pid for r in found}
    todo = list(found)
    while todo:
        for child in children.get(todo.pop().pid, []):
            if child.pid not in seen:
                seen.add(child.pid)
                found.append(child)
                todo.append(child)
    return found


def _has_env(pid: int, assignment: bytes) -> bool:
    """Whether the process's environment holds `assignment` (unreadable ones: other users')."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return assignment in environ.split(b"\0")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def to_procs(raws: Iterable[RawProc], *, inner: bool) -> list[Proc]:
    """Turn raw processes into Procs; with `inner`, pids are translated to the host's own view."""
    raws = list(raws)
    if not inner:
        return sorted(
            (Proc(r.pid, r.ppid, r.pgid, _user(r.uid), r.cmdline, r.state, r.comm) for r in raws),
            key=lambda p: p.pid,
        )
    outer_to_inner = {r.pid: r.inner_pid for r in raws}
    # A parent or group leader outside the host (unshare, nsenter) shows as 0, as in a container.
    return sorted(
        (
            Proc(
                r.inner_pid,
                outer_to_inner.get(r.ppid, 0),
                outer_to_inner.get(r.pgid, 0),
                _user(r.uid),
                r.cmdline,
                r.state,
                r.comm,
            )
            for r in raws
        ),
        key=lambda p: p.pid,
    )


def listening(net_dir: str, address: str | None = None) -> set[int]:
    """TCP ports in LISTEN state from `net_dir`/tcp and tcp6 (e.g. /proc/PID/net).

    With `address` (dotted IPv4), only sockets bound to exactly that address count.
    """
    want = None
    if address is not None:
        want = "".join(f"{int(b):02X}" for b in reversed(address.split(".")))
    ports = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(net_dir, name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local_addr, local_port = cols[1].split(":")
            if cols[3] != _LISTEN:
                continue
            if want is not None and local_addr != want:
                continue
            ports.add(int(local_port, 16))
    return ports
