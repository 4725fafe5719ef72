"""Copies of one content (replicas' checkpoints): one travels, the hosts hash the rest meanwhile."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path

from deployer.core.digest import sha256_file
from deployer.hosts.fleet import Fleet
from deployer.hosts.reply_types import Collected, RemoteFile
from deployer.results.pull.plan import Wanted, already_has, collect


def looks_replicated(listed: dict[str, dict[str, Collected]]) -> bool:
    """Two tasks list a file at the same path with the same size, unhashed: replicas' identical
    checkpoints look like that, and their content should travel once, which takes hashes."""
    seen: set[tuple[str, int]] = set()
    for by_task in listed.values():
        for collected in by_task.values():
            for remote in collected.files:
                if remote.sha256 is None:
                    if (remote.path, remote.size) in seen:
                        return True
                    seen.add((remote.path, remote.size))
    return False


def arrived(dest: Path, sha256: str | None) -> bool:
    """The pull this one waited for put the content in place: checked by hash when listed
    hashed; listed unhashed, that pull fetched the same host's same file and checked it."""
    return dest.is_file() if sha256 is None else already_has(dest, sha256)


class Replicas:
    """Replicas' files, listed unhashed, checked while they travel instead of before.

    Tasks that list a file at one path with one size (replicas' identical checkpoints) likely
    hold one content: each such group is fetched once, from one of its hosts, while the hosts
    hash their other copies (a listing that hashes just those, on a thread of its own; what a
    host sends it hashes as it sends). Hashing first held the first byte back by a whole pass
    over the files on the hosts, and hashing every file read the sent ones twice. Once both
    are done, a copy whose hash is the fetched one is copied here, and one that differs is
    fetched from its own host."""

    def __init__(
        self,
        fleet: Fleet,
        run_id: str,
        patterns: Sequence[str],
        missing: list[Wanted],
        sources: dict[str, Wanted],
    ) -> None:
        self._listed: dict[str, dict[str, Collected]] = {}  # stays empty if the listing fails
        sent = {id(item) for item in sources.values()}
        copies: dict[str, dict[str, list[str]]] = {}  # host -> task -> the paths to hash
        for member, name, remote, _ in (item for item in missing if id(item) not in sent):
            copies.setdefault(member.name, {}).setdefault(name, []).append(remote.path)
        holders = [fleet.member(host) for host in copies]
        tasks = sorted({name for by_task in copies.values() for name in by_task})

        def hash_them() -> None:
            with contextlib.suppress(BaseException):  # no hashes: every copy is fetched
                self._listed = collect(
                    fleet, run_id, patterns, tasks, holders, hashed=True, hash_only=copies
                )

        self._thread: threading.Thread | None = None  # none when no host holds a copy
        if copies:
            self._thread = threading.Thread(target=hash_them, name="replica hashes", daemon=True)
            self._thread.start()

    @staticmethod
    def key(remote: RemoteFile, dest: Path) -> str:
        """One group per path and size, for the files listed unhashed."""
        if remote.sha256 is not None:
            return remote.sha256
        return f"{remote.size}:{remote.path}"

    def sorted_out(
        self, missing: list[Wanted], sources: dict[str, Wanted], landed: dict[Path, str]
    ) -> tuple[list[Wanted], list[Wanted]]:
        """(the files to copy from their group's fetched one, those to fetch themselves)."""
        if self._thread is not None:
            self._thread.join()
        hashes = {
            (host, task, remote.path): (remote.size, remote.sha256)
            for host, by_task in self._listed.items()
            for task, collected in by_task.items()
            for remote in collected.files
        }
        copies: list[Wanted] = []
        again: list[Wanted] = []
        contents: dict[Path, tuple[int, str]] = {}  # each group's fetched file: size, sha256
        for item in missing:
            source = sources[self.key(item[2], item[3])]
            dest = source[3]
            if dest not in contents:  # not in `landed`: another pull here brought it meanwhile
                sha256 = landed.get(dest) or (sha256_file(dest) if dest.is_file() else "")
                contents[dest] = (source[2].size, sha256)
            if (
                item is source
                or hashes.get((item[0].name, item[1], item[2].path)) == contents[dest]
            ):
                copies.append(item)
            else:
                again.append(item)
        return copies, again
