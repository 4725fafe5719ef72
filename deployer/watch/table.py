"""The live view's task table: it fits the terminal's width and height, however many tasks.

At any width the last-line column keeps LAST_LINE_MIN characters: other columns are dropped
first (pid, uptime, GPU use, GPUs). When the tasks do not fit the rows the view may take, the
table folds: counts per role and state, the tasks worth a look (failed, restarted, silent, the
slowest), and one line for the rest. What a frame costs then grows with the terminal's size,
not with the number of tasks (256 tasks: one ranking pass, a table of at most a screen).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from deployer.core.fold import fold, more_line, tally_lines
from deployer.watch.board import TaskRow
from deployer.watch.series import TaskProgress
from remote import protocol

PALETTE = (
    "cyan",
    "magenta",
    "green",
    "yellow",
    "blue",
    "bright_red",
    "bright_cyan",
    "bright_magenta",
    "bright_green",
    "bright_blue",
)
STATE_STYLES = {
    protocol.STATE_RUNNING: "green",
    protocol.STATE_EXITED: "bold",
    protocol.STATE_LOST: "red",
    protocol.STATE_STARTING: "yellow",
}
LAST_LINE_MIN = 24  # characters of each task's last line the table keeps at any width
# Dropped in this order while the table does not fit: the trends first, the step last.
OPTIONAL = (
    "trend",
    "pid",
    "uptime",
    "GPU use",
    "GPUs",
    "RSS",
    "loss",
    "ETA",
    "CPU",
    "steps/s",
)
STEP_COLUMNS = ("step", "steps/s", "ETA", "loss", "trend")  # tasks that write TFDEPLOY_METRICS
NUMBERS = ("pid", "restarts", "uptime", "quiet", "step", "steps/s", "ETA", "loss", "CPU", "RSS")
HOST_MIN = 8  # characters of a host name kept when the width left asks for cutting it
SILENT_AFTER_S = 60.0  # a running task with no log line for this long is shown as silent
CHROME_ROWS = 4  # a table's lines besides its rows: top, header, rule under it, bottom


def task_colour(label: str) -> str:
    """A stable colour per task, the same in every run, so a reader learns it."""
    return PALETTE[zlib.crc32(label.encode()) % len(PALETTE)]


def state_text(row: TaskRow) -> str:
    """Short words, so the state column leaves room for the last line: 'exited 0', 'killed
    (signal 9)', 'lost', 'preempted', 'stopped' (the failure report has the long story)."""
    outcome = row.outcome
    if not outcome:
        return row.state
    if outcome.startswith("exit code "):
        return f"exited {outcome.removeprefix('exit code ').split(':')[0]}"
    if outcome.startswith("killed by signal "):
        return f"killed (signal {outcome.removeprefix('killed by signal ')})"
    return outcome.split(":")[0].split(" (")[0].removesuffix(" by tfdeploy")


def _state_style(row: TaskRow) -> str:
    return "bold red" if row.failed else STATE_STYLES.get(row.state, "")


def _clock_text(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def _uptime(row: TaskRow, now: float) -> str:
    return "-" if row.started is None else _clock_text((row.ended or now) - row.started)


class TaskTable:
    """One row per task; fits the width it is given with at least LAST_LINE_MIN characters of
    every last line, dropping optional columns (OPTIONAL, in order) until it does.

    `quiet` (label to seconds since its last log line) adds a column: the folded view shows why
    a silent task is listed.
    """

    def __init__(
        self,
        rows: Sequence[TaskRow],
        now: float | None = None,
        quiet: Callable[[TaskRow], float] | None = None,
    ) -> None:
        self.rows = rows
        self.now = time.time() if now is None else now
        self.quiet = quiet

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        dropped: set[str] = set()
        natural = options.update_width(1 << 20)  # Measurement.get clamps to the width it gets
        for column in (None, *OPTIONAL):
            if column is not None:
                dropped.add(column)
            narrow = self._table(dropped, expand=False)
            excess = Measurement.get(console, natural, narrow).maximum - options.max_width
            if excess <= 0:
                break
        hosts = max((cell_len(row.host) for row in self.rows), default=0)
        host_width = max(HOST_MIN, hosts - excess) if excess > 0 else None  # long names cut
        yield self._table(dropped, expand=True, host_width=host_width)

    def _columns(self, dropped: set[str]) -> list[str]:
        rows = self.rows
        columns = ["task", "host", "pid", "state"]
        if any(row.gpus != "-" for row in rows):
            columns.append("GPUs")
        if any(row.gpu_use for row in rows):  # only where nvidia-smi answered
            columns.append("GPU use")
        shown = [row.progress for row in rows if row.progress is not None]
        if any(p.step is not None for p in shown):  # a task that reports its metrics
            columns.extend(STEP_COLUMNS)
        if any(p.cpu is not None or p.rss is not None for p in shown):  # sampled by its host
            columns.extend(("trend", "CPU", "RSS") if "trend" not in columns else ("CPU", "RSS"))
        columns.append("uptime")
        if any(row.restarts for row in rows):
            columns.append("restarts")
        if self.quiet is not None:
            columns.append("quiet")
        return [c for c in columns if c not in dropped]

    def _table(self, dropped: set[str], *, expand: bool, host_width: int | None = None) -> Table:
        columns = self._columns(dropped)
        table = Table(expand=expand, pad_edge=False)
        for name in columns:
            number = name in NUMBERS
            table.add_column(
                name,
                no_wrap=True,
                justify="right" if number else "left",
                max_width=host_width if name == "host" else None,
            )
        table.add_column(
            "last line", overflow="ellipsis", no_wrap=True, ratio=1, min_width=LAST_LINE_MIN
        )
        for row in self.rows:
            cells = self._cells(row)
            last = Text(row.last_line) if expand else Text()  # measured at its minimum
            table.add_row(*(cells[c] for c in columns), last)
        return table

    def _cells(self, row: TaskRow) -> dict[str, RenderableType]:
        quiet = self.quiet(row) if self.quiet is not None else 0.0
        p = row.progress or TaskProgress()
        return {
            "step": p.step_text(),
            "steps/s": p.rate_text(),
            "ETA": p.eta_text(),
            "loss": p.loss_text(),
            "trend": Text(p.loss_spark or p.cpu_spark, style="cyan"),
            "CPU": p.cpu_text(),
            "RSS": p.rss_text(),
            "task": Text(row.name, style=task_colour(row.label)),
            "host": Text(row.host, overflow="ellipsis"),
            "pid": str(row.pid or "-"),
            "state": Text(state_text(row), style=_state_style(row)),
            "GPUs": row.gpus,
            "GPU use": row.gpu_use or "-",
            "uptime": _uptime(row, self.now),
            "restarts": str(row.restarts),
            "quiet": _clock_text(quiet) if row.state == protocol.STATE_RUNNING else "-",
        }


@dataclass(frozen=True)
class Heard:
    """What the view heard of each task's log: when its last line came (view clock) and how
    many lines it printed, by TaskRow.label."""

    at: Mapping[str, float]
    lines: Mapping[str, int]
    now: float

    def quiet(self, row: TaskRow) -> float:
        return max(0.0, self.now - self.at.get(row.label, self.now))


def region_rows(height: int) -> int:
    """Lines the live region (table and status) may take: a third of the terminal, and at
    least 4 lines, stay for the log lines that scroll above it."""
    return max(1, height - max(4, height // 3))


def task_panel(
    rows: Sequence[TaskRow], lines: int, heard: Heard, now: float | None = None
) -> list[RenderableType]:
    """What stands above the status line in at most `lines` lines: every task's row when they
    fit, else the folded summary. Every part is one line per row (no cell wraps)."""
    if len(rows) + CHROME_ROWS <= lines:
        return [TaskTable(rows, now)]
    tally = tally_lines((row.name.partition(":")[0], state_text(row)) for row in rows)
    counts = [_one_line(Text(line, style="" if line[0] == " " else "bold")) for line in tally]
    counts += [_one_line(Text(line, style="cyan")) for line in role_progress(rows)]
    room = lines - len(counts) - CHROME_ROWS - 1  # 1: the line that counts the folded rest
    if room < 1:
        return [*counts[:lines]]
    folded = fold(rows, room, lambda row: _interest(row, heard), state_text)
    rest = _one_line(Text(more_line(folded), style="dim"))
    return [*counts, TaskTable(folded.shown, now, heard.quiet), rest]


def role_progress(rows: Sequence[TaskRow]) -> list[str]:
    """Per role, what its tasks report, for a folded table: the slowest step (and the total),
    the mean steps/s, loss and CPU, the largest RSS."""
    roles: dict[str, list[TaskProgress]] = {}
    for row in rows:
        if row.progress is not None:
            roles.setdefault(row.name.partition(":")[0], []).append(row.progress)
    lines = []
    for role, found in roles.items():
        parts = []
        steps = [p.step for p in found if p.step is not None]
        if steps:
            total = next((p.total_steps for p in found if p.total_steps), None)
            parts.append(f"step {min(steps)}{f'/{total}' if total else ''} (slowest)")
        for label, values, text in (
            ("steps/s", [p.rate for p in found if p.rate is not None], "{:.3g}"),
            ("loss", [p.loss for p in found if p.loss is not None], "{:.4g}"),
            ("CPU", [p.cpu for p in found if p.cpu is not None], "{:.0f}%"),
        ):
            if values:
                parts.append(f"{label} {text.format(sum(values) / len(values))} (mean)")
        rss = [p.rss for p in found if p.rss is not None]
        if rss:
            parts.append(f"RSS {TaskProgress(rss=max(rss)).rss_text()} (max)")
        if parts:
            lines.append(f"  {role}: {', '.join(parts)}")
    return lines


def _one_line(text: Text) -> Text:
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _interest(row: TaskRow, heard: Heard) -> tuple[int, float]:
    """Smallest first: failed, then restarted, then silent (longest first, in 10 s steps so the
    rows do not reorder on every frame), then the running tasks that printed fewest lines (the
    slowest, as far as their logs tell), then starting ones, then the finished."""
    running = row.state == protocol.STATE_RUNNING
    if row.failed or row.state == protocol.STATE_LOST:
        return 0, 0.0
    if row.restarts and row.state != protocol.STATE_EXITED:
        return 1, 0.0
    quiet = heard.quiet(row) if running else 0.0
    if running and quiet >= SILENT_AFTER_S:
        return 2, -(quiet // 10)
    if running:
        return 3, heard.lines.get(row.label, 0)
    if row.state != protocol.STATE_EXITED:
        return 4, 0.0
    return 5, 0.0
