"""Warnings before a host source's time limit (a Slurm allocation's): what the view says, once each.

A job that hits its allocation's time limit is killed by the scheduler mid-step; a user who was
told ten minutes before can still save, and one whose tasks checkpoint on the warning signal
(`[slurm] signal`) should see that it went out. Three notes per deadline, in order, each said
once by the tick that first finds it due:

- "ends in 9m58s": when the time left falls to WARN_S (or a quarter of the time there was when
  the run started, for short limits), or to twice the signal's lead when that is longer;
- "SIGUSR1 goes to the tasks now": at the signal's lead;
- "reached its time limit": at the limit itself; Slurm is ending the tasks.

Pure: the times come in, the sentences go out (watch/loop.py shows them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from deployer.config.sources import Deadline
from deployer.core.text import duration

WARN_S = 600.0  # the first warning, for limits long enough to have one this early
_Text = Callable[[float], str]  # the note, given the seconds left


@dataclass
class DeadlineNotes:
    """The notes of the run's deadlines, said once each; `due(now)` returns the new ones."""

    deadlines: tuple[Deadline, ...]
    started: float  # Unix seconds when watching began: a short limit is warned at a quarter
    said: set[tuple[str, str]] = field(default_factory=set)

    def due(self, now: float) -> list[str]:
        notes = []
        for deadline in self.deadlines:
            for kind, at, text in self._marks(deadline):
                if now >= at and (deadline.what, kind) not in self.said:
                    self.said.add((deadline.what, kind))
                    notes.append(text(max(0.0, deadline.ends_at - now)))
        return notes

    def _marks(self, d: Deadline) -> list[tuple[str, float, _Text]]:
        lead = float(d.signal[1]) if d.signal else 0.0
        first = max(min(WARN_S, (d.ends_at - self.started) / 4), 2 * lead)
        marks: list[tuple[str, float, _Text]] = [
            ("warn", d.ends_at - first, lambda left: _warning(d, left)),
        ]
        if d.signal:
            name = d.signal[0]
            marks.append(
                (
                    "signal",
                    d.ends_at - lead,
                    lambda left: (
                        f"{d.what}: its time limit is in {duration(left)}; the tasks "
                        f"get SIG{name} now, to save a checkpoint"
                    ),
                )
            )
        marks.append(
            (
                "limit",
                d.ends_at,
                lambda _left: f"{d.what} reached its time limit: Slurm ends its tasks now",
            )
        )
        return marks


def _warning(d: Deadline, left: float) -> str:
    then = (
        f"; SIG{d.signal[0]} goes to the tasks {duration(d.signal[1])} before" if d.signal else ""
    )
    return f"{d.what} ends in {duration(left)} (its time limit){then}"
