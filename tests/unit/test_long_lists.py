"""A step naming many tasks stays one short line: 150 tasks on a host made `starting ...`,
`watching; the job ends when ...` and `job succeeded: ...` 1,800 characters each (issue 39)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from deployer.core.fold import fold_names
from deployer.watch.view import PlainView
from tests.support.harness import Harness
from tests.support.helpers import JOB

TASKS = 150


def test_a_step_naming_150_tasks_is_folded_to_a_short_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = ", ".join(['{ role = "worker" }'] * TASKS)
    text = JOB + f'[[hosts]]\nname = "a"\naddress = "192.0.2.1"\ntasks = [{tasks}]\n'
    h = Harness(tmp_path, text, monkeypatch)
    out = io.StringIO()
    h.view = PlainView(out)  # type: ignore[assignment]  # the CLI's own printing path
    a = h.hosts["a"]

    def finish() -> None:
        for i in range(TASKS):
            a.exit(f"worker:{i}")

    assert h.run(h.at(3, finish)) == 0
    steps = [line for line in out.getvalue().splitlines() if line.startswith("tfdeploy: ")]
    folded = "worker:0, worker:1, worker:2, worker:3, worker:4, worker:5, worker:6, worker:7"
    for head in ("starting ", "watching; the job ends when ", "job succeeded: "):
        [line] = [s for s in steps if s.startswith(f"tfdeploy: {head}")]
        assert len(line) < 200, line
        assert folded in line and "and 142 more (142 worker)" in line, line


def test_few_names_are_all_shown_and_others_are_counted_by_role() -> None:
    assert fold_names(["worker:0", "worker:1"]) == "worker:0 and worker:1"
    names = [f"worker:{i}" for i in range(10)] + ["ps:0", "ps:1"]
    assert fold_names(names, 2, join=", ".join) == "worker:0, worker:1 and 10 more (8 worker, 2 ps)"
    hosts = [f"h{i}" for i in range(12)]
    assert fold_names(hosts, 3) == "h0, h1, h2 and 9 more"  # no roles: only a count
