"""on_failure = "restart-job" on scripted hosts: TF's own fault tolerance, a whole-job restart.

Decided by the first failure (a signal or 128+ is retried, 1-127 is a bug), bounded by
max_restarts, spaced by a doubling backoff, and interruptible like any other phase. The lab's
real-TensorFlow version (a SIGKILLed MWMS worker, resumed from a checkpoint) is in
tests/integration/test_restart_job.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from deployer.core.errors import Interrupted, InventoryError, JobFailed
from deployer.up.recovery import Recovery
from remote import protocol
from tests.support.harness import TWO_WORKERS, Harness
from tests.support.helpers import plan


def restart_job(**keys: object) -> str:
    """`up`'s own restart-job (keeper = false, as where a source replaces hosts; a keeper's:
    tests/integration/test_keeper.py)."""
    keys = {"on_failure": '"restart-job"', "restart_backoff": 4, "keeper": "false", **keys}
    lines = "[job]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
    return TWO_WORKERS.replace("[job]\n", lines)


def kill_once_then_finish(
    h: Harness, killed: list[float], *, code: int = -9, signal: int | None = 9
) -> Callable[[float], None]:
    """worker:1 on b dies 5 s after it started (once); tasks of a later attempt end 0 at once."""
    a, b = h.hosts["a"], h.hosts["b"]

    def script(now: float) -> None:
        if not killed and b.tasks["worker:1"].started + 5 <= now:
            killed.append(now)
            b.write("worker:1", "step 40\n")
            b.exit("worker:1", code, signal=signal)
        elif killed and b.tasks["worker:1"].env.get("TFDEPLOY_ATTEMPT") != "0":
            for host, name in ((a, "worker:0"), (b, "worker:1")):
                if host.tasks[name].state == "running":
                    host.exit(name)

    return script


def test_a_killed_worker_restarts_the_whole_job_which_then_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, restart_job(), monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]
    killed: list[float] = []
    assert h.run(kill_once_then_finish(h, killed)) == 0
    assert len(killed) == 1
    # both tasks started twice, the second time as attempt 1
    assert [len(x.ops("start")) for x in (a, b)] == [2, 2]
    assert a.tasks["worker:0"].env["TFDEPLOY_ATTEMPT"] == "1"
    first = a.ops("start")[0]["tasks"][0]["env"]["TFDEPLOY_ATTEMPT"]
    assert first == "0"
    # between attempts every task was stopped by name, with whatever escaped it
    between = a.ops("stop")[0]
    assert between["tasks"] == ["worker:0"] and between["escaped"] is True
    assert a.ops("stop")[-1]["tasks"] is None  # only the teardown stops the whole run
    step = next(s for s in h.view.steps if "restarting the whole job" in s)
    assert step.startswith("worker:1@b killed by signal 9: restarting the whole job (restart 1")
    assert "TFDEPLOY_ATTEMPT=1) in 4 s" in step
    assert any(line.startswith("worker:1@b | step 40") for line in h.view.output)
    assert "job succeeded: worker:0 and worker:1 exited 0" in h.view.steps


def test_a_bug_fails_at_once_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, restart_job(), monkeypatch)
    with pytest.raises(JobFailed) as info:
        h.run(kill_once_then_finish(h, [], code=2, signal=None))
    message = info.value.message
    assert message.startswith("worker:1@b failed with a permanent error, not restarted")
    assert "(exit code 2)" in message
    assert all(len(x.ops("start")) == 1 for x in h.hosts.hosts.values())


def test_retry_exit_codes_choose_which_codes_are_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, restart_job(retry_exit_codes="[2]"), monkeypatch)
    assert h.run(kill_once_then_finish(h, [], code=2, signal=None)) == 0
    assert len(h.hosts["b"].ops("start")) == 2


@pytest.mark.parametrize(("code", "signal"), [(137, None), (-9, 9)], ids=["exit-137", "sigkill"])
def test_retry_exit_codes_keep_signals_and_128_plus_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, signal: int | None
) -> None:
    """Issue 28 item 3: listing codes adds to the rule "signals and 128+ always"; it used to
    replace it, so an OOM-killed task (137) failed as a permanent error."""
    h = Harness(tmp_path, restart_job(retry_exit_codes="[75]"), monkeypatch)
    assert h.run(kill_once_then_finish(h, [], code=code, signal=signal)) == 0
    assert len(h.hosts["b"].ops("start")) == 2


def test_a_code_outside_retry_exit_codes_names_the_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, restart_job(retry_exit_codes="[75]"), monkeypatch)
    with pytest.raises(JobFailed) as info:
        h.run(kill_once_then_finish(h, [], code=2, signal=None))
    assert "(signals, exit codes 128+ and retry_exit_codes = [75] are retried)" in (
        info.value.message
    )


def test_the_first_failure_decides_not_its_consequences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed MWMS worker's peers exit 1 with UnavailableError: still a restart."""
    h = Harness(tmp_path, restart_job(), monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]
    done: list[bool] = []

    def script(now: float) -> None:
        if not done and now >= 1005:
            done.append(True)
            b.exit("worker:1", -9, signal=9)
            h.clock.now += 1
            a.write("worker:0", "UnavailableError: peer gone\n")
            a.exit("worker:0", 1)
        elif done and a.tasks["worker:0"].env["TFDEPLOY_ATTEMPT"] == "1":
            for host, name in ((a, "worker:0"), (b, "worker:1")):
                if host.tasks[name].state == "running":
                    host.exit(name)

    assert h.run(script) == 0
    assert len(a.ops("start")) == 2


def test_the_noticed_host_is_replaced_when_a_peer_that_saved_with_it_ended_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spot notice's checkpoint is saved by every worker (TF's PreemptionCheckpointHandler,
    examples/digits/mwms.py), and a peer that exits 143 before the noticed task is the first
    failure; the noticed task's machine is the one going away, so it is the one replaced."""
    h = Harness(tmp_path, restart_job(), monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]
    replaced: list[str] = []
    monkeypatch.setattr(Recovery, "replace", lambda self, name: replaced.append(name))
    done: list[bool] = []

    def script(now: float) -> None:
        if not done and now >= 1005:
            done.append(True)
            a.exit("worker:0", 143)  # saved on its peer's notice, and ended first
            h.clock.now += 1
            b.exit("worker:1", 143)
            b.tasks["worker:1"].reason = protocol.REASON_PREEMPTED
        elif done and a.tasks["worker:0"].env["TFDEPLOY_ATTEMPT"] == "1":
            for host, name in ((a, "worker:0"), (b, "worker:1")):
                if host.tasks[name].state == "running":
                    host.exit(name)

    assert h.run(script) == 0
    step = next(s for s in h.view.steps if "restarting the whole job" in s)
    assert step.startswith("worker:0@a exit code 143"), step
    assert replaced == ["b"]


def test_max_restarts_bounds_the_attempts_and_the_backoff_doubles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, restart_job(max_restarts=2), monkeypatch)
    b = h.hosts["b"]
    kills: list[float] = []

    def always_killed(now: float) -> None:
        task = b.tasks["worker:1"]
        if task.state == "running" and now >= task.started + 3:
            kills.append(now)
            b.exit("worker:1", 137)

    with pytest.raises(JobFailed) as info:
        h.run(always_killed)
    assert len(kills) == 3 and len(b.ops("start")) == 3
    assert "worker:1@b [attempt 2] failed; no restart left (max_restarts = 2)" in info.value.message
    steps = [s for s in h.view.steps if "restarting the whole job" in s]
    assert [s.split(" in ")[-1].split(",")[0] for s in steps] == ["4 s", "8 s"]


def test_ctrl_c_during_the_backoff_stops_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, restart_job(restart_backoff=60), monkeypatch)
    b = h.hosts["b"]
    state: dict[str, float] = {}

    def script(now: float) -> None:
        if "killed" not in state and now >= 1005:
            state["killed"] = now
            b.exit("worker:1", -9, signal=9)
        elif "killed" in state and now >= state["killed"] + 20:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as info:
        h.run(script)
    assert info.value.exit_status == 130
    for host in h.hosts.hosts.values():
        assert len(host.ops("start")) == 1  # nothing of attempt 1 ever started
        assert host.ops("stop")[-1]["tasks"] is None  # the teardown's whole-run stop
        assert all(t.state == "exited" for t in host.tasks.values())


def test_down_during_the_backoff_ends_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, restart_job(), monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]
    state: dict[str, float] = {}

    def script(now: float) -> None:
        if "killed" not in state and now >= 1005:
            state["killed"] = now
            b.exit("worker:1", -9, signal=9)
        elif "killed" in state and "down" not in state:
            state["down"] = now
            for host in (a, b):  # what `tfdeploy down RUN` from another shell does
                host._op_stop({"run_id": h.deployment.run_id})

    with pytest.raises(JobFailed) as info:
        h.run(script)
    assert "was stopped from elsewhere (`tfdeploy down`); nothing of it starts again" in (
        info.value.message
    )


def test_restart_one_task_is_refused_for_mwms(tmp_path: Path) -> None:
    text = TWO_WORKERS.replace("[job]\n", '[job]\non_failure = "restart"\n')
    with pytest.raises(InventoryError) as info:
        plan(tmp_path, text)
    assert info.value.key == "job.on_failure"
    assert 'use on_failure = "restart-job"' in (info.value.hint or "")
    with_ps = text + '\n[[hosts]]\nname = "p"\naddress = "192.0.2.3"\ntasks = [{ role = "ps" }]\n'
    assert plan(tmp_path, with_ps).job.on_failure == "restart"


@pytest.mark.parametrize(
    ("keys", "key", "expected"),
    [
        ({"retry_exit_codes": '["x"]'}, "job.retry_exit_codes[0]", "an exit code"),
        ({"retry_exit_codes": "[3, 3]"}, "job.retry_exit_codes", "lists an entry twice"),
        ({"retry_exit_codes": "[256]"}, "job.retry_exit_codes[0]", "an exit code (0-255)"),
        (
            {"retry_exit_codes": "[1, 99999999999999999]"},
            "job.retry_exit_codes[1]",
            "an exit code (0-255), got number 99999999999999999",
        ),
        ({"retry_exit_codes": "[-1]"}, "job.retry_exit_codes[0]", "an exit code (0-255)"),
        ({"restart_backoff": "-1"}, "job.restart_backoff", "at least 0"),
        ({"on_failure": '"restart-all"'}, "job.on_failure", "'restart-job'"),
    ],
)
def test_restart_job_keys_are_checked(
    tmp_path: Path, keys: dict[str, str], key: str, expected: str
) -> None:
    with pytest.raises(InventoryError) as info:
        plan(tmp_path, restart_job(**keys))
    assert info.value.key == key and expected in info.value.expected, info.value.message
