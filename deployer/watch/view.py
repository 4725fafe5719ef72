"""What a person sees while a job runs: a live task table over interleaved, prefixed log lines.

Two renderers share one small interface, `Display` (the deployment's; the API's public `View`
is what a caller passes, adapted to it in api/views.py): LiveView for terminals (rich Live; log
lines scroll above a table that stays put) and PlainView for pipes and CI logs (one prefixed
line per event).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TextIO

from rich.console import (
    COLOR_SYSTEMS,
    Console,
    ConsoleOptions,
    ConsoleRenderable,
    Group,
    RenderableType,
    RenderResult,
)
from rich.control import strip_control_codes
from rich.live import Live
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from deployer.core.lines import clean_text
from deployer.core.secrets import Masker
from deployer.watch import progress as progress_lines
from deployer.watch.board import TaskRow
from deployer.watch.progress import PlainProgress, Progress, report
from deployer.watch.table import Heard, region_rows, task_colour, task_panel


class Display(Protocol):
    """Where a deployment's events go: steps, the current phase, log lines, the task table.
    A view may also have `progress(Progress)` (deployer/watch/progress.py; `report` calls it
    where present): every view here has it, an API caller's may not."""

    def step(self, text: str) -> None: ...
    def phase(self, text: str) -> None: ...
    def lines(self, label: str, lines: Sequence[str]) -> None: ...
    def tasks(self, rows: Sequence[TaskRow]) -> None: ...
    def close(self) -> None: ...


def prefixed(label: str, line: str, width: int = 0) -> Text:
    text = Text()
    text.append(f"{label:<{width}} | ", style=task_colour(label))
    text.append(line)
    return text


class LogBlock:
    """Prefixed log lines kept as they came, rendered as one ready-made segment per batch.

    Per line, a rich Text costs ~16 us of wrapping and style bookkeeping, 10-20x what writing the
    line costs, and these lines need neither (the terminal soft-wraps them). So the coloured
    prefix is rendered once per batch and joined to the lines with string operations; the
    control codes that Text would strip are stripped the same way.
    """

    def __init__(self) -> None:
        self._runs: list[tuple[str, int, Sequence[str]]] = []  # (label, prefix width, lines)
        self.chars = 0  # of the lines held, for a bound on what waits in memory

    def __bool__(self) -> bool:
        return bool(self._runs)

    def add(self, label: str, width: int, lines: Sequence[str]) -> None:
        if lines:
            self._runs.append((label, width, lines))
            self.chars += sum(map(len, lines))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        system = COLOR_SYSTEMS.get(console.color_system or "")
        parts = []
        for label, width, lines in self._runs:
            head = Style.parse(task_colour(label)).render(
                f"{label:<{width}} | ", color_system=system
            )
            body = strip_control_codes("\n".join(lines))
            parts.append(head + body.replace("\n", "\n" + head) + "\n")
        yield Segment("".join(parts))  # no style: written as it is


LINES_AT_ONCE = 256  # what PlainView writes (and flushes) at a time


class PlainView:
    """For pipes: every log line and every step as one plain, prefixed line.

    When the pipe's reader goes away (`| head`), the first write raises BrokenPipeError (the CLI
    exits quietly on it) and later ones are dropped, so a teardown's messages cannot stop the
    teardown.
    """

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._states: dict[str, str] = {}
        self._gone = False
        self._progress = PlainProgress(self.step)

    def step(self, text: str) -> None:
        self._write(f"tfdeploy: {clean_text(text)}\n")  # it may quote a host: never control

    def phase(self, text: str) -> None:
        """Nothing: a pipe gets events, and the step that ends a phase says how it went."""

    def progress(self, progress: Progress) -> None:
        """A line when a long phase begins, then at most one "still ..." line every few s."""
        self._progress.show(progress)

    def lines(self, label: str, lines: Sequence[str]) -> None:
        """LINES_AT_ONCE lines a write: one write each cost `logs` of a large archive more than
        reading it, and a whole MB in one write hid a closed pipe (`| head`): the kernel takes
        part of a large write, Python drops the rest without an error, and nothing said stop."""
        prefix = f"{label} | "
        for at in range(0, len(lines), LINES_AT_ONCE):
            self._write(prefix + f"\n{prefix}".join(lines[at : at + LINES_AT_ONCE]) + "\n")

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        for row in rows:
            shown = f"{row.state} ({row.outcome})" if row.outcome else row.state
            if self._states.get(row.label) != shown:
                self._states[row.label] = shown
                pid = f" pid {row.pid}" if row.pid else ""
                self.step(f"{row.label}{pid} {shown}")

    def close(self) -> None:
        self._write("")

    def _write(self, text: str) -> None:
        if self._gone:
            return
        try:
            self._out.write(text)
            self._out.flush()
        except BrokenPipeError:
            self._gone = True
            raise


class _CurrentLive(Live):
    """A rich Live whose redraw after a print shows the view as it is now.

    Live redraws its region below every print, but with what its last timed refresh rendered:
    a step printed right after another left the region showing the one before (the status
    line said "preflight" through push, start and watching, issue 29).

    Fenced like paramiko's internals (hosts/paramiko_tuning.py): it reaches Live's private
    `_lock` and `_live_render`, which rich 13.7 to 15 have (pyproject.toml bounds rich below 16);
    a rich without them gets stock Live, whose region may show one step late, never an error.
    """

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        lock, region = getattr(self, "_lock", None), getattr(self, "_live_render", None)
        if lock is not None and hasattr(region, "set_renderable"):
            with lock:
                region.set_renderable(self.renderable)  # type: ignore[union-attr]
        return super().process_renderables(renderables)


HOLD_AT_MOST_S = 1.0  # log lines wait no longer than this, even for a caller that never ends a tick
HOLD_CHARS = 1 << 20  # nor pile up beyond this (a backlog read flat out)


class LiveView:
    """For terminals: log lines scroll above a task table that redraws in place.

    Every print above a rich Live redraws the whole table below it, so printing each log line
    on its own made a chatty task cost a full table render per line (5,000 lines: 40x the CPU
    of plain mode). Lines are therefore buffered and printed as one block at the end of a watch
    tick (`tasks`), at most `flushes_per_second` times a second; the table itself only changes
    on Live's own timer.
    """

    def __init__(
        self,
        console: Console,
        *,
        flushes_per_second: float = 10,
        refreshes_per_second: float = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._console = console
        self._rows: Sequence[TaskRow] = ()
        self._status = ""
        self._width = 12
        self._pending = LogBlock()  # log lines not printed yet
        self._period = 1 / flushes_per_second
        self._clock = clock
        self._flushed = clock() - self._period  # when lines were last printed: "long ago"
        self._heard: dict[str, float] = {}  # task label -> view clock at its last log line
        self._said: dict[str, int] = {}  # task label -> log lines it printed
        self._progress: Progress | None = None  # a long phase's numbers, drawn under the table
        self._live = _CurrentLive(
            get_renderable=self._render,
            console=console,
            auto_refresh=True,  # the uptime column ticks on even when nothing else happens
            refresh_per_second=refreshes_per_second,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def _render(self) -> RenderableType:
        """The live region: tasks (folded to fit) over one status line, never taller than
        region_rows of the terminal, so a redraw never scrolls and log lines keep room."""
        status = [Text(f"tfdeploy: {self._status}", style="bold")] if self._status else []
        for line in status:
            line.no_wrap, line.overflow = True, "ellipsis"  # one line: the step is above in full
        shown = self._progress
        under = (
            progress_lines.render(shown, time.monotonic(), self._console.width - 20)
            if shown is not None
            else []
        )
        if not self._rows:
            return Group(*under, *status)
        lines = region_rows(self._console.height) - len(status) - progress_lines.rows_height(shown)
        heard = Heard(self._heard, self._said, self._clock())
        return Group(*task_panel(self._rows, max(1, lines), heard), *under, *status)

    def progress(self, progress: Progress) -> None:
        """Drawn under the table until the phase reports itself finished (or a step ends it)."""
        self._progress = None if progress.finished else progress

    def step(self, text: str) -> None:
        text = clean_text(text)  # it may quote a host: never control
        self._status = text.partition("\n")[0]  # the whole text goes to the scrollback
        self._flush(Text(f"tfdeploy: {text}", style="bold"))  # after the lines before it

    def phase(self, text: str) -> None:
        """What goes on until the next step (a push, a teardown): the status line says it,
        the scrollback does not (the step that ends the phase says how it went)."""
        self._status = clean_text(text).partition("\n")[0]
        self._live.refresh()

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self._width = max(self._width, len(label))
        self._pending.add(label, self._width, lines)
        task = label.partition(" ")[0]  # "worker:0@h1 [attempt 1]": TaskRow.label is the head
        self._heard[task] = self._clock()
        self._said[task] = self._said.get(task, 0) + len(lines)
        if self._pending.chars >= HOLD_CHARS:  # a backlog: print it rather than hold it all
            self._flush()
        else:
            self._flush_if_due(HOLD_AT_MOST_S)  # a tick brings one call per task: wait for tasks()

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        self._rows = list(rows)  # drawn by Live's next refresh, or with the next batch of lines
        now = self._clock()
        for row in self._rows:  # silence is counted from when a task is first seen
            self._heard.setdefault(row.label, now)
        self._flush_if_due(self._period)  # the end of a tick: every task's lines in one print

    def close(self) -> None:
        self._flush()
        self._progress = None
        self._status = ""  # every step is already in the scrollback
        self._live.stop()

    def _flush_if_due(self, period: float) -> None:
        if self._pending and self._clock() - self._flushed >= period:
            self._flush()

    def _flush(self, *after: Text) -> None:
        """Prints the pending lines (and `after`) with one console.print: one table redraw."""
        self._flushed = self._clock()
        batch, self._pending = self._pending, LogBlock()
        shown = [*([batch] if batch else []), *after]
        if shown:
            self._console.print(*shown, sep="", soft_wrap=True)


def make_view(console: Console, out: TextIO) -> Display:
    return LiveView(console) if console.is_terminal else PlainView(out)


class MaskedView:
    """Any view, with the run's secret values masked in everything it shows: log lines, steps
    and the table's last lines. Tasks print what they like (a failing script dumps its env),
    and a token forwarded from this shell must not end up in a terminal's scrollback or a CI
    log; the hosts' own logs keep them, this machine's archive blanks them (docs/security.md)."""

    def __init__(self, view: Display, hide: Callable[[str], str]) -> None:
        self.view = view
        self.hide = hide

    def step(self, text: str) -> None:
        self.view.step(self.hide(text))

    def phase(self, text: str) -> None:
        self.view.phase(self.hide(text))

    def progress(self, progress: Progress) -> None:
        report(self.view, progress)  # numbers and host names: no secret in them

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self.view.lines(label, [self.hide(line) for line in lines])

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        self.view.tasks([dataclasses.replace(r, last_line=self.hide(r.last_line)) for r in rows])

    def close(self) -> None:
        self.view.close()


def masked_view(view: Display, masker: Masker) -> Display:
    """`view` itself when the run has no secret value to hide, else a MaskedView."""
    return MaskedView(view, masker) if masker.values else view


class SteadyView:
    """Any view, which raises no output error once `steady` is set (a teardown begins): a pipe
    whose reader left, a terminal gone (EIO) or a closed stdout then loses the words, never
    the stop of the run, its firewall removal or its artifacts."""

    def __init__(self, view: Display) -> None:
        self.view = view
        self.steady = False

    def step(self, text: str) -> None:
        self._guard(self.view.step, text)

    def phase(self, text: str) -> None:
        self._guard(self.view.phase, text)

    def progress(self, progress: Progress) -> None:
        self._guard(report, self.view, progress)

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self._guard(self.view.lines, label, lines)

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        self._guard(self.view.tasks, rows)

    def close(self) -> None:
        self._guard(self.view.close)

    def _guard(self, call: Callable[..., None], *args: object) -> None:
        if not self.steady:
            call(*args)
            return
        with contextlib.suppress(OSError, ValueError):  # what could not print is lost, no more
            call(*args)
