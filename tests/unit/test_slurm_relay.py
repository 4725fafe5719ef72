"""The Slurm warning signal's relay on a node (remote/relay.py), with the real agent and real
task processes: only the running tasks of the named allocation get it, by their recorded process
groups; a task of another allocation of the same user in the same workdir, and a stray process
that carries a supervisor's name, are never touched. Signal 0 lists what is left."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.agent import (
    AGENT,
    PYTHON,
    new_run,
    ok,
    raw_call,
    runs_dir,
    wait_for,
    wait_state,
)

# Writes "got" into its run's code folder on SIGUSR1, then goes on; `exec` keeps one process.
TRAPPING = "trap 'echo got > usr1' USR1; while :; do sleep 0.1; done"


def start_in_allocation(
    workdir: Path, run_id: str, job_id: str, command: str = TRAPPING
) -> dict[str, Any]:
    """One task started by an agent running as a step of allocation `job_id` would."""
    new_run(workdir, run_id)
    request = {"v": 1, "op": "start", "workdir": str(workdir), "run_id": run_id, "grace": 1}
    request["tasks"] = [{"name": "worker:0", "command": command}]
    reply = ok(raw_call(json.dumps(request).encode(), env={"SLURM_JOB_ID": job_id}))
    [task] = reply["tasks"]
    return dict(task)


def signal_tasks(workdir: Path, signal: str, job_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-S", str(AGENT), "signal-tasks", str(workdir), signal, job_id],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_only_the_allocations_running_tasks_get_the_warning(workdir: Path, tmp_path: Path) -> None:
    ours = start_in_allocation(workdir, "r-ours", "111")
    theirs = start_in_allocation(workdir, "r-theirs", "222")
    # A process named as a supervisor is (`tfd-supervisor`) that no run recorded.
    stray = subprocess.Popen(
        ["bash", "-c", f"exec -a tfd-supervisor bash -c {TRAPPING!r}"], cwd=tmp_path
    )
    try:
        listed = signal_tasks(workdir, "0", "111")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines() == ["r-ours worker-0: running"]

        sent = signal_tasks(workdir, "USR1", "111")
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.splitlines() == ["r-ours worker-0: SIGUSR1"]
        runs = workdir.glob("hosts/*/runs")
        [runs_dir] = list(runs)
        wait_for(lambda: (runs_dir / "r-ours/code/usr1").exists(), timeout=10)
        assert not (runs_dir / "r-theirs/code/usr1").exists()
        assert not (tmp_path / "usr1").exists()
        assert stray.poll() is None  # untouched, still running
        assert ours["pgid"] != theirs["pgid"]
    finally:
        stray.kill()
        stray.wait()


def test_a_name_that_is_no_signal_is_refused_and_signals_nothing(workdir: Path) -> None:
    start_in_allocation(workdir, "r1", "111")
    result = signal_tasks(workdir, "NOSUCH", "111")
    assert result.returncode == 2
    assert "'NOSUCH' is not a signal name" in result.stderr
    assert signal_tasks(workdir, "0", "111").stdout.splitlines() == ["r1 worker-0: running"]


def test_a_workdir_without_runs_lists_nothing(tmp_path: Path) -> None:
    result = signal_tasks(tmp_path / "never-used", "USR1", "111")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_a_task_that_saves_and_exits_0_on_the_warning_ended_preempted_not_succeeded(
    workdir: Path,
) -> None:
    """Its exit 0 after the warning is no success: the work was cut by the time limit. Its
    supervisor records the end as `preempted` with a time-limit notice, from the marker the
    relay wrote before the signal; a later attempt of the task starts without it."""
    start_in_allocation(workdir, "r1", "111", "trap 'echo saved; exit 0' USR1; sleep 600 & wait")
    assert signal_tasks(workdir, "USR1", "111").returncode == 0
    done = wait_state(workdir, "worker:0", "exited", timeout=10)
    assert (done["exit_code"], done["reason"]) == (0, "preempted")
    assert done["notice"]["action"] == "time-limit"
    assert done["notice"]["time"].endswith("Z")
    log = (runs_dir(workdir) / "r1/tasks/worker-0/output.log").read_text()
    assert "saved" in log and "ended after the scheduler's warning (SIGUSR1)" in log
