"""An evaluator that fails is never silent: `up` on scripted hosts and a fake clock (harness.py).

Reported when it happens (named, how it ended, its last lines), in `up`'s last line, and in
`status`/`status --json`; `evaluator_failure = "fail"` makes it fail the job. No wait for
evaluators that already ended. The lab runs the same with real processes
(tests/integration/test_evaluator.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from deployer.api.render import status_json, status_table
from deployer.core.errors import JobFailed
from deployer.hosts.reply_types import TaskStatus
from deployer.results.runs import HostRun
from deployer.watch.board import failed_evaluator
from tests.support.fakehost import RecordingView
from tests.support.harness import TWO_WORKERS, Harness
from tests.support.helpers import load

WITH_EVALUATOR = TWO_WORKERS + (
    '\n[[hosts]]\nname = "e"\naddress = "192.0.2.3"\ntasks = [{ role = "evaluator" }]\n'
)


class TimedView(RecordingView):
    """Also keeps when (on the fake clock) each step was shown."""

    def __init__(self, clock: object) -> None:
        super().__init__()
        self.clock = clock
        self.times: list[float] = []

    def step(self, text: str) -> None:
        super().step(text)
        self.times.append(self.clock())  # type: ignore[operator]

    def when(self, start: str) -> float:
        return next(t for s, t in zip(self.steps, self.times, strict=True) if s.startswith(start))


def outcome(steps: list[str]) -> str:
    """The line before `up`'s next steps (the run id and its commands, always last)."""
    return steps[max(i for i, s in enumerate(steps) if s.startswith("next, for run")) - 1]


def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: str = "") -> Harness:
    h = Harness(tmp_path, WITH_EVALUATOR.replace("[job]\n", f"[job]\n{job}"), monkeypatch)
    h.view = TimedView(h.clock)
    return h


def test_a_failed_evaluator_is_reported_at_once_and_in_the_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness(tmp_path, monkeypatch)
    a, b, e = h.hosts["a"], h.hosts["b"], h.hosts["e"]
    start = h.clock.now

    def script(now: float) -> None:
        if now >= start + 3 and e.tasks["evaluator:0"].state == "running":
            e.write("evaluator:0", "loading checkpoint\nKeyError: 'evaluator'\n")
            e.exit("evaluator:0", 1)
        if now >= start + 20 and a.tasks["worker:0"].state == "running":
            a.exit("worker:0")
            b.exit("worker:1")

    assert h.run(script) == 0  # evaluator_failure = "report" (the default): the job stands
    view = h.view
    assert isinstance(view, TimedView)
    report = next(s for s in view.steps if s.startswith("evaluator:0@e failed"))
    assert report.startswith("evaluator:0@e failed (exit code 1); its last 2 log lines:\n")
    assert "    KeyError: 'evaluator'" in report
    assert 'evaluator_failure = "report"' in report
    assert view.when("evaluator:0@e failed") < start + 5  # when it happened, not at the end
    assert view.when("job succeeded") >= start + 20
    assert (
        "job succeeded: worker:0 and worker:1 exited 0, but the evaluator failed "
        "(evaluator:0@e: exit code 1); stopping the rest" in view.steps
    )
    assert (
        outcome(view.steps)
        == "the job succeeded, but the evaluator failed (evaluator:0@e: exit code 1)"
    )
    assert not any(s.startswith("waiting up to") for s in view.steps)  # it had ended already
    assert sum(s.startswith("evaluator:0@e failed") for s in view.steps) == 1  # reported once


def test_evaluator_failure_fail_makes_it_fail_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness(tmp_path, monkeypatch, 'evaluator_failure = "fail"\n')
    a, e = h.hosts["a"], h.hosts["e"]

    def fail() -> None:
        e.write("evaluator:0", "no checkpoint\n")
        e.exit("evaluator:0", -9, signal=9)

    with pytest.raises(JobFailed) as info:
        h.run(h.at(3, fail))
    assert info.value.message.startswith("evaluator:0@e failed (killed by signal 9); its last 1")
    assert "    no checkpoint" in info.value.message
    assert info.value.hint and info.value.hint.startswith("the other tasks were stopped")
    assert a.tasks["worker:0"].reason == "stopped"  # the workers did not run on


def test_evaluator_failure_fail_also_after_the_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failing during evaluator_grace (its last evaluation) fails the job too."""
    h = harness(tmp_path, monkeypatch, 'evaluator_failure = "fail"\nevaluator_grace = 30\n')
    a, b, e = h.hosts["a"], h.hosts["b"], h.hosts["e"]
    start = h.clock.now

    def script(now: float) -> None:
        if a.tasks["worker:0"].state == "running" and now >= start + 5:
            a.exit("worker:0")
            b.exit("worker:1")
        if e.tasks["evaluator:0"].state == "running" and now >= start + 12:
            e.exit("evaluator:0", 3)

    with pytest.raises(JobFailed) as info:
        h.run(script)
    assert info.value.message.startswith(
        "evaluator:0@e failed after the training succeeded (exit code 3)"
    )
    assert "waiting up to 30 s (evaluator_grace) until evaluator:0 finishes" in h.view.steps


def test_a_running_evaluator_gets_its_grace_and_one_that_finishes_is_no_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness(tmp_path, monkeypatch, "evaluator_grace = 30\n")
    a, b, e = h.hosts["a"], h.hosts["b"], h.hosts["e"]
    start = h.clock.now

    def script(now: float) -> None:
        if a.tasks["worker:0"].state == "running" and now >= start + 5:
            a.exit("worker:0")
            b.exit("worker:1")
        if e.tasks["evaluator:0"].state == "running" and now >= start + 12:
            e.write("evaluator:0", "test_accuracy=0.97\n")
            e.exit("evaluator:0")

    assert h.run(script) == 0
    assert "waiting up to 30 s (evaluator_grace) until evaluator:0 finishes" in h.view.steps
    assert (
        outcome(h.view.steps) == "job succeeded: worker:0 and worker:1 exited 0; stopping the rest"
    )
    assert not any("failed" in s for s in h.view.steps)


def test_an_evaluator_still_running_after_its_grace_is_stopped_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness(tmp_path, monkeypatch, "evaluator_grace = 10\n")
    a, b, e = h.hosts["a"], h.hosts["b"], h.hosts["e"]

    def finish() -> None:
        a.exit("worker:0")
        b.exit("worker:1")

    assert h.run(h.at(5, finish)) == 0  # the evaluator evaluates forever (Estimator, no max_steps)
    assert (
        "evaluator:0 still running after 10 s (evaluator_grace): stopping it with the rest"
        in h.view.steps
    )
    assert e.tasks["evaluator:0"].reason == "stopped"
    assert (
        outcome(h.view.steps) == "job succeeded: worker:0 and worker:1 exited 0; stopping the rest"
    )


def test_the_evaluator_failure_key_is_checked(tmp_path: Path) -> None:
    from deployer.core.errors import InventoryError

    text = WITH_EVALUATOR.replace("[job]\n", '[job]\nevaluator_failure = "ignore"\n')
    with pytest.raises(InventoryError) as info:
        load(tmp_path, text)
    assert "job.evaluator_failure: expected 'report' or 'fail', got 'ignore'" in str(info.value)
    assert load(tmp_path, WITH_EVALUATOR).job.evaluator_failure == "report"


# -- status: runs read back from the hosts -------------------------------------------------------

T0 = 1_790_000_000.0


def host_runs(evaluator: TaskStatus) -> list[HostRun]:
    worker = TaskStatus("worker:0", "exited", 4101, exit_code=0, started=T0, ended=T0 + 30)
    return [
        HostRun("h1", "j-20260101T000000Z-ab12", "j", T0, False, (worker,)),
        HostRun("h3", "j-20260101T000000Z-ab12", "j", T0, False, (evaluator,)),
    ]


@pytest.mark.parametrize(
    ("evaluator", "failed"),
    [
        (TaskStatus("evaluator:0", "exited", 4, exit_code=1, started=T0, ended=T0 + 2), True),
        (TaskStatus("evaluator:0", "exited", 4, -9, 9, started=T0, ended=T0 + 2), True),
        (TaskStatus("evaluator:0", "lost", 4, started=T0), True),
        (TaskStatus("evaluator:0", "exited", 4, exit_code=0, started=T0, ended=T0 + 40), False),
        # stopped by tfdeploy after evaluator_grace: not a failure of its own
        (
            TaskStatus("evaluator:0", "exited", 4, signal=15, reason="stopped", started=T0),
            False,
        ),
        (TaskStatus("evaluator:0", "running", 4, started=T0), False),
    ],
    ids=["exit-1", "signal-9", "lost", "exit-0", "stopped-by-tfdeploy", "running"],
)
def test_status_shows_a_failed_evaluator(evaluator: TaskStatus, failed: bool) -> None:
    runs = host_runs(evaluator)
    assert failed_evaluator(evaluator) == failed
    doc = json.loads(status_json(runs))
    assert [r["failed_evaluators"] for r in doc["runs"]] == [[], ["evaluator:0"] if failed else []]
    console = Console(width=120, color_system=None, file=__import__("io").StringIO())
    console.print(status_table(runs))
    heading = console.file.getvalue().splitlines()[0]  # type: ignore[attr-defined]
    assert ("; evaluator failed: evaluator:0 " in heading) == failed, heading
    # a worker that failed is the job's failure, not an evaluator's
    worker = TaskStatus("worker:0", "exited", 4, exit_code=1, started=T0, ended=T0 + 2)
    assert not failed_evaluator(worker)
