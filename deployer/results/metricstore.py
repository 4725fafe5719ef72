"""A run's series, bounded on disk and read back defensively: each task's metrics records and
resource samples, and up's journal. Where each series lives in the run's folder (`metrics/`,
`usage/`, `journal`) is the run store's to say (results/runstore.py, which every reader and
writer asks); this module is how one series is kept: its files, their bounds, their reading.

- metrics: the task's records as the reply edge accepted them.
- usage: `{"t", "cpu", "rss", "gpu_util", "gpu_mem"}` samples.
- journal: what `up` said and when (`{"t", "kind": "step"|"phase", "text"}`): the report's
  timeline of up's phases.

**Bounded, like the log archive beside it** (archive.py): a task writes what it likes to its
metrics file, as fast as it likes (two flooding tasks were 25 MB a minute here). Each series
is two files: `<name>.jsonl`, its latest records whole (at most TAIL_BYTES), and
`<name>.history.jsonl`, every `stride`-th record of all those before (at most HISTORY_BYTES:
when it would grow past that, every other line goes and the stride doubles), so the history is
an even sample of the whole run from its first record on, and the tail its last records as
written. `<name>.index.json` keeps the stride, the records folded into the history so far, and
the lines the edge dropped (`dropped`: what the task wrote that was no record). A series thus
never holds more than HISTORY_BYTES + TAIL_BYTES on disk, whatever a task writes.

**Read defensively**: the files are this machine's, but a full disk cuts a line, and a person
or a script may edit them. Every line is decoded with a bounded depth
(deployer/core/boundedjson.py) and checked as its kind's record (a metrics record by the edge's
own rule, replies.metric_fields); a line that is none is skipped and named (`Series.damage`).
A reader gets at most `points` records of a series, evenly spread over the run (its first and
last always), in memory bounded by `points` whatever the files hold; `last` reads a series'
last record from the end of its file. `read_bounded` is the one reader of a whole JSON
document (a series' index here, the run's documents in the run store).

Every write is a convenience: a full or read-only disk loses it, never the job (the caller's
guard says so once).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.core import boundedjson
from deployer.hosts.replies import METRIC_ABS, metric_fields

TAIL_BYTES = 256 * 1024  # a series' latest records, whole
HISTORY_BYTES = 1024 * 1024  # an even sample of the rest
LINE_BYTES = 16 * 1024  # a stored line longer than this is damage (a record is under 2 kB)
POINTS = 1000  # what a reader gets of one series at most (a chart is 510 px wide)
BACK_BYTES = 64 * 1024  # `last` reads this much from a file's end at a time
BACK_TRIES = 16  # and gives up after this many windows of damaged lines
NAMED = 8  # damaged lines named per series, past that only counted
_TASK_FILE = re.compile(r"([a-z]+)-(0|[1-9][0-9]{0,8})\.(?:jsonl|history\.jsonl|index\.json)")
TIMES = (0.0, 1e11)  # a time this machine can print (seconds since 1970)

Check = Callable[[object], dict[str, Any] | str]  # a record, or why the line is none


@dataclass(frozen=True)
class Kind:
    """A kind of series: the folder of the run's folder its files are in ("" for the run's own
    folder) and the rule its lines must meet (metric_record, usage_sample, journal_entry)."""

    folder: str
    check: Check

    def prefix(self) -> str:
        """What a damaged line's name starts with: the folder, as `runs` and `report` say it."""
        return f"{self.folder}/" if self.folder else ""


@dataclass(frozen=True)
class _Files:
    """One series' files: its tail, its history, its index."""

    folder: Path
    base: str

    @property
    def tail(self) -> Path:
        return self.folder / f"{self.base}.jsonl"

    @property
    def history(self) -> Path:
        return self.folder / f"{self.base}.history.jsonl"

    @property
    def index(self) -> Path:
        return self.folder / f"{self.base}.index.json"


def _files(directory: Path, kind: Kind, task: str) -> _Files:
    """The series' files, checked right before they are written: the name is a task's (it
    came from a host) and they are files of the series' folder, links resolved."""
    folder = directory / kind.folder
    files = _Files(folder, task.replace(":", "-"))
    # One name for the three files: the tail's check is theirs; a link in a file's place is
    # never written through (_append, _replace).
    if files.tail.resolve().parent != folder.resolve():
        raise ValueError(f"{files.tail} is not a file of {folder}")
    return files


@dataclass(frozen=True)
class _Index:
    stride: int = 1  # the history holds every stride-th record of those folded into it
    folded: int = 0  # records moved out of the tail so far
    dropped: int = 0  # lines of the task's the edge dropped

    @classmethod
    def of(cls, files: _Files) -> _Index:
        data = read_bounded(files.index, 4096)
        data = data if isinstance(data, dict) else {}
        return cls(_count(data, "stride", 1), _count(data, "folded", 0), _count(data, "dropped", 0))

    def save(self, files: _Files) -> None:
        data = {"stride": self.stride, "folded": self.folded, "dropped": self.dropped}
        _replace(files.index, [json.dumps(data).encode()])


def _count(data: Mapping[str, object], key: str, least: int) -> int:
    """A count of the index, or `least` where it is damaged (the sample is then less even)."""
    value = data.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and least <= value < 2**62:
        return value
    return least


def append(
    directory: Path,
    kind: Kind,
    task: str,
    records: Iterable[Mapping[str, Any]],
    dropped: int = 0,
) -> None:
    """The records at the end of the task's series of `kind` (`task`: the series' name), the
    tail folded into the history first when they would not fit; `dropped`: lines of the task's
    the edge dropped, counted."""
    text = b"".join(_line(r) for r in records)
    if not text and not dropped:
        return
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # private, as the archive is
    (directory / kind.folder).mkdir(exist_ok=True, mode=0o700)
    files = _files(directory, kind, task)
    if text and _size(files.tail) + len(text) > TAIL_BYTES:
        _fold(files, text)
    elif text:
        _append(files.tail, text)
    if dropped:
        index = _Index.of(files)
        _Index(index.stride, index.folded, index.dropped + dropped).save(files)


def _line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(dict(record), separators=(",", ":")) + "\n").encode()


def _fold(files: _Files, text: bytes) -> None:
    """The tail and `text`: the newest half a tail's worth stays the tail, every stride-th of
    the rest joins the history, whose every other line goes while it is over its bound."""
    lines = _lines_of(files.tail) + text.splitlines(keepends=True)
    keep, size = len(lines), 0
    while keep > 1 and size + len(lines[keep - 1]) <= TAIL_BYTES // 2:
        keep -= 1
        size += len(lines[keep])
    older, newer = lines[:keep], lines[keep:]
    index = _Index.of(files)
    moved = [line for i, line in enumerate(older) if (index.folded + i) % index.stride == 0]
    stride = index.stride
    if _size(files.history) + sum(map(len, moved)) > HISTORY_BYTES:
        history = _lines_of(files.history) + moved
        while len(history) > 1 and sum(map(len, history)) > HISTORY_BYTES:
            history, stride = history[::2], stride * 2  # line i is record i x stride
        _replace(files.history, history)
    elif moved:
        _append(files.history, b"".join(moved))
    _Index(stride, index.folded + len(older), index.dropped).save(files)
    _replace(files.tail, newer)


def _lines_of(path: Path) -> list[bytes]:
    """A file's lines, each ending with a newline (a line a full disk cut gets one)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return [line if line.endswith(b"\n") else line + b"\n" for line in data.splitlines(True)]


def _append(path: Path, data: bytes) -> None:
    """`data` at the end of the file; never through a link put in the file's place."""
    _write(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600), data)


def _replace(path: Path, lines: list[bytes]) -> None:
    """The file's whole new content, written beside it and moved over it (a reader sees the
    old file or the new one); the part file is made afresh, never opened through a link."""
    tmp = path.with_name(f".{path.name}.part")
    tmp.unlink(missing_ok=True)
    _write(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), b"".join(lines))
    tmp.replace(path)


def _write(fd: int, data: bytes) -> None:
    """All of `data` to `fd`, then closed (a disk filling up takes part of a write, then fails
    the next: OSError, which the caller's guard says once)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# Reading.


@dataclass(frozen=True)
class Series:
    """What a reader gets of one series: `records` (at most the `points` asked, evenly spread,
    first and last kept), the damaged lines met (`damaged`, the first NAMED named in `damage`:
    `metrics/worker-0.jsonl line 3: ...`) and the lines the edge dropped."""

    records: tuple[dict[str, Any], ...] = ()
    damaged: int = 0
    damage: tuple[str, ...] = ()
    dropped: int = 0


def tasks(directory: Path, kind: Kind) -> list[str]:
    """The tasks (role:index) with a series of `kind`, in name order; files named otherwise
    (by hand, or damaged) are no task's."""
    folder = directory / kind.folder
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    found = (_TASK_FILE.fullmatch(name) for name in names)
    return sorted({f"{m.group(1)}:{m.group(2)}" for m in found if m})


def series(directory: Path, kind: Kind, task: str, points: int = POINTS) -> Series:
    """The task's series of `kind`, at most `points` records (see Series)."""
    files = _Files(directory / kind.folder, task.replace(":", "-"))
    index = _Index.of(files)
    sample = _Sample(points, kind.check, kind.prefix())
    for n, line, where in _numbered(files, index):
        sample.add(n, line, where)
    return sample.result(index.dropped)


def read(directory: Path, kind: Kind, points: int = POINTS) -> dict[str, Series]:
    """Every task's series of `kind`, by task name."""
    return {task: series(directory, kind, task, points) for task in tasks(directory, kind)}


def each(directory: Path, kind: Kind, task: str) -> Iterator[dict[str, Any]]:
    """Every good record of the task's series of `kind`, in order (the history's even sample,
    then the tail), one at a time: for a reader that keeps less than the records (the report's
    charts keep each bucket's extremes), in the memory of one line. Damaged lines are skipped
    here; `series` counts and names them."""
    files = _Files(directory / kind.folder, task.replace(":", "-"))
    for _, line, _ in _numbered(files, _Index.of(files)):
        found = decode(line, kind.check)
        if not isinstance(found, str):
            yield found


def _numbered(files: _Files, index: _Index) -> Iterator[tuple[int, bytes, tuple[str, int]]]:
    """(record number, line, (file, line number)) of the history, then the tail: a history line
    i stands for record i x stride, the tail's line j for record folded + j."""
    for i, line in enumerate(_stream(files.history)):
        yield i * index.stride, line, (files.history.name, i + 1)
    start = max(index.folded, 0)
    for j, line in enumerate(_stream(files.tail)):
        yield start + j, line, (files.tail.name, j + 1)


def _stream(path: Path) -> Iterator[bytes]:
    """A file's lines, a line at a time (a line longer than LINE_BYTES comes cut: damage)."""
    try:
        with path.open("rb") as f:
            while line := f.readline(LINE_BYTES + 1):
                yield line
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return


class _Sample:
    """An even sample of a stream of numbered lines in memory bounded by `points`: the lines
    whose number is a multiple of `stride` are decoded and kept; past `points` kept, every
    other goes and the stride doubles. The last good line is always kept too."""

    def __init__(self, points: int, check: Check, prefix: str) -> None:
        self.points, self.check, self.prefix = max(2, points), check, prefix
        self.stride = 1
        self.kept: list[tuple[int, dict[str, Any]]] = []
        self.newest: tuple[int, dict[str, Any]] | None = None  # the last line decoded, good
        self.pending: tuple[bytes, tuple[str, int]] | None = None  # a line after it, unread
        self.damaged = 0
        self.damage: list[str] = []

    def add(self, n: int, line: bytes, where: tuple[str, int]) -> None:
        if n % self.stride:
            self.pending = (line, where)
            return
        self.pending = None
        record = self._record(line, where)
        if record is None:
            return
        self.newest = (n, record)
        self.kept.append(self.newest)
        if len(self.kept) > self.points:
            self.stride *= 2
            self.kept = [(m, r) for m, r in self.kept if m % self.stride == 0]

    def _record(self, line: bytes, where: tuple[str, int]) -> dict[str, Any] | None:
        found = decode(line, self.check)
        if isinstance(found, str):
            self.damaged += 1
            if len(self.damage) < NAMED:
                self.damage.append(f"{self.prefix}{where[0]} line {where[1]}: {found}")
            return None
        return found

    def result(self, dropped: int) -> Series:
        """The sample, and the last record (the last line, else the last good one decoded)."""
        records = [r for _, r in self.kept]
        last = self._record(*self.pending) if self.pending is not None else None
        if last is not None:
            records.append(last)
        elif self.newest is not None and (not self.kept or self.kept[-1] is not self.newest):
            records.append(self.newest[1])
        return Series(tuple(records), self.damaged, tuple(self.damage), dropped)


def decode(line: bytes, check: Check) -> dict[str, Any] | str:
    """One stored line as its kind's record, or why it is none, in words."""
    if len(line) > LINE_BYTES:
        return f"longer than {LINE_BYTES} bytes"
    try:
        raw = boundedjson.loads(line.decode("utf-8", errors="replace"))
    except boundedjson.TooDeep as exc:
        return str(exc)
    except ValueError:
        return "not JSON (a line a full disk cut?)"
    return check(raw)


def last(directory: Path, kind: Kind, task: str) -> Series:
    """The last good record of the task's series (`records`: it alone, or none), read from
    the end of its files (the tail, else the history), and the damaged lines met on the way:
    a run of 200k records costs what its last lines cost."""
    files = _Files(directory / kind.folder, task.replace(":", "-"))
    damage: list[str] = []
    for path in (files.tail, files.history):
        found = _last_in(path, kind.check, damage, kind.prefix())
        if found is not None:
            return Series((found,), len(damage), tuple(damage[:NAMED]))
    return Series((), len(damage), tuple(damage[:NAMED]))


def _last_in(path: Path, check: Check, damage: list[str], prefix: str) -> dict[str, Any] | None:
    """The file's last line that is a record, read back a window at a time (BACK_TRIES at
    most); the damaged lines after it are named in `damage` (counted from the end)."""
    try:
        f = path.open("rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    with f:
        end, rest, back = f.seek(0, os.SEEK_END), b"", 0
        for _ in range(BACK_TRIES):
            if end <= 0:
                break
            start = max(0, end - BACK_BYTES)
            f.seek(start)
            lines = (f.read(end - start) + rest).split(b"\n")
            rest = lines.pop(0) if start > 0 else b""  # a line begun before this window
            if len(rest) > LINE_BYTES:
                rest = b""  # damage, skipped as a line would be
            for line in reversed(lines):
                if not line.strip():
                    continue
                back += 1
                found = decode(line, check)
                if not isinstance(found, str):
                    return found
                damage.append(f"{prefix}{path.name} line {back} from the end: {found}")
            end = start
    return None


def dropped(directory: Path, kind: Kind) -> int:
    """The lines the edge dropped of every task's series of `kind` (their indexes say)."""
    return sum(
        _Index.of(_Files(directory / kind.folder, task.replace(":", "-"))).dropped
        for task in tasks(directory, kind)
    )


# What each kind's line must be.


def metric_record(raw: object) -> dict[str, Any] | str:
    return metric_fields(raw) or "not a metrics record (no whole step from 0 to 10^12)"


def usage_sample(raw: object) -> dict[str, Any] | str:
    if not isinstance(raw, dict) or time_value(raw.get("t")) is None:
        return "not a resource sample (no time)"
    sample: dict[str, Any] = {"t": time_value(raw["t"])}
    for key in ("cpu", "rss", "gpu_util", "gpu_mem"):
        number = _finite(raw.get(key))
        if number is not None and number >= 0:
            sample[key] = number
    return sample


def journal_entry(raw: object) -> dict[str, Any] | str:
    if not isinstance(raw, dict) or time_value(raw.get("t")) is None:
        return "not a journal entry (no time)"
    kind, said = raw.get("kind"), raw.get("text")
    return {
        "t": time_value(raw["t"]),
        "kind": kind if isinstance(kind, str) and len(kind) <= 20 else "",
        "text": said[:2000] if isinstance(said, str) else "",
    }


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of 400 digits
        return None
    return number if math.isfinite(number) and abs(number) <= METRIC_ABS else None


def time_value(value: object) -> float | None:
    """A time of a local record this machine can print (seconds since 1970, up to year 5138),
    or None: the one rule for every reader of these records (runs, report)."""
    number = _finite(value)
    return number if number is not None and TIMES[0] <= number <= TIMES[1] else None


def count_value(value: object) -> int:
    """A count of a local record (untrusted: a hand-edited or damaged file), else 0: the one
    rule for every reader of these records (runs, report)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**6:
        return value
    return 0


# Whole documents.


def read_bounded(path: Path, limit: int) -> Any:
    """The JSON document of a file of the run's folder, or None when it is missing, longer
    than `limit` bytes or not JSON (nested past boundedjson.DEPTH included): a damaged or
    hostile file is None to its reader, never an error."""
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    if len(data) > limit:
        return None
    try:
        return boundedjson.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        return None
