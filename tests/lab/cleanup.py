"""Finding labs by their names: stale ones of crashed runs, and anything a stopped lab left."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from tests.lab import procs

LAB_ROOT = Path("/var/tmp")
DIR_PREFIX = "tfdeploy-lab-"
NETNS_PREFIX = "tfdeploy-lab-"
NETNS_DIR = Path("/run/netns")
# Every link of a lab is "tfl" + 4 hex digits of its id + a role: bridge b, private bridge p,
# bastion legs x/y, host veth hN. Matching the whole shape keeps us off anyone else's links.
LINK_RE = re.compile(r"^tfl([0-9a-f]{4})(?:b|p|x|y|h\d+)$")
NETNS_RE = re.compile(r"^tfdeploy-lab-([0-9a-f]{4})-\w+$")
LOCK_PATH = LAB_ROOT / "tfdeploy-lab.lock"
# A Slurm lab with proctrack/cgroup (tests/lab/slurm.py) gives each compute host its own cgroup
# v1 subtree, `<CGROUP_ROOT>/<controller>/tfdeploy-lab-<id>-<host>`, on this machine's hierarchies.
CGROUP_ROOT = Path("/sys/fs/cgroup")


def lab_dir(lab_id: str) -> Path:
    return LAB_ROOT / f"{DIR_PREFIX}{lab_id}"


def netns_names(lab_id: str | None = None) -> list[str]:
    try:
        names = sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = NETNS_RE.match(name)
        if m and (lab_id is None or m[1] == lab_id):
            found.append(name)
    return found


def link_names(lab_id: str | None = None) -> list[str]:
    found = []
    for name in sorted(os.listdir("/sys/class/net")):
        m = LINK_RE.match(name)
        if m and (lab_id is None or m[1] == lab_id):
            found.append(name)
    return found


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks: with the pid, it names a process uniquely."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def read_state(lab_id: str) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((lab_dir(lab_id) / "state.json").read_text())
        return state
    except (OSError, ValueError):
        return None


def is_alive(lab_id: str) -> bool:
    """A lab lives while its owner process runs; a CLI lab lives until `down` ends it."""
    state = read_state(lab_id)
    if state is None:
        # A lab being built has its directory a moment before its state file: spare young ones.
        try:
            return time.time() - lab_dir(lab_id).stat().st_mtime < 60
        except OSError:
            return False
    owner = state.get("owner")
    if owner is None:
        return True
    return bool(start_time(int(owner["pid"])) == owner["start"])


def kill_in_netns(names: list[str]) -> None:
    """SIGKILL every process inside these network namespaces, and wait until they are gone."""
    inodes = set()
    for n in names:
        with contextlib.suppress(OSError):
            inodes.add((NETNS_DIR / n).stat().st_ino)
    if not inodes:
        return
    deadline = time.monotonic() + 10
    while True:
        pids = [p for p in procs.all_pids() if procs.ns_inode(p, "net") in inodes]
        pids = [p for p in pids if p != os.getpid()]
        if not pids or time.monotonic() > deadline:
            return
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
            # Our own children must be reaped, or they stay as zombies in the namespace.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p, os.WNOHANG)
        time.sleep(0.02)


def kill_marked(mark: str) -> None:
    """SIGKILL processes whose command line names `mark` (loopback sshds of a dead lab)."""
    for pid in procs.all_pids():
        raw = procs.read_raw(pid)
        if raw is not None and mark in raw.cmdline and pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def ip_batch(lines: list[str], *, force: bool = False) -> subprocess.CompletedProcess[str]:
    """Many `ip` commands in one process: ~1 ms each instead of ~3 ms per fork."""
    argv = ["ip", *(["-force"] if force else []), "-batch", "-"]
    return subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True)


def destroy(lab_id: str, *, subnets: Sequence[str] = ()) -> None:
    """Remove every trace of lab `lab_id` by name; safe to run more than once."""
    names = netns_names(lab_id)
    kill_in_netns(names)
    kill_marked(str(lab_dir(lab_id)))
    links = link_names(lab_id)
    # Veths first (deleting one end removes both at once), then namespaces, then bridges.
    lines = [f"link del {link}" for link in links if link[7] in "hxy"]
    lines += [f"netns del {n}" for n in names]
    lines += [f"link del {link}" for link in links if link[7] in "bp"]
    lines += [f"route del unreachable {s}" for s in subnets]
    if lines:
        ip_batch(lines, force=True)
    # Deleting a namespace frees its veths asynchronously: wait, so a new lab never collides.
    deadline = time.monotonic() + 10
    while (link_names(lab_id) or netns_names(lab_id)) and time.monotonic() < deadline:
        time.sleep(0.02)
    remove_cgroups(lab_id)
    shutil.rmtree(lab_dir(lab_id), ignore_errors=True)


def cgroup_dirs(lab_id: str | None = None) -> list[Path]:
    """The cgroup v1 subtrees of a lab's Slurm hosts (`tfdeploy-lab-<id>-<host>` at the top of
    each hierarchy), of one lab or of every lab."""
    mark = f"{DIR_PREFIX}{lab_id}-" if lab_id is not None else DIR_PREFIX
    found = []
    with contextlib.suppress(OSError):
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            with contextlib.suppress(OSError):
                found += sorted(d for d in hierarchy.glob(f"{mark}*") if d.is_dir())
    return found


def thaw_cgroups(lab_id: str) -> None:
    """Thaw every freezer cgroup of the lab: a frozen process takes no SIGKILL until thawed."""
    for top in cgroup_dirs(lab_id):
        if top.parent.name == "freezer":
            for d in [top, *(d for d in top.rglob("*") if d.is_dir())]:
                with contextlib.suppress(OSError):
                    if (d / "freezer.state").read_text().strip() != "THAWED":
                        (d / "freezer.state").write_text("THAWED")


def remove_cgroups(lab_id: str) -> list[str]:
    """Remove a lab's cgroup subtrees, depth first (`rmdir`: a cgroup's files are not files);
    returns what could not be removed. A frozen freezer cgroup is thawed first: its killed
    processes only die once thawed. Runs after the lab's processes are gone."""
    thaw_cgroups(lab_id)
    failed = []
    for top in cgroup_dirs(lab_id):
        tree = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for d in [*tree, top]:
            for _ in range(100):  # a cgroup whose last task just exited may be busy a moment
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            else:
                failed.append(str(d))
    return failed


def all_ids() -> set[str]:
    ids = {m[1] for m in (NETNS_RE.match(n) for n in netns_names()) if m}
    ids |= {m[1] for m in (LINK_RE.match(n) for n in link_names()) if m}
    for d in cgroup_dirs():
        m = re.match(rf"^{DIR_PREFIX}([0-9a-f]{{4}})-", d.name)
        if m:
            ids.add(m[1])
    for d in LAB_ROOT.glob(f"{DIR_PREFIX}*"):
        suffix = d.name[len(DIR_PREFIX) :]
        if re.fullmatch(r"[0-9a-f]{4}", suffix):
            ids.add(suffix)
    return ids


def clean_stale() -> list[str]:
    """Destroy labs whose owner died (a crashed or killed test run); returns their ids.

    Labs of other live test runs and labs made with `python -m tests.lab up` are left alone.
    """
    cleaned = []
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a lab being built holds it until its state is saved
        for lab_id in sorted(all_ids()):
            if is_alive(lab_id):
                continue
            state = read_state(lab_id) or {}
            destroy(lab_id, subnets=state.get("unreachable", []))
            cleaned.append(lab_id)
    return cleaned


def residue(lab_id: str, *, ns_inodes: AbstractSet[int] = frozenset()) -> list[str]:
    """Everything of lab `lab_id` that still exists; [] once it is fully gone."""
    found = [f"network namespace {n}" for n in netns_names(lab_id)]
    found += [f"link {n}" for n in link_names(lab_id)]
    mark = f"{DIR_PREFIX}{lab_id}"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if mark in line:
            found.append(f"mount {line.split()[4]}")
    for pid in procs.all_pids():
        raw = procs.read_raw(pid)
        if raw is None:
            continue
        in_ns = any(procs.ns_inode(pid, k) in ns_inodes for k in ("pid", "mnt", "net"))
        if in_ns or mark in raw.cmdline:
            found.append(f"process {pid} (parent {raw.ppid}, state {raw.state}): {raw.cmdline}")
    if lab_dir(lab_id).exists():
        found.append(f"directory {lab_dir(lab_id)}")
    found += [f"cgroup {d}" for d in cgroup_dirs(lab_id)]
    return found


def new_lab_dir() -> tuple[str, Path]:
    """A fresh lab id and its directory under /var/tmp (which hosts share; /tmp they do not)."""
    taken = all_ids()
    for _ in range(100):
        lab_id = f"{random.randrange(0x10000):04x}"
        if lab_id in taken:
            continue
        path = lab_dir(lab_id)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return lab_id, path
    raise RuntimeError("could not find a free lab id")
