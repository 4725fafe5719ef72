"""Preflight's disk check, again once the push's contents are known: a host must have room for
the wheels and image layers it will store, and for what they become there, before any byte of
them is sent (preflight's own check, at the hello, counts the code alone: the wheels are known
only after resolving, the layers after the image check).

Each host stores only its own: its environments' wheels, its image's layers (Manifest.needs).
What it lacks of them is what it will store: a host whose store was empty at the hello lacks
all; a host whose free disk could hold them all is not asked; any other host is asked which it
lacks (the `have` op, one round trip, as the push itself asks).
"""

from __future__ import annotations

from collections.abc import Sequence

from deployer.core.errors import HostError
from deployer.hosts.fleet import Fleet, Member
from deployer.push.sync import CodeFile
from deployer.up.preflight import MIN_FREE_DISK, Findings

# A content takes its own bytes in the store, then more once used: a wheel unpacked into a
# venv (TensorFlow's 363 MB of wheels: about 3x that installed), a layer loaded into the
# container runtime's store (uncompressed: about 2-3x).
USE_FACTOR = 4


def needed(code_bytes: int, lacking: Sequence[CodeFile]) -> int:
    """Bytes a host needs free: preflight's margin and code, and the contents it lacks."""
    return MIN_FREE_DISK + 2 * code_bytes + USE_FACTOR * sum(f.size for f in lacking)


def room_problems(fleet: Fleet, members: Sequence[Member], findings: Findings) -> list[HostError]:
    """Each host without room for the contents it will store; [] when all have it."""
    manifest = findings.manifest
    if not manifest.extras:
        return []
    code = manifest.total_bytes
    by_hash = manifest.by_hash()
    mine = {m.name: [by_hash[s] for s in manifest.extras_for([m.name])] for m in members}
    free = {m.name: findings.facts[m.name]["disk_free"] for m in members}
    tight = [m for m in members if free[m.name] < needed(code, mine[m.name])]
    empty = [m for m in tight if m.name in findings.empty_stores]
    asked = fleet.each(
        lambda m: m.agent.missing([f.sha256 for f in mine[m.name]]),
        [m for m in tight if m not in empty],
        what="asking the hosts' stores failed",
    )
    lacking = {m.name: mine[m.name] for m in empty}
    lacking |= {h: [f for f in mine[h] if f.sha256 in set(miss)] for h, miss in asked.items()}
    problems = []
    for host, lack in sorted(lacking.items()):
        need = needed(code, lack)
        if free[host] < need:
            workdir = findings.facts[host]["workdir"]
            problems.append(
                HostError(
                    host,
                    f"only {free[host] // 2**20} MiB free in {workdir}, need {need // 2**20} MiB "
                    f"for the job's wheels and image layers ({sum(f.size for f in lack) // 2**20} "
                    f"MiB to store, about {USE_FACTOR}x that once installed) and its code",
                    hint="free space there (`tfdeploy prune INVENTORY`), or set a workdir on a "
                    "larger disk",
                )
            )
    return problems
