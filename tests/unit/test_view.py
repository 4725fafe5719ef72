"""The live view on a terminal: log lines in batches, a table redrawn at a bounded rate."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from deployer.watch.board import TaskRow
from deployer.watch.view import LiveView, PlainView, prefixed
from tests.support.terminal import output, screen, terminal

ROWS = [TaskRow("worker:0", "h1", "running", 4242), TaskRow("worker:1", "h2", "running", 4343)]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def log_lines(console: Console) -> list[str]:
    """The prefixed log lines and steps as a reader sees them in the scrollback, in order
    (the live region's redrawn status line is not one of them)."""
    return [line for line in screen(console).text() if " | " in line or "tfdeploy:" in line]


def test_many_log_lines_cost_a_bounded_number_of_table_redraws() -> None:
    """5,000 lines over 500 ticks once redrew the whole table 5,500 times (one per line)."""
    console = terminal()
    started = time.monotonic()
    view = LiveView(console)
    view.tasks(ROWS)
    for tick in range(500):
        view.lines("worker:0@h1", [f"line {tick * 10 + i}" for i in range(10)])
        view.tasks(ROWS)
    view.close()
    elapsed = time.monotonic() - started
    redraws = output(console).count("┏")  # the table's top-left corner: one per render
    # At most 10 batches and 4 refreshes a second, plus the first and the last drawing.
    assert redraws <= 4 + 14 * elapsed, (redraws, elapsed)
    shown = [line for line in log_lines(console) if "line " in line]
    assert shown == [f"worker:0@h1  | line {n}" for n in range(5000)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_wait_at_most_one_period_and_steps_keep_their_place() -> None:
    console, clock = terminal(), Clock()
    view = LiveView(console, flushes_per_second=10, clock=clock)
    view.lines("worker:0@h1", ["first"])
    view.lines("ps:0@h2", ["zeroth"])
    assert log_lines(console) == []  # a tick's lines go out together, when the tick ends
    view.tasks(ROWS)
    assert log_lines(console) == ["worker:0@h1  | first", "ps:0@h2      | zeroth"]
    view.lines("ps:0@h2", ["second"])
    clock.now = 0.05
    view.tasks(ROWS)  # a tick soon after the last print: its lines wait for the next one
    assert log_lines(console)[-1] == "ps:0@h2      | zeroth"
    clock.now = 0.1  # one period later the next tick prints what waited
    view.tasks(ROWS)
    assert log_lines(console)[-1] == "ps:0@h2      | second"
    view.lines("worker:0@h1", ["third\x07 with a bell"])
    view.step("job succeeded")  # a step never overtakes lines that came before it
    view.lines("worker:1@h2", ["after"])
    view.close()
    assert log_lines(console) == [
        "worker:0@h1  | first",
        "ps:0@h2      | zeroth",
        "ps:0@h2      | second",
        "worker:0@h1  | third with a bell",
        "tfdeploy: job succeeded",
        "worker:1@h2  | after",
    ]
    same_as_rich = terminal()  # the prefix keeps the task's colour, as a rich Text has it
    same_as_rich.print(prefixed("ps:0@h2", "second", 12), end="")
    assert output(same_as_rich) in output(console)


def test_a_backlog_is_printed_once_a_megabyte_waits() -> None:
    console, clock = terminal(), Clock()
    view = LiveView(console, clock=clock)
    view.tasks(ROWS)
    chunk = [f"{i:09d}" * 10 for i in range(1000)]  # 90 kB
    for _ in range(11):
        view.lines("worker:0@h1", chunk)
    assert log_lines(console) == []  # under a megabyte: held for the end of the tick
    view.lines("worker:0@h1", chunk)
    assert len(log_lines(console)) == 12_000
    view.close()


def test_the_status_line_says_the_latest_step_and_phase_at_once() -> None:
    """Issue 29: rich redrew the region below a print with what its last timed refresh had
    rendered, so the status line said "preflight" through push, start and watching."""
    console = terminal()
    view = LiveView(console, refreshes_per_second=0.01)  # no timed refresh during the test
    shown = []
    for step in ("preflight of 2 hosts: h1, h2", "preflight ok", "pushed 5 files to 2 hosts"):
        view.step(step)
        shown.append(screen(console).display())
    view.phase("teardown: stopping run r1 on 2 hosts")  # a phase: the status line only
    shown.append(screen(console).display())
    view.tasks(ROWS)
    view.step("watching; the job ends when worker:0 and worker:1 exit")
    shown.append(screen(console).display())
    view.close()
    statuses = [[line for line in lines if line.startswith("tfdeploy:")][-1] for lines in shown]
    assert statuses == [
        "tfdeploy: preflight of 2 hosts: h1, h2",
        "tfdeploy: preflight ok",
        "tfdeploy: pushed 5 files to 2 hosts",
        "tfdeploy: teardown: stopping run r1 on 2 hosts",
        "tfdeploy: watching; the job ends when worker:0 and worker:1 exit",
    ]
    scrollback = log_lines(console)
    assert "tfdeploy: teardown: stopping run r1 on 2 hosts" not in scrollback
    assert scrollback[-1] == "tfdeploy: watching; the job ends when worker:0 and worker:1 exit"


def test_plain_mode_stays_one_line_per_event_at_any_number_of_tasks() -> None:
    out = io.StringIO()
    view = PlainView(out)
    many = [TaskRow(f"worker:{i}", f"h{i + 1}", "running", 100 + i) for i in range(256)]
    view.phase("pushing the code to 256 hosts")  # the status line's, not an event
    view.tasks(many)
    view.tasks(many)  # nothing changed: nothing to say
    view.lines("worker:3@h4", ["a line"])
    view.step("watching")
    lines = out.getvalue().splitlines()
    assert len(lines) == 256 + 2
    assert lines[0] == "tfdeploy: worker:0@h1 pid 100 running"
    assert lines[-2:] == ["worker:3@h4 | a line", "tfdeploy: watching"]
