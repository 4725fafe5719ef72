"""The local log archive: every task's output, kept on this machine as `up` streams it.

Logs live on the hosts, and hosts go away (terminated instances, a lab torn down, a crashed
disk). So `up` also writes each task's raw bytes to `<state>/runs/<run-id>/<role>-<index>.log`,
by the byte offsets the polls carry (a re-read or a reconnect never duplicates a byte), and
`tfdeploy logs RUN_ID` reads them back when the hosts cannot be asked. A file is bounded: past
`limit` bytes it is rotated once (`.log.1`), so a task keeps at most twice that here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from deployer.core.lines import LineAssembler
from deployer.results.state import state_dir

LIMIT_BYTES = 64 * 1024 * 1024
INDEX = "archive.json"


@dataclass
class _File:
    host: str
    base: int = 0  # host log offset of the first byte of the current .log


class LogArchive:
    """Writes one run's task logs; the index says each task's host and where its file starts."""

    def __init__(self, run_id: str, *, limit: int = LIMIT_BYTES) -> None:
        self.dir = run_dir(run_id)
        self.limit = limit
        self.files: dict[str, _File] = {}
        self.ended = False
        for name, entry in _tasks(self.dir).items():
            base = entry.get("base", 0)
            self.files[name] = _File(str(entry["host"]), base if isinstance(base, int) else 0)

    def write(self, task: str, host: str, offset: int, data: bytes) -> None:
        """`data` is the host log's bytes from `offset` on."""
        if not data:
            return
        entry = self.files.get(task)
        if entry is None:
            entry = self.files[task] = _File(host)
            self._save()
        path = self.dir / _file_name(task)
        if offset + len(data) - entry.base > self.limit and offset > entry.base:
            os.replace(path, path.with_suffix(".log.1"))  # the previous rotation is dropped
            entry.base = offset
            self._save()
        position = offset - entry.base
        if position < 0:  # already rotated past these bytes
            data, position = data[-position:], 0
        flags = os.O_WRONLY | os.O_CREAT
        fd = os.open(path, flags, 0o600)
        try:
            os.pwrite(fd, data, position)
        finally:
            os.close(fd)

    def size(self, task: str) -> int:
        """Host log offset up to which this archive holds the task's output."""
        entry = self.files.get(task)
        if entry is None:
            return 0
        try:
            return entry.base + (self.dir / _file_name(task)).stat().st_size
        except FileNotFoundError:
            return entry.base

    def end(self) -> None:
        """`up` saw the run to its end: the archive holds all there is, hosts need not be asked."""
        self.ended = True
        self._save()

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tasks = {n: {"host": f.host, "base": f.base} for n, f in self.files.items()}
        tmp = self.dir / f".{INDEX}.part"
        tmp.write_text(json.dumps({"tasks": tasks, "ended": self.ended}), encoding="utf-8")
        tmp.replace(self.dir / INDEX)


def run_dir(run_id: str) -> Path:
    return state_dir() / "runs" / run_id


def has_archive(run_id: str) -> bool:
    return (run_dir(run_id) / INDEX).is_file()


def archive_ended(run_id: str) -> bool:
    return bool(_read_index(run_dir(run_id)).get("ended"))


def read_lines(run_id: str, task: str | None = None) -> Iterator[tuple[str, str]]:
    """(label, line) for every archived line, task by task in the order they were archived."""
    directory = run_dir(run_id)
    for name, entry in _tasks(directory).items():
        if task is not None and name != task:
            continue
        assembler = LineAssembler()
        label = f"{name}@{entry['host']}"
        path = directory / _file_name(name)
        for part in (path.with_suffix(".log.1"), path):
            for line in _chunks(part, assembler):
                yield label, line
        for line in assembler.flush():
            yield label, line


def _chunks(path: Path, assembler: LineAssembler) -> Iterator[str]:
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                yield from assembler.feed(chunk)
    except FileNotFoundError:
        return


def _file_name(task: str) -> str:
    return task.replace(":", "-") + ".log"


def _tasks(directory: Path) -> dict[str, dict[str, object]]:
    tasks = _read_index(directory).get("tasks")
    return tasks if isinstance(tasks, dict) else {}


def _read_index(directory: Path) -> dict[str, object]:
    try:
        data = json.loads((directory / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
