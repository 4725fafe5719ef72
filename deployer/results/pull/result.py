"""What a pull brought home: counts, refusals and the summary line a person reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deployer.core.text import plural


@dataclass(frozen=True)
class PullResult:
    files: int  # files the patterns named, over all tasks
    fetched_bytes: int  # content bytes that travelled
    fetched_files: int
    refused: tuple[str, ...]  # "worker:1@h2: ../x: ..." what the hosts would not give
    destination: Path
    patterns: tuple[str, ...] = ()
    places: tuple[str, ...] = ()  # "worker:0@h1": the tasks that were asked
    # Files listed to come that did not (they changed while sent; in `refused` too): a pull
    # again may get them. A pattern or link the host refused is not counted: it never comes.
    not_kept: int = 0
    # Files and folders the hosts found and could not read (a path past PATH_MAX): never came.
    unread: int = 0
    # "worker:0 and worker:1 of h1 share ...": tasks of one host whose files landed once.
    shared: tuple[str, ...] = ()

    def summary(self) -> str:
        if not self.files and not self.unread:
            return self.nothing_matched()
        news = f"{self.fetched_bytes} bytes sent ({plural(self.fetched_files, 'file')})"
        if not self.fetched_files:
            news = "0 bytes sent, every file was already here"
        elif self.fetched_files < self.files:  # a file was here, or a content came for two
            news += ", the rest already here"
        shared = "".join(f"; {note}" for note in self.shared)
        if self.unread:  # each is named in a `not pulled:` line above
            shared += f"; {plural(self.unread, 'file or folder', 'files or folders')} the hosts "
            shared += "could not read did not come (named above)"
        return f"pulled {plural(self.files, 'file')} into {self.destination}: {news}{shared}"

    def nothing_matched(self) -> str:
        where = ", ".join(self.places) or "any task"
        return f"no file matched {', '.join(self.patterns)} on {where}; nothing was pulled"
