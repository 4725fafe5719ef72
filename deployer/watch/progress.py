"""Progress of a long phase (sending, installing, starting, stopping, waiting for hosts), as
any phase can report it and both views can show it.

A phase reports a `Progress` (its name, counts, bytes, one row per host or group) whenever its
numbers move; `report(view, progress)` hands it to the view when the view can show progress (a
caller's own API view may not). The live view draws it under the task table with rich's
public renderables; the plain view prints one line when a phase begins and at most one
"still ..." line every STILL_EVERY_S seconds, with the elapsed time and the counts. A phase
ends with `Progress(..., finished=True)` (or the step that says how it went).

Feeds: deployer/up/start.py (tasks started of total), deployer/up/teardown.py (each task's
grace before SIGKILL), deployer/up/prepare.py (resolving, sending, installing, image loads:
elapsed and hosts done; the installer's own numbers where it gives them, `HostProgress`), and
anything later (a Slurm allocation wait) through the same call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from deployer.core.fold import fold_names
from deployer.core.text import duration, human_size

STILL_EVERY_S = 5.0  # the plain view's "still ..." lines, at most this often
MAX_ROWS = 8  # per-host rows the live view shows; the rest are counted


@dataclass(frozen=True)
class HostProgress:
    """One host's (or host group's) share of a phase: counts and/or bytes, and a word."""

    name: str
    done: int | None = None
    total: int | None = None
    unit: str = ""  # "wheels", "files"
    bytes_done: int | None = None
    bytes_total: int | None = None
    state: str = ""  # "installing", "done", "waiting (PENDING: Resources)"


@dataclass(frozen=True)
class Progress:
    """A phase's progress now. `started` is time.monotonic() when the phase began (the view
    computes elapsed, rate and ETA from it)."""

    phase: str  # "sending the code", "stopping the tasks"
    started: float = field(default_factory=time.monotonic)
    done: int | None = None
    total: int | None = None
    unit: str = ""  # what `done` counts: "tasks started", "hosts"
    bytes_done: int | None = None
    bytes_total: int | None = None
    rows: tuple[HostProgress, ...] = ()
    note: str = ""  # one line under it: "what the tasks print now is their own output"
    finished: bool = False

    def advanced(self, **changes: Any) -> Progress:
        return replace(self, **changes)

    def elapsed(self, now: float) -> float:
        return max(0.0, now - self.started)

    def counts(self, now: float) -> str:
        """'3 of 8 tasks started, 120 MB of 363 MB, 24 MB/s, ETA 10 s' (what there is)."""
        parts = []
        if self.done is not None:
            of = f" of {self.total}" if self.total is not None else ""
            parts.append(f"{self.done}{of} {self.unit}".rstrip())
        if self.bytes_done is not None:
            parts.append(_bytes(self.bytes_done, self.bytes_total, self.elapsed(now)))
        return ", ".join(parts)


def _bytes(done: int, total: int | None, elapsed: float) -> str:
    text = human_size(done) + (f" of {human_size(total)}" if total else "")
    if elapsed >= 0.5 and done > 0:
        rate = done / elapsed
        text += f", {human_size(rate)}/s"
        if total and total > done:
            text += f", ETA {duration((total - done) / rate)}"
    return text


def host_text(row: HostProgress, elapsed: float) -> str:
    parts = [row.state] if row.state else []
    if row.done is not None:
        of = f" of {row.total}" if row.total is not None else ""
        parts.append(f"{row.done}{of} {row.unit}".rstrip())
    if row.bytes_done is not None:
        parts.append(_bytes(row.bytes_done, row.bytes_total, elapsed))
    return ", ".join(parts)


def report(view: object, progress: Progress) -> None:
    """Gives `progress` to `view` when it shows progress (the API's own views may not)."""
    show: Callable[[Progress], None] | None = getattr(view, "progress", None)
    if show is not None:
        show(progress)


def render(progress: Progress, now: float, width: int) -> list[RenderableType]:
    """The live view's lines for a phase: a headline with a bar when the total is known,
    then a row per host (at most MAX_ROWS, the rest counted), then the note."""
    head = Text(progress.phase, style="bold")
    counts = progress.counts(now)
    head.append(f": {counts}" if counts else "")
    head.append(f" ({duration(progress.elapsed(now))})", style="dim")
    head.no_wrap, head.overflow = True, "ellipsis"
    shown: list[RenderableType] = [head]
    fraction = _fraction(progress)
    if fraction is not None:
        shown.append(bar(fraction, min(60, max(10, width))))
    if progress.rows:
        table = Table.grid(padding=(0, 2))
        table.add_column(no_wrap=True)
        table.add_column(no_wrap=True, overflow="ellipsis")
        for row in progress.rows[:MAX_ROWS]:
            table.add_row(f"  {row.name}", host_text(row, progress.elapsed(now)))
        shown.append(table)
        if len(progress.rows) > MAX_ROWS:
            shown.append(Text(f"  … {len(progress.rows) - MAX_ROWS} more", style="dim"))
    if progress.note:
        note = Text(progress.note, style="dim")
        note.no_wrap, note.overflow = True, "ellipsis"
        shown.append(note)
    return shown


def bar(fraction: float, width: int) -> Text:
    """A one-line bar (a Text: it ends its line inside a Group, as rich's ProgressBar does not)."""
    filled = round(max(0.0, min(1.0, fraction)) * width)
    line = Text("━" * filled, style="green")
    line.append("━" * (width - filled), style="grey23")
    line.no_wrap = True
    return line


def _fraction(progress: Progress) -> float | None:
    if progress.bytes_total:
        return min(1.0, (progress.bytes_done or 0) / progress.bytes_total)
    if progress.total and progress.done is not None:
        return min(1.0, progress.done / progress.total)
    return None


def rows_height(progress: Progress | None) -> int:
    if progress is None:
        return 0
    rows = min(len(progress.rows), MAX_ROWS) + (len(progress.rows) > MAX_ROWS)
    return 1 + (_fraction(progress) is not None) + rows + bool(progress.note)


class PlainProgress:
    """The plain view's progress lines: one when a phase begins (and its note), then at most
    one "still ..." line every `every` seconds while its numbers keep coming."""

    def __init__(self, write: Callable[[str], None], every: float = STILL_EVERY_S) -> None:
        self._write = write
        self._every = every
        self._phase: str | None = None
        self._said_at = 0.0

    def show(self, progress: Progress, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if progress.finished:
            self._phase = None
            return
        if progress.phase != self._phase:
            self._phase, self._said_at = progress.phase, now
            counts = progress.counts(now)
            self._write(f"{progress.phase}{': ' + counts if counts else ''}")
            if progress.note:
                self._write(progress.note)
            return
        if now - self._said_at < self._every:
            return
        self._said_at = now
        self._write(still_line(progress, now))


def still_line(progress: Progress, now: float) -> str:
    """'still sending the code (12 s): 120 MB of 363 MB, 24 MB/s, ETA 10 s; h1: 2 of 5 wheels'."""
    counts = progress.counts(now)
    text = f"still {progress.phase} ({duration(progress.elapsed(now))})"
    text += f": {counts}" if counts else ""
    busy = [r for r in progress.rows if r.state != "done"]
    hosts = "; ".join(f"{r.name}: {host_text(r, progress.elapsed(now))}" for r in busy[:4])
    if hosts:
        text += f"; {hosts}" + (f"; {len(busy) - 4} more" if len(busy) > 4 else "")
    return text


class Ticker:
    """Re-reports a Progress every `every` seconds from a thread, so elapsed time moves while a
    blocking call runs; `update` changes it (a host done), `close` ends the phase."""

    def __init__(self, view: object, progress: Progress, every: float = 1.0) -> None:
        import threading

        self.view = view
        self.progress = progress
        # Called each tick for a new Progress where the numbers move with time (a countdown).
        self.refresh: Callable[[], Progress] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        report(view, progress)
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._lock:
                if self.refresh is not None:
                    self.progress = self.refresh()
                report(self.view, self.progress)

    def host(self, name: str, **changes: Any) -> None:
        with self._lock:
            rows = tuple(replace(r, **changes) if r.name == name else r for r in self.progress.rows)
            done = sum(1 for r in rows if r.state == "done")
            self.progress = self.progress.advanced(rows=rows, done=done, total=len(rows))
            report(self.view, self.progress)

    def add(self, count: int) -> None:
        """`count` more done (tasks started)."""
        with self._lock:
            self.progress = self.progress.advanced(done=(self.progress.done or 0) + count)
            report(self.view, self.progress)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with self._lock:
            report(self.view, self.progress.advanced(finished=True))

    def __enter__(self) -> Ticker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sent_progress(base: Progress, meter: Any) -> Progress:
    """A push's progress from its ByteMeter (deployer/push/sync.py): bytes sent of what the
    hosts lacked, over all and per host (a host sharing a workdir is its group's first)."""
    sent = meter.snapshot()  # (host, bytes sent, bytes lacked)
    if not sent:
        return base
    rows = tuple(
        HostProgress(
            host, bytes_done=done, bytes_total=total, state="done" if done >= total else ""
        )
        for host, done, total in sent
    )
    return base.advanced(
        bytes_done=sum(r[1] for r in sent), bytes_total=sum(r[2] for r in sent), rows=rows
    )


class StopCountdown:
    """A stop's progress (`up`'s teardown, `down`): which tasks are still inside their grace on
    which host, and the seconds left before SIGKILL; a host leaves the list when its stop
    returns (`done`). Its note says that what the tasks print meanwhile is their own output (a
    trainer logging its last steps, saving a checkpoint), not a stop that failed."""

    def __init__(self, view: object, running: Mapping[str, str], grace: float) -> None:
        self.grace, self.begun = grace, time.monotonic()
        self.hosts: dict[str, list[str]] = {}
        for name, host in running.items():  # task name -> its host
            self.hosts.setdefault(host, []).append(name)
        self.ticker: Ticker | None = None
        if running and grace >= 1 and view is not None:
            self.ticker = Ticker(view, self._progress(), every=1.0)
            self.ticker.refresh = self._progress  # the countdown moves every second

    def _progress(self) -> Progress:
        left = max(0.0, self.grace - (time.monotonic() - self.begun))
        rows = tuple(
            HostProgress(host, state=f"{fold_names(names)}: SIGKILL in {left:.0f} s")
            for host, names in self.hosts.items()
            if names
        )
        busy = sum(len(n) for n in self.hosts.values())
        noun = "task" if busy == 1 else "tasks"
        return Progress(
            "stopping",
            started=self.begun,
            done=busy,
            unit=f"{noun} inside their stop_grace ({self.grace:g} s), SIGKILL in {left:.0f} s",
            rows=rows,
            note="what the tasks print meanwhile is their own output: they are shutting down",
        )

    def done(self, host: str) -> None:
        self.hosts[host] = []

    def __enter__(self) -> StopCountdown:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.ticker is not None:
            self.ticker.close()


class SayProgress:
    """A view for progress alone, for commands that print lines (`down`): PlainProgress's
    lines, said through `say`."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._plain = PlainProgress(say)

    def progress(self, progress: Progress) -> None:
        self._plain.show(progress)
