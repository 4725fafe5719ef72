"""The local log archive: every task's output, kept on this machine as `up` streams it.

Logs live on the hosts, and hosts go away (terminated instances, a lab torn down, a crashed
disk). So `up` also writes each task's bytes to `<state>/runs/<run-id>/<role>-<index>.log`
(what a terminal obeys defanged, same length: deployer/core/lines.py `defang`),
by the byte offsets the polls carry (a re-read or a reconnect never duplicates a byte), and
`tfdeploy logs RUN_ID` reads them back when the hosts cannot be asked. A file is bounded: past
`limit` bytes it is rotated once (`.log.1`), so a task keeps at most twice that here.

A file deleted or cut short under it (by hand, a cleaner) is never padded with NUL bytes to
reach the next offset: the bytes that are gone are recorded as missing, and `damage` says so,
so `logs` never starts mid-stream without a word and `logs --sync` fetches the whole log again.

**No secret lands here** (docs/security.md, "Secrets"): everything the archive writes into the
run's folder passes its `hide`, the run's Masker. A secret value a task printed is blanked in
its log file to as many `*` as it had bytes (the offsets stay the host log's; one cut between
two writes is blanked whole when its end arrives), and in the journal, facts and outcome it is
`********`; a metric whose name holds one is not kept.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from deployer.core.lines import Assembler, LineAssembler, clean, defang
from deployer.core.secrets import Masker
from deployer.hosts.replies import MetricRecords, task_name_ok
from deployer.results import runstore
from deployer.results.runstore import Facts, JournalEntry, RunFolder, run_dir

LIMIT_BYTES = 64 * 1024 * 1024


@dataclass
class _File:
    host: str
    base: int = 0  # host log offset of the first byte of the current .log
    lost: int = 0  # host log bytes before `base` this archive lost (its file went away)
    end: int | None = None  # host log offset up to which the archive held it when `up` ended

    @classmethod
    def from_json(cls, entry: dict[str, object]) -> _File:
        def number(key: str) -> int:
            value = entry.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        # The index is this machine's, but a person or a full disk may have changed it: a
        # host that is no text is unknown ("?"), and a text is cleaned, as it is printed.
        host, end = entry.get("host"), entry.get("end")
        return cls(
            clean(host) if isinstance(host, str) else "?",
            number("base"),
            number("lost"),
            end if isinstance(end, int) and not isinstance(end, bool) else None,
        )

    def to_json(self) -> dict[str, object]:
        return {"host": self.host, "base": self.base, "lost": self.lost, "end": self.end}


class LogArchive:
    """Writes one run's task logs; the index says each task's host and where its file starts."""

    def __init__(
        self,
        run_id: str,
        *,
        limit: int = LIMIT_BYTES,
        on_failure: Callable[[str], None] = lambda why: None,
        hide: Masker | None = None,
    ) -> None:
        self.run_id = run_id
        self.folder = RunFolder.of(run_id)
        self.dir = self.folder.path
        self.limit = limit
        self.hide = hide or Masker()  # the run's secrets: none of them is written here
        # The archive is a convenience: a disk that is full or read-only stops it (said once,
        # through on_failure), never the job. Its index then never says "ended", so `logs`
        # asks the hosts rather than trust what it holds.
        self.failure: str | None = None
        self._on_failure = on_failure
        self.files: dict[str, _File] = {}
        self.ended = bool(runstore.read_archive_index(run_id).get("ended"))  # --sync keeps it so
        for name, entry in _tasks(run_id).items():
            self.files[name] = _File.from_json(entry)

    def write(self, task: str, host: str, offset: int, data: bytes) -> None:
        """`data` is the host log's bytes from `offset` on."""
        if data and self.failure is None:
            self._guard(lambda: self._write(task, host, offset, data))

    def _guard(self, write: Callable[[], None]) -> None:
        try:
            write()
        except OSError as exc:
            where = exc.filename or self.dir
            self.failure = f"{where}: {exc.strerror or exc}"
            self._on_failure(self.failure)

    def write_metrics(self, task: str, records: Iterable[Mapping[str, float]]) -> None:
        """The task's metrics records, kept for `runs` and `report` (runstore.py, bounded),
        and how many of its lines the edge dropped (a MetricRecords batch says)."""
        dropped = records.dropped if isinstance(records, MetricRecords) else 0
        if self.hide.values:  # a metric named after a secret is not kept
            records = [{k: v for k, v in r.items() if self.hide(k) == k} for r in records]
        if self.failure is None:
            self._guard(lambda: runstore.append_metrics(self.run_id, task, records, dropped))

    def write_usage(self, task: str, sample: Mapping[str, float]) -> None:
        if self.failure is None:
            self._guard(lambda: runstore.append_usage(self.run_id, task, [sample]))

    def note(self, kind: str, text: str, at: float | None = None) -> None:
        """One line of the run's journal: a step or phase of `up`, with the time it was said."""
        if self.failure is None:
            t = round(time.time() if at is None else at, 3)
            entry = JournalEntry(t=t, kind=kind, text=self.hide(text))
            self._guard(lambda: runstore.append_journal(self.run_id, [entry]))

    def keep_facts(self, facts: Facts) -> None:
        """The run's facts (runstore.py), secrets masked."""
        if self.failure is None:
            self._guard(lambda: runstore.write_facts(self.run_id, facts, self.hide))

    def keep_outcome(self, outcome: Mapping[str, object]) -> None:
        """How the run ended (runstore.py), secrets masked."""
        if self.failure is None:
            self._guard(lambda: runstore.write_outcome(self.run_id, outcome, self.hide))

    def keep_offsets(self, offsets: Mapping[str, int]) -> None:
        """Where each task's metrics were read up to: what `down` need not read again."""
        if self.failure is None:
            self._guard(lambda: runstore.write_offsets(self.run_id, offsets, self.hide))

    def _write(self, task: str, host: str, offset: int, data: bytes) -> None:
        entry = self.files.get(task)
        if entry is None:
            entry = self.files[task] = _File(host)
            self._save()
        path = self._writable(task)
        if offset + len(data) - entry.base > self.limit and offset > entry.base:
            # Where a line begins: the file kept after the next rotation then starts with a
            # whole line, not with the end of one whose start was let go.
            cut = 0 if _line_starts(path, offset - entry.base) else data.find(b"\n") + 1
            if cut:
                self._put(entry, path, offset, data[:cut])
                offset, data = offset + cut, data[cut:]
            if not data:
                return  # it ended a line: the next write begins one, and rotates there
            os.replace(path, path.with_suffix(".log.1"))  # the previous rotation is dropped
            entry.base = offset
            self._save()
        self._put(entry, path, offset, data)

    def _put(self, entry: _File, path: Path, offset: int, data: bytes) -> None:
        position = offset - entry.base
        if position < 0:  # already rotated past these bytes
            data, position = data[-position:], 0
        flags = os.O_RDWR | os.O_CREAT  # read: a character cut between two writes
        if position > _size_of(path):
            # The file went away (or was cut short) under us: a write past its end would fill
            # the gap with NUL bytes. Start it afresh here and remember what is gone.
            entry.lost, entry.base, position = offset, offset, 0
            flags |= os.O_TRUNC
            path.with_suffix(".log.1").unlink(missing_ok=True)  # it no longer joins on
            self._save()
        fd = os.open(path, flags, 0o600)
        try:
            # What a terminal would obey never lands in a file a person may `cat` (the filter of
            # deployer/core/lines.py, same length): a character cut between two writes is
            # defanged with the bytes before it, read back. Nor does a secret: blanked, same
            # length, with as many bytes before it as one cut between two writes may have left.
            back = min(3, position) if data and 0x80 <= data[0] < 0xC0 else 0
            reach = max(back, min(self.hide.reach, position))
            kept = os.pread(fd, reach, position - reach) if reach else b""
            joined = self.hide.blank(kept + data)
            settled = max(0, len(kept) - back)  # defanged: twice would turn ESC's NUL into DEL
            if joined[:settled] == kept[:settled]:  # no secret ended here
                data, position = defang(joined[settled:]), position - (len(kept) - settled)
            else:
                data, position = joined[:settled] + defang(joined[settled:]), position - len(kept)
            view = memoryview(data)
            while view:  # a disk filling up takes part of a write, then fails the next
                written = os.pwrite(fd, view, position)
                view, position = view[written:], position + written
        finally:
            os.close(fd)

    def size(self, task: str) -> int:
        """Host log offset up to which this archive holds the task's output."""
        entry = self.files.get(task)
        if entry is None:
            return 0
        return entry.base + _size_of(self.dir / _file_name(task))

    def damage(self, task: str) -> str | None:
        """What this archive lacks of a task's log, in words, or None when it is whole."""
        entry = self.files.get(task)
        if entry is None:
            return None
        path = self.dir / _file_name(task)
        if entry.lost:
            return f"its first {entry.lost} bytes were lost here ({path.name} was removed)"
        if not path.exists():  # an entry exists only once bytes were written
            return f"its file {path.name} is missing"
        size = _size_of(path)
        if entry.end is not None and entry.base + size < entry.end:
            return f"{path.name} was cut short ({size} of {entry.end - entry.base} bytes)"
        return None

    def reset(self, task: str) -> None:
        """Forgets a damaged task's archive, so it is filled again from the log's first byte."""
        if self.files.pop(task, None) is None:
            return
        path = self._writable(task)
        path.unlink(missing_ok=True)
        path.with_suffix(".log.1").unlink(missing_ok=True)
        self._save()

    def kept(self) -> int:
        """Bytes of a task's log this archive holds at least, once it holds that much: a
        copy of more rotates past the oldest (see `write`)."""
        return 2 * self.limit

    def skip_to(self, task: str, host: str, offset: int) -> None:
        """Starts a task's archive afresh at host log `offset`, a line's start: what copying
        everything before it would have let go by rotating (let_go says so, as it would)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self._writable(task)
        path.with_suffix(".log.1").unlink(missing_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        self.files[task] = _File(host, base=offset)
        self._save()

    def end(self) -> None:
        """`up` saw the run to its end: the archive holds all there is, hosts need not be asked
        (unless a file of it is damaged later: each task's end offset is kept to tell)."""
        if self.failure is None:
            self.ended = True
            self._guard(self._end)

    def _end(self) -> None:
        for name in self.files:
            self.seal(name)
        self._save()

    def reopen(self) -> None:
        """The run goes on (`up --resume`): the archive no longer holds all there is, so `logs`
        asks the hosts again until this `up` ends it; each task's file goes on by offset."""
        if self.failure is None and (
            self.ended or any(f.end is not None for f in self.files.values())
        ):
            self.ended = False
            for entry in self.files.values():
                entry.end = None
            self._guard(self._save)

    def seal(self, task: str) -> None:
        """The task has ended and this archive holds all of its log: remember how much."""
        entry = self.files.get(task)
        if entry is not None:
            entry.end = self.size(task)
            self._save()

    def _writable(self, task: str) -> Path:
        """The task's file, checked right before it is written, truncated, rotated or removed:
        the name is a task name (it came from a host) and the file, links resolved, is in this
        run's folder, whatever the name or the folder holds."""
        path = self.dir / _file_name(task)
        if path.resolve().parent != self.dir.resolve():
            raise ValueError(f"{path} is not a file of the run's archive {self.dir}")
        return path

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tasks = {n: f.to_json() for n, f in self.files.items()}
        index = self.folder.archive_index
        tmp = index.with_name(f".{index.name}.part")
        try:
            tmp.write_text(json.dumps({"tasks": tasks, "ended": self.ended}), encoding="utf-8")
        except OSError:
            tmp.unlink(missing_ok=True)  # a half-written index must not take a disk's last bytes
            raise
        tmp.replace(index)


def _line_starts(path: Path, position: int) -> bool:
    """Whether `position` of the file is the start of a line (or past what the file holds)."""
    if position <= 0:
        return True
    try:
        with path.open("rb") as f:
            f.seek(position - 1)
            return f.read(1) in (b"\n", b"")
    except FileNotFoundError:
        return True


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def damaged(run_id: str, task: str | None = None) -> dict[str, str]:
    """What the archive of a run lacks, per task (or of `task`): reading it as it is would
    start a log mid-stream, or drop a task, without a word."""
    archive = LogArchive(run_id)
    names = [task] if task is not None else list(archive.files)
    found = {name: archive.damage(name) for name in names}
    return {name: what for name, what in found.items() if what}


def has_archive(run_id: str) -> bool:
    return RunFolder.of(run_id).archive_index.is_file()


def archive_ended(run_id: str) -> bool:
    return bool(runstore.read_archive_index(run_id).get("ended"))


def read_runs(
    run_id: str, task: str | None = None, make: Callable[[], Assembler] = LineAssembler
) -> Iterator[tuple[str, list[str]]]:
    """The archived lines as (label, lines) runs, a MB of the file at a time: what a printer
    wants (a million lines one by one cost more than reading them), in bounded memory."""
    directory = run_dir(run_id)
    for name, entry in _tasks(run_id).items():
        if task is not None and name != task:
            continue
        assembler = make()
        label = f"{name}@{_File.from_json(entry).host}"
        path = directory / _file_name(name)
        for part in (path.with_suffix(".log.1"), path):
            for lines in _chunks(part, assembler):
                if lines:
                    yield label, lines
        if rest := assembler.flush():
            yield label, rest


def let_go(run_id: str, task: str | None = None) -> dict[str, int]:
    """Per task (or `task`), the bytes of its log the archive let go to stay within its bound
    (the oldest, once a file rotated twice), when any were."""
    directory = run_dir(run_id)
    found = {}
    for name, entry in _tasks(run_id).items():
        if task is None or name == task:
            kept_from = _kept_from(_File.from_json(entry), directory / _file_name(name))
            if kept_from > 0:
                found[name] = kept_from
    return found


def _kept_from(entry: _File, path: Path) -> int:
    """The host log offset of the first byte the archive still holds of a task (0: all of it;
    what a removed file lost is `damage`, not this)."""
    if entry.lost:
        return 0
    return max(0, entry.base - _size_of(path.with_suffix(".log.1")))


def _chunks(path: Path, assembler: Assembler) -> Iterator[list[str]]:
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                yield assembler.feed(chunk)
    except FileNotFoundError:
        return


def _file_name(task: str) -> str:
    """`worker-0.log` of `worker:0`; a name that is not a task's (a host's reply is checked at
    deployer/hosts/replies.py, this is the second check) names no file."""
    if not task_name_ok(task):
        raise ValueError(f"{task!r} is not a task name: no archive file is named after it")
    return runstore.log_name(task)


def _tasks(run_id: str) -> dict[str, dict[str, object]]:
    """The index's tasks; an entry whose name is no task name (an index written by hand, or
    damaged file) names no file and is left out. The index is read as the run store reads
    every document: missing or damaged (not JSON, nested past any index's depth), it is {}."""
    tasks = runstore.read_archive_index(run_id).get("tasks")
    if not isinstance(tasks, dict):
        return {}
    return {n: e for n, e in tasks.items() if task_name_ok(n) and isinstance(e, dict)}
