"""Warnings before a Slurm allocation's time limit (deployer/watch/deadlines.py): each note is
said once, in order, by the first look that finds it due, whatever the poll interval."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from deployer.config.sources import Deadline
from deployer.watch.deadlines import DeadlineNotes
from tests.support.harness import TWO_WORKERS, Harness

START = 1_000_000.0


def notes_over(deadline: Deadline, times: list[float]) -> list[tuple[float, str]]:
    notes = DeadlineNotes((deadline,), START)
    return [(t, note) for t in times for note in notes.due(START + t)]


def test_a_two_hour_limit_with_a_signal_warns_at_ten_minutes_then_signals_then_ends() -> None:
    d = Deadline("Slurm allocation 17", START + 7200, ("USR1", 300))
    said = notes_over(d, [0, 60, 6599, 6600, 6601, 6899, 6900, 7000, 7200, 7300])
    assert said == [
        (
            6600,
            "Slurm allocation 17 ends in 10m00s (its time limit); SIGUSR1 goes to the tasks "
            "5m00s before",
        ),
        (
            6900,
            "Slurm allocation 17: its time limit is in 5m00s; the tasks get SIGUSR1 now, to "
            "save a checkpoint",
        ),
        (7200, "Slurm allocation 17 reached its time limit: Slurm ends its tasks now"),
    ]


def test_a_short_limit_is_warned_at_a_quarter_and_a_long_lead_at_twice_the_lead() -> None:
    short = Deadline("Slurm allocation 3", START + 400)
    assert notes_over(short, [0, 299, 300])[0] == (
        300,
        "Slurm allocation 3 ends in 1m40s (its time limit)",
    )
    long_lead = Deadline("Slurm allocation 4", START + 7200, ("USR2", 900))
    first, _ = notes_over(long_lead, [5399, 5400, 6300])
    assert first[0] == 5400  # 2 x 900 s before, earlier than the ten minutes


def test_a_controller_that_looks_late_says_every_due_note_once_with_the_true_time_left() -> None:
    d = Deadline("Slurm allocation 9", START + 3600, ("USR1", 120))
    notes = DeadlineNotes((d,), START)
    late = notes.due(START + 3500)  # asleep through the warning and into the signal's time
    assert [n.split(";")[0] for n in late] == [
        "Slurm allocation 9 ends in 1m40s (its time limit)",
        "Slurm allocation 9: its time limit is in 1m40s",
    ]
    assert notes.due(START + 3501) == []
    assert notes.due(START + 3600) == [
        "Slurm allocation 9 reached its time limit: Slurm ends its tasks now"
    ]
    assert notes.due(START + 3700) == []


def test_no_deadline_no_note() -> None:
    assert DeadlineNotes((), START).due(START + 10**9) == []


def test_the_watch_shows_a_due_deadline_while_the_job_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `up`'s own watch on fake hosts: a provisioned deadline (as the Slurm source hands
    one in) is shown by the watch's first tick, before the job ends, each note once."""
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    passed = Deadline("Slurm allocation 5", time.time() - 1, ("USR1", 60))
    h.plan = dataclasses.replace(
        h.plan, inventory=dataclasses.replace(h.plan.inventory, deadlines=(passed,))
    )

    def finish() -> None:
        h.hosts["a"].exit("worker:0")
        h.hosts["b"].exit("worker:1")

    assert h.run(h.at(3, finish)) == 0
    steps = h.view.steps
    mine = [i for i, s in enumerate(steps) if s.startswith("Slurm allocation 5")]
    assert [steps[i].split(" ")[3] for i in mine] == ["ends", "its", "reached"], steps
    watching = next(i for i, s in enumerate(steps) if s.startswith("watching;"))
    succeeded = next(i for i, s in enumerate(steps) if s.startswith("job succeeded"))
    assert watching < mine[0] and mine[-1] < succeeded, steps
