"""A run's metrics series and its journal, kept beside its log archive on this machine
(`<state>/runs/<run-id>/`), so `tfdeploy runs` and `tfdeploy report` work after the hosts are
gone.

- `metrics/<role>-<index>.jsonl`: the task's records as the reply edge accepted them.
- `usage/<role>-<index>.jsonl`: `{"t", "cpu", "rss", "gpu_util", "gpu_mem"}` samples.
- `journal.jsonl`: what `up` said and when (`{"t", "kind": "step"|"phase", "text"}`): the
  report's timeline of up's phases.
- `facts.json`: the run's plan as `plan --json` gives it, written when `up` starts;
  `outcome.json`: how it ended, written when `up` (or `down`) ends.

Every write is a convenience: a full or read-only disk loses it, never the job (the caller's
guard says so once).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

MAX_READ_LINES = 200_000  # what a report reads of one series at most


def task_file(task: str) -> str:
    return task.replace(":", "-") + ".jsonl"


def append(directory: Path, kind: str, task: str, records: Iterable[Mapping[str, Any]]) -> None:
    folder = directory / kind
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # private, as the archive is
    folder.mkdir(exist_ok=True, mode=0o700)
    path = folder / task_file(task)
    if path.resolve().parent != folder.resolve():
        raise ValueError(f"{path} is not a file of {folder}")
    text = "".join(json.dumps(dict(r), separators=(",", ":")) + "\n" for r in records)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read(directory: Path, kind: str) -> dict[str, list[dict[str, Any]]]:
    """Every task's series of `kind` ("metrics", "usage"), by task name (role:index)."""
    folder = directory / kind
    found: dict[str, list[dict[str, Any]]] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("*.jsonl")):
        role, _, index = path.stem.rpartition("-")
        found[f"{role}:{index}"] = list(_records(path))
    return found


def _records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for count, line in enumerate(f):
            if count >= MAX_READ_LINES:
                return
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a full disk
            if isinstance(record, dict):
                yield record


def write_json(directory: Path, name: str, data: object) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = directory / f".{name}.part"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # facts name hosts, env
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1, default=str))
    tmp.replace(directory / name)


def read_json(directory: Path, name: str) -> Any:
    try:
        return json.loads((directory / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
