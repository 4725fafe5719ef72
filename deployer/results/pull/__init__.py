"""`tfdeploy pull`: the push in reverse. Tasks' files come home, only the contents missing here.

Each host lists what the patterns name (remote/results.py). Into a folder that holds nothing of
the run yet, every file travels, and the host hashes it as it sends it (one read, not two). Into
one that does (an earlier or interrupted pull), or when two tasks list a file at the same path
with the same size (replicas' checkpoints), the hosts hash first: a file already at its
destination with the same sha256 costs nothing, and a content another task has too travels once
and is copied locally. What travels is fetched into
`DIR/<run-id>/.partial/<sha256>.part` (a short name, so a 250-character file name still fits the
file system's limit; mode 0600 from its first byte; named by its destination's hash until its
content's is known), which an interrupted pull resumes and another pull of the same content into
the same folder waits for (a lock), checked against the host's hash, then renamed into place
with the file's mode. Files land in `DIR/<run-id>/<role>-<index>/`
(what absolute patterns named in `<role>-<index>.abs/`). A problem on this machine (a full or
read-only disk, a file where a folder goes) is a LocalError naming the path, never blamed on a
host. Ctrl-C stops the transfers at once, keeping what arrived.

The package: `result` (what came), `plan` (what to fetch and where it lands), `localdisk`
(this machine's side), `parts` (resumable part files), `transfer` (the bulk fetch) and
`replicas` (copies of one content); this module runs them in order.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from deployer.config.model import Job
from deployer.core.errors import TfdeployError, UsageError
from deployer.hosts.fleet import Fleet, Member
from deployer.results.pull.localdisk import (
    KEPT,
    check_destination,
    copy_content,
    in_the_way,
    local_error,
    umask,
)
from deployer.results.pull.parts import PARTS, refusal
from deployer.results.pull.plan import (
    Wanted,
    already_has,
    collect,
    content_key,
    destinations,
    landing,
    once_per_host,
    one_source_per_content,
    task_folder,
)
from deployer.results.pull.replicas import Replicas, looks_replicated
from deployer.results.pull.result import PullResult
from deployer.results.pull.transfer import Fetch

__all__ = [
    "KEPT",
    "PullResult",
    "artifacts_home",
    "check_destination",
    "landing",
    "local_error",
    "pull",
    "resume_command",
    "task_folder",
]


def artifacts_home(fleet: Fleet, job: Job, run_id: str, hosts: Iterable[str]) -> list[str]:
    """job.artifacts from `hosts`, once the tasks were stopped; the lines to show. A failure is
    one of those lines, never raised: it must not hide how the job itself ended. Ctrl-C is
    raised (the caller says how to resume: `resume_command`)."""
    members = [fleet.member(h) for h in sorted(hosts)]
    if not job.artifacts or not members:
        return []
    try:
        result = pull(fleet, run_id, job.artifacts, Path(job.artifacts_to), members=members)
    except TfdeployError as exc:
        lines = [f"artifacts were not pulled: {exc.message}"]
        return lines + ([f"hint: {exc.hint}"] if exc.hint else [])
    refused = [f"artifact not pulled: {refusal}" for refusal in result.refused]
    return [*refused, f"artifacts: {result.summary()}"]


def resume_command(
    run_id: str,
    patterns: Sequence[str],
    to: str | Path,
    *,
    tasks: Sequence[str] | None = None,
    inventory: str | None = None,
) -> str:
    """The pull that fetches what an interrupted one left: the same patterns into the same
    folder (its `.partial/` holds what arrived)."""
    words = ["tfdeploy", "pull", run_id]
    words += ["-i", inventory] if inventory else []
    for task in tasks or ():
        words += ["--task", task]
    words += [*patterns, "--to", str(to)]
    return " ".join(shlex.quote(w) for w in words)


def pull(
    fleet: Fleet,
    run_id: str,
    patterns: Sequence[str],
    to: Path,
    *,
    tasks: Sequence[str] | None = None,
    members: Sequence[Member] | None = None,
) -> PullResult:
    """Pulls what `patterns` name of every task (or `tasks`) of the run, from every host (or
    `members`)."""
    check_destination(to)
    umask.cache_clear()  # read once a pull, here, before its threads
    base = to / run_id
    listed = collect(fleet, run_id, patterns, tasks, members, hashed=base.exists())
    if not any(listed.values()):
        raise UsageError(
            f"no host of the inventory knows run {run_id}"
            + (f" or task {', '.join(tasks)}" if tasks else "")
        )
    listed, shared = once_per_host(listed)
    wanted: list[Wanted] = []
    refused: list[str] = []
    unread = 0
    for host, by_task in sorted(listed.items()):
        for name, collected in sorted(by_task.items()):
            refused += [f"{name}@{host}: {why}" for why in collected.refused]
            unread += collected.unread
            wanted += destinations(fleet.member(host), name, collected, base)
    top = base.resolve()
    for _, _, _, dest in wanted:
        in_the_way(dest, top)
    missing = [w for w in wanted if not already_has(w[3], w[2].sha256)]  # all when unhashed
    # Listed unhashed, but likely copies of one content: each travels once, and the hosts
    # hash their other copies while it does (Replicas).
    likely_replicas = looks_replicated(listed)
    key = Replicas.key if likely_replicas else content_key
    sources = one_source_per_content(missing, key)
    replicas = Replicas(fleet, run_id, patterns, missing, sources) if likely_replicas else None
    fetch = Fetch(run_id, patterns, base / PARTS)
    sent = fetch.all(fleet, sources) if sources else 0
    copies = missing
    if replicas is not None:
        copies, again = replicas.sorted_out(missing, sources, fetch.landed)
        if again:  # copies that turned out to differ: each from its own host
            again_fetch = Fetch(run_id, patterns, base / PARTS)
            sent += again_fetch.all(fleet, one_source_per_content(again, content_key))
            fetch.fetched += again_fetch.fetched
            fetch.refused += again_fetch.refused
            fetch.not_kept |= again_fetch.not_kept
    refused += fetch.refused
    not_kept = len(fetch.not_kept)
    for member, name, remote, dest in copies:
        first = sources[key(remote, dest)][3]
        if dest == first:
            continue
        if first in fetch.not_kept:  # the same content changed while it came from elsewhere
            refused.append(refusal(member.name, name, remote.path))
            not_kept += 1
            continue
        copy_content(first, dest, remote.mode, base / PARTS)  # the same content: not sent again
    with contextlib.suppress(OSError):
        (base / PARTS).rmdir()  # empty once everything arrived
    return PullResult(
        files=len(wanted) - not_kept,
        not_kept=not_kept,
        unread=unread,
        fetched_bytes=sent,
        fetched_files=fetch.fetched,
        refused=tuple(refused),
        destination=base,
        patterns=tuple(patterns),
        places=tuple(f"{n}@{h}" for h, by_task in sorted(listed.items()) for n in sorted(by_task)),
        shared=tuple(shared),
    )
