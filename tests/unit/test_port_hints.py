"""Issue 47: a busy TF port names the run holding it, whose run it is, and whether it runs.

The hint said "another `up` of this job is starting" for every reservation, also when the
holder was a running run of another job: the user waited for an `up` that did not exist.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config.model import Job
from deployer.push.sync import Manifest
from deployer.up.preflight import host_problems

OURS = "train-20261128T101500Z-ab12"
THEIRS = "bert-20261128T090000Z-cd34"


def problem(holder: str, state: str | None) -> tuple[str, str]:
    facts: dict[str, object] = {
        "busy_ports": [2222],
        "reserved_by": {"2222": holder},
        "tensorflow": "2.21.0",
        "disk_free": 1 << 40,
    }
    if state is not None:
        facts["reserved_state"] = {"2222": state}
    job = Job(name="train", code=Path("."), role_commands={})
    [found] = host_problems(
        "h1", facts, python="python3", job=job, manifest=Manifest(Path("."), ())
    )
    return found.message, found.hint or ""


def test_a_running_run_of_another_job_is_named_as_running() -> None:
    message, hint = problem(THEIRS, "running")
    assert (
        message == f"h1: TF port(s) 2222 already in use: run {THEIRS} (a run of another job) is "
        "running there"
    )
    assert (
        hint == f"stop that run (`tfdeploy down {THEIRS}`) or give this job another port (job.port)"
    )
    assert "starting" not in message + hint


def test_a_reservation_without_tasks_says_its_up_is_preparing_it_or_ended() -> None:
    message, hint = problem(OURS, "starting")
    # The host knows no task of it started, not that its `up` still lives (issue 58: a
    # refused `up` that had exited was said to be starting it): both are said.
    assert (
        f"reserved by run {OURS} (another run of this job), whose `up` has started no task "
        "there: it is still preparing the run, or it ended without releasing them"
    ) in message
    assert "which an `up` is starting" not in message
    assert hint == (
        f"wait for that `up`, or stop that run (`tfdeploy down {OURS}`: it frees them at once)"
    )


@pytest.mark.parametrize("state", [None, "bogus"])
def test_an_agent_that_does_not_say_claims_neither(state: str | None) -> None:
    message, hint = problem(THEIRS, state)
    assert message.endswith(f"reserved by run {THEIRS} (a run of another job)")
    assert "starting" not in hint and "`tfdeploy status` says whether it runs" in hint
