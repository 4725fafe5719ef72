"""`tfdeploy pull`: the push in reverse. Tasks' files come home, only the contents missing here.

Each host lists and hashes what the patterns name (remote/results.py). Here, a file already at
its destination with the same sha256 costs nothing; a content another task has too (a replica's
identical checkpoint) travels once and is copied locally; the rest is fetched in ranges into
`<dest>.<hash>.part`, which an interrupted pull resumes, checked against its hash, then renamed.
Files land in `DIR/<run-id>/<role>-<index>/<path>`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.config.model import Job
from deployer.core.errors import HostError, HostsFailed, TfdeployError, UsageError
from deployer.core.text import plural
from deployer.hosts.agent import Agent, Collected, RemoteFile
from deployer.hosts.fleet import Fleet, Member

NO_RUN = "there is no run"  # remote/layout.py's words for a host that does not hold the run


@dataclass(frozen=True)
class PullResult:
    files: int  # files the patterns named, over all tasks
    fetched_bytes: int  # content bytes that travelled
    fetched_files: int
    refused: tuple[str, ...]  # "worker:1@h2: ../x: ..." what the hosts would not give
    destination: Path

    def summary(self) -> str:
        news = (
            f"{self.fetched_bytes} bytes sent ({plural(self.fetched_files, 'file')}), the rest "
            "already here"
            if self.fetched_files
            else "0 bytes sent, every file was already here"
        )
        return f"pulled {plural(self.files, 'file')} into {self.destination}: {news}"


def artifacts_home(fleet: Fleet, job: Job, run_id: str, hosts: Iterable[str]) -> list[str]:
    """job.artifacts from `hosts`, once the tasks were stopped; the lines to show. A failure is
    one of those lines, never raised: it must not hide how the job itself ended."""
    members = [fleet.member(h) for h in sorted(hosts)]
    if not job.artifacts or not members:
        return []
    try:
        result = pull(fleet, run_id, job.artifacts, Path(job.artifacts_to), members=members)
    except TfdeployError as exc:
        return [f"artifacts were not pulled: {exc.message}"]
    refused = [f"artifact not pulled: {refusal}" for refusal in result.refused]
    return [*refused, f"artifacts: {result.summary()}"]


def task_folder(name: str) -> str:
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
    listed, failures = fleet.each_settled(
        lambda m: m.agent.collect(run_id, patterns, tasks), members
    )
    failures = [f for f in failures if NO_RUN not in f.cause]  # a host the run did not use
    if failures:
        raise HostsFailed(failures, what="listing the files to pull failed", outcome=None)
    base = to / run_id
    wanted: list[tuple[Member, str, RemoteFile, Path]] = []
    refused: list[str] = []
    for host, by_task in sorted(listed.items()):
        for name, collected in sorted(by_task.items()):
            refused += [f"{name}@{host}: {why}" for why in collected.refused]
            wanted += _destinations(fleet.member(host), name, collected, base)
    if not any(listed.values()):
        raise UsageError(
            f"no host of the inventory knows run {run_id}"
            + (f" or task {', '.join(tasks)}" if tasks else "")
        )
    missing = [w for w in wanted if not _has(w[3], w[2].sha256)]
    sources = _one_source_per_content(missing)
    fetched, sent = _fetch_all(fleet, run_id, patterns, sources)
    for sha, (_, _, remote, dest) in sources.items():
        os.replace(fetched[sha], dest)
        os.chmod(dest, remote.mode or 0o644)
    for _, _, remote, dest in missing:
        first = sources[remote.sha256][3]
        if dest != first:  # the same content for another task: copied here, not sent again
            tmp = dest.with_name(f".{dest.name}.copy")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(first, tmp)
            os.replace(tmp, dest)
            os.chmod(dest, remote.mode or 0o644)
    return PullResult(
        files=len(wanted),
        fetched_bytes=sent,
        fetched_files=len(sources),
        refused=tuple(refused),
        destination=base,
    )


def _destinations(
    member: Member, name: str, collected: Collected, base: Path
) -> list[tuple[Member, str, RemoteFile, Path]]:
    out = []
    for remote in collected.files:
        folder, dest = landing(base, name, remote.path)
        dest = dest.resolve()
        if not dest.is_relative_to(folder.resolve()):  # a host's path must not climb out here
            raise HostError(member.name, f"{name}: {remote.path!r} would land outside {folder}")
        out.append((member, name, remote, dest))
    return out


def _has(dest: Path, sha256: str) -> bool:
    return dest.is_file() and _sha256(dest) == sha256


def _one_source_per_content(
    missing: list[tuple[Member, str, RemoteFile, Path]],
) -> dict[str, tuple[Member, str, RemoteFile, Path]]:
    sources: dict[str, tuple[Member, str, RemoteFile, Path]] = {}
    for item in missing:
        sources.setdefault(item[2].sha256, item)
    return sources


def _fetch_all(
    fleet: Fleet,
    run_id: str,
    patterns: Sequence[str],
    sources: dict[str, tuple[Member, str, RemoteFile, Path]],
) -> tuple[dict[str, Path], int]:
    """Fetches each content once, hosts in parallel; returns where each content now is, and
    how many bytes travelled (a resumed content counts only its rest)."""
    by_host: dict[str, list[tuple[str, RemoteFile, Path]]] = {}
    for member, name, remote, dest in sources.values():
        by_host.setdefault(member.name, []).append((name, remote, dest))
    lock = threading.Lock()
    done: dict[str, Path] = {}
    sent = [0]

    def fetch_host(member: Member) -> None:
        with member.agent.dedicated() as agent:  # bulk bytes: a session of their own
            for name, remote, dest in by_host[member.name]:
                path, fetched = _fetch(agent, member.name, run_id, name, remote, patterns, dest)
                with lock:
                    done[remote.sha256] = path
                    sent[0] += fetched

    fleet.each(fetch_host, [fleet.member(h) for h in by_host], what="pulling files failed")
    return done, sent[0]


def _fetch(
    agent: Agent,
    host: str,
    run_id: str,
    name: str,
    remote: RemoteFile,
    patterns: Sequence[str],
    dest: Path,
) -> tuple[Path, int]:
    """One content into `<dest>.<hash>.part` (resumed where an earlier pull stopped), hashed as
    it arrives, checked; returns it and the bytes this call fetched."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f"{dest.name}.{remote.sha256[:12]}.part")
    offset = part.stat().st_size if part.exists() else 0
    if offset > remote.size:
        part.unlink()
        offset = 0
    hasher = _hasher(part, offset)
    with part.open("ab") as out:

        def sink(data: bytes) -> None:
            out.write(data)
            hasher.update(data)

        fetched = agent.fetch(run_id, name, remote.path, patterns, offset, sink)
    if offset + fetched != remote.size or hasher.hexdigest() != remote.sha256:
        part.unlink()
        raise HostError(host, f"{name}: {remote.path} changed while being pulled; pull again")
    return part, fetched


def _hasher(part: Path, size: int) -> Any:
    """sha256 over the first `size` bytes of `part`: what an earlier pull already fetched."""
    hasher = hashlib.sha256()
    if size:
        with part.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                hasher.update(chunk)
    return hasher


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
