"""Where the API's events go: nowhere by default, or to a View the caller passes.

A library must not write to stdout unasked (a notebook cell, an Airflow task log), so `up` and
`check` without a view are quiet; `PlainView(sys.stdout)` gives the CLI's plain, line-per-event
output, and any object with the View methods receives the events itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from deployer.watch.board import TaskRow
from deployer.watch.view import View


class QuietView:
    """Drops every event: the API's default."""

    def step(self, text: str) -> None:
        pass

    def lines(self, label: str, lines: Sequence[str]) -> None:
        pass

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        pass

    def close(self) -> None:
        pass


class LazyView:
    """A view made on its first event: a live display starts only once there is something to
    show, so a mistake found before any host is touched leaves the terminal as it was.
    Closing a view never made does nothing; closing twice closes once."""

    def __init__(self, make: Callable[[], View]) -> None:
        self._make = make
        self._view: View | None = None
        self._closed = False

    def _get(self) -> View:
        if self._view is None:
            self._view = self._make()
        return self._view

    def step(self, text: str) -> None:
        self._get().step(text)

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self._get().lines(label, lines)

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        self._get().tasks(rows)

    def close(self) -> None:
        if self._view is not None and not self._closed:
            self._closed = True
            self._view.close()
