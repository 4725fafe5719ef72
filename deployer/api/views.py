"""Where the API's events go: nowhere by default, or to a View the caller passes.

A library must not write to stdout unasked (a notebook cell, an Airflow task log), so `up` and
`check` without a view are quiet; `PlainView(sys.stdout)` gives the CLI's plain, line-per-event
output, and any object with the View methods receives the events itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TextIO

from deployer.watch import view as watch
from deployer.watch.board import TaskRow
from deployer.watch.progress import Progress, report

if TYPE_CHECKING:
    from rich.console import Console


class View(Protocol):
    """What `view=` needs: the four methods the API promises (docs/api.md). A view may also
    have the newer `phase(text)` (what goes on until the next step, for a status line); it is
    called where present, so a view written for an older release keeps working."""

    def step(self, text: str) -> None: ...
    def lines(self, label: str, lines: Sequence[str]) -> None: ...
    def tasks(self, rows: Sequence[TaskRow]) -> None: ...
    def close(self) -> None: ...


class QuietView:
    """Drops every event: the API's default."""

    def step(self, text: str) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def progress(self, progress: Progress) -> None:
        pass

    def lines(self, label: str, lines: Sequence[str]) -> None:
        pass

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        pass

    def close(self) -> None:
        pass


class _Adapted:
    """A caller's view as the deployment's View: `phase` only where the view has one."""

    def __init__(self, view: View) -> None:
        self._view = view
        self._phase: Callable[[str], None] | None = getattr(view, "phase", None)

    def step(self, text: str) -> None:
        self._view.step(text)

    def phase(self, text: str) -> None:
        if self._phase is not None:
            self._phase(text)

    def progress(self, progress: Progress) -> None:
        report(self._view, progress)  # only where the caller's view has `progress`

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self._view.lines(label, lines)

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        self._view.tasks(rows)

    def close(self) -> None:
        self._view.close()


def events_to(view: View | None) -> watch.Display:
    """The deployment's view for a caller's `view=` (None: quiet)."""
    return QuietView() if view is None else _Adapted(view)


class LazyView:
    """A view made on its first event: a live display starts only once there is something to
    show, so a mistake found before any host is touched leaves the terminal as it was.
    Closing a view never made does nothing; closing twice closes once."""

    def __init__(self, make: Callable[[], watch.Display]) -> None:
        self._make = make
        self._view: watch.Display | None = None
        self._closed = False

    def _get(self) -> watch.Display:
        if self._view is None:
            self._view = self._make()
        return self._view

    def step(self, text: str) -> None:
        self._get().step(text)

    def phase(self, text: str) -> None:
        self._get().phase(text)

    def progress(self, progress: Progress) -> None:
        report(self._get(), progress)

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self._get().lines(label, lines)

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        self._get().tasks(rows)

    def close(self) -> None:
        if self._view is not None and not self._closed:
            self._closed = True
            self._view.close()


def terminal_view(console: Console, out: TextIO) -> View:
    """What `tfdeploy up` shows: the live view (a task table, a status line) when `console` is a
    terminal, else one plain line per event written to `out`; made on its first event
    (LazyView), so a mistake found before any host is touched leaves the terminal as it was."""
    return LazyView(lambda: watch.make_view(console, out))
