"""What to fetch: each host's files listed once, where each lands, which copy of a content goes."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from deployer.core.digest import sha256_file
from deployer.core.errors import (
    HostError,
    HostsFailed,
)
from deployer.core.text import join_names, plural, task_order
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.replies import task_name_ok
from deployer.hosts.reply_types import Collected, RemoteFile
from remote import protocol

Wanted = tuple[Member, str, RemoteFile, Path]  # host, task, the file as listed, where it lands


def task_folder(name: str) -> str:
    """`worker-0` of `worker:0`. Task names come from hosts: checked at the edge
    (deployer/hosts/replies.py) and again here, so a name never climbs out of the run."""
    if not task_name_ok(name):
        raise ValueError(f"{name!r} is not a task name: no folder is named after it")
    return name.replace(":", "-")


def landing(base: Path, task: str, path: str) -> tuple[Path, Path]:
    """(folder, file) where a listed file lands: a task's own files in `<role>-<index>/`, the
    files absolute patterns named (listed with their leading /) in `<role>-<index>.abs/`, so
    the host's /etc/hostname and the task's etc/hostname never land on each other."""
    if path.startswith("/"):
        folder = base / f"{task_folder(task)}.abs"
        return folder, folder / path.lstrip("/")
    folder = base / task_folder(task)
    return folder, folder / path


def once_per_host(
    listed: dict[str, dict[str, Collected]],
) -> tuple[dict[str, dict[str, Collected]], list[str]]:
    """Each host's files listed once: the tasks of one host run in the run's one code directory
    on it (remote/layout.py, `task_cwd`), so a path two of them list is one file (an absolute
    path is the host's anyway). It lands in the folder of the first of them in task order
    (chief before worker, worker:0 before worker:1) and nowhere else; the notes say so, per host.
    """
    out: dict[str, dict[str, Collected]] = {}
    notes: list[str] = []
    for host, by_task in sorted(listed.items()):
        first_of: dict[str, str] = {}  # path -> the first task that listed it
        sharers: dict[str, set[str]] = {}  # a first task -> the later ones that listed its paths
        once: dict[str, set[str]] = {}  # a first task -> its paths the later ones listed too
        out[host] = {}
        for name in sorted(by_task, key=task_order):
            own = []
            for remote in by_task[name].files:
                first = first_of.setdefault(remote.path, name)
                if first == name:
                    own.append(remote)
                else:
                    sharers.setdefault(first, set()).add(name)
                    once.setdefault(first, set()).add(remote.path)
            out[host][name] = replace(by_task[name], files=tuple(own))
        for first, others in sharers.items():
            names = join_names([first, *sorted(others, key=task_order)])
            files = plural(len(once[first]), "file")
            notes.append(
                f"{names} share one directory on {host}: "
                f"{files} landed once, in {task_folder(first)}/"
            )
    return out, notes


def collect(
    fleet: Fleet,
    run_id: str,
    patterns: Sequence[str],
    tasks: Sequence[str] | None,
    members: Sequence[Member] | None,
    *,
    hashed: bool,
    hash_only: Mapping[str, Mapping[str, list[str]]] | None = None,
) -> dict[str, dict[str, Collected]]:
    """What each host lists (hashing, with `hash_only`, just the paths it names for the host's
    tasks). Ctrl-C drops the connections of the hosts still walking and hashing, which ends
    their agents (remote/caller.py)."""

    def one(m: Member) -> dict[str, Collected]:
        only = hash_only.get(m.name, {}) if hash_only is not None else None
        return m.agent.collect(run_id, patterns, tasks, hashed=hashed, hash_only=only)

    try:
        listed, failures = fleet.each_settled(one, members)
    except KeyboardInterrupt:
        fleet.interrupt()
        raise
    failures = [f for f in failures if f.code != protocol.FAIL_NO_RUN]  # a host it did not use
    if failures:
        raise HostsFailed(failures, what="listing the files to pull failed", outcome=None)
    return listed


def destinations(member: Member, name: str, collected: Collected, base: Path) -> list[Wanted]:
    out = []
    top = base.resolve()
    for remote in collected.files:
        folder, dest = landing(base, name, remote.path)
        dest = dest.resolve()
        # A host's path must not climb out of its task's folder, nor (links resolved) the run's.
        if not dest.is_relative_to(folder.resolve()) or not dest.is_relative_to(top):
            raise HostError(member.name, f"{name}: {remote.path!r} would land outside {folder}")
        out.append((member, name, remote, dest))
    return out


def already_has(dest: Path, sha256: str | None) -> bool:
    return sha256 is not None and dest.is_file() and sha256_file(dest) == sha256


def content_key(remote: RemoteFile, dest: Path) -> str:
    """The name its part file gets: the content's sha256, or, listed unhashed, one derived from
    where it lands (a resumed pull lists it hashed and renames that part: `adopt_part`)."""
    return remote.sha256 or "dest-" + hashlib.sha256(os.fsencode(dest)).hexdigest()[:40]


def one_source_per_content(
    missing: list[Wanted], key: Callable[[RemoteFile, Path], str]
) -> dict[str, Wanted]:
    """Each content once, from one of the hosts that have it: replicas' identical checkpoints
    are shared out, so every host sends a part at once instead of one host sending it all.
    A content only one host has goes to that host; the others go, largest first, to the host
    with the fewest bytes to send so far (the earliest in the listing on a tie)."""
    holders: dict[str, list[Wanted]] = {}
    for item in missing:
        holders.setdefault(key(item[2], item[3]), []).append(item)
    load = {item[0].name: 0 for item in missing}
    sources: dict[str, Wanted] = {}
    shared = sorted(holders.items(), key=lambda kv: (len(kv[1]) > 1, -kv[1][0][2].size))
    for content, items in shared:
        source = min(items, key=lambda item: load[item[0].name])  # min keeps the first on ties
        load[source[0].name] += source[2].size
        sources[content] = source
    return sources
