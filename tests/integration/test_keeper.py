"""A run keeps its failure policy: its keeper, beside the hosts, restarts and ends it, detached
or attached (an attached `up` is then its keeper's client: killed or asleep, it loses nothing).

The task is TF-shaped (tests/support/standin.py; no TensorFlow: the subject is tfdeploy's
keeper): it reads TF_CONFIG, binds its port, checkpoints a step counter in its run and resumes
from it, and ends 0 after its last step, as examples/digits does with a real checkpoint.
"""

from __future__ import annotations

import ipaddress
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.webhook import Receiver
from tests.lab import Lab
from tests.lab.base import wait_until
from tests.support import standin
from tests.support.faults import Up, pids_of, tfdeploy

pytestmark = pytest.mark.lab

STEPS = 40
RUNNING_AGAIN = r"running again [0-9.]+ s after the failure was seen: its keeper restarted it"

# The stand-in's steps, 0.25 s each (tests/support/standin.py): a lease of 6 s is 24 steps.
STANDIN = f"{standin.NAME} --interval 0.25"
_step = standin.step_on  # a task's saved step on its host


def _inventory(
    lab: Lab, lab_inventory: Any, tmp_path: Path, steps: int = STEPS, **job: Any
) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    standin.write(code)
    table = {
        "name": "kept",
        "command": f"{lab.python} {STANDIN} {steps}",
        "on_failure": "restart-job",
        "max_restarts": 2,
        "restart_backoff": 1,
        "stop_grace": 2,
        # Shorter than the run: the keeper's polls must renew it, or the hosts stop the run.
        "lease_seconds": 6,
    } | job
    return lab_inventory([[{"role": "worker"}]] * 2, code=code, job=table)  # type: ignore[no-any-return]


def _up_kept(inventory: Path, state: Path) -> str:
    """`up --detach`, which must say the run went to its keeper; the run's id."""
    up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    found = re.search(r"run (\S+) is running detached, kept by its keeper on (\S+):", up.stdout)
    assert found, up.stdout
    return found.group(1)


def _status(inventory: Path, run_id: str, tmp_path: Path) -> list[dict[str, Any]]:
    out = tfdeploy(
        "status", run_id, "-i", str(inventory), "--json", state=tmp_path / "look", check_rc=0
    )
    return [dict(t, host=r["host"]) for r in json.loads(out.stdout)["runs"] for t in r["tasks"]]


def _recoveries(inventory: Path, run_id: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The keeper's restarts as `status RUN --json` reports them (from the keeper's host)."""
    out = tfdeploy(
        "status", run_id, "-i", str(inventory), "--json", state=tmp_path / "look", check_rc=0
    )
    return [x for r in json.loads(out.stdout)["runs"] for x in r["recoveries"]]


def _keeper_events(lab: Lab, host: Any, run_id: str) -> list[dict[str, Any]]:
    """What the keeper recorded in its run folder (workdir ~/.tfdeploy, as the lab writes it)."""
    found = lab.run(host, ["sh", "-c", f"cat ~/.tfdeploy/hosts/*/runs/{run_id}/keeper.json"])
    events: list[dict[str, Any]] = json.loads(found.stdout)["events"]
    return events


def _wait_for_the_end(lab: Lab, host: Any, run_id: str, timeout: float) -> None:
    """Until the keeper on `host` has recorded the run's end."""

    def ended() -> bool:
        events = _keeper_events(lab, host, run_id)
        return bool(events) and "ended" in events[-1]

    wait_until("the keeper to end the run", ended, timeout=timeout, interval=0.5)


@pytest.mark.isolated
def test_a_detached_run_restarts_by_itself_after_a_killed_worker_and_ends_succeeded(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """`up --detach` of a restart-job job, then one worker SIGKILLed on its host with no
    tfdeploy command running: the keeper stops the attempt, starts every task again
    (TFDEPLOY_ATTEMPT=1), both resume from their checkpoints and end 0; `status` reads one
    restart each; `down` exits 0; the keeper and wardens leave (issue 59: nothing restarted a
    detached run, and the other worker finished alone)."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path)
    run_id = _up_kept(inventory, tmp_path / "state")
    wait_until("worker:1 to pass step 8", lambda: _step(lab, h2, run_id, "worker:1") >= 8, 60)
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])

    _wait_for_the_end(lab, h1, run_id, 120)
    tasks = _status(inventory, run_id, tmp_path)
    assert {(t["name"], t["exit_code"], t["restarts"]) for t in tasks} == {
        ("worker:0", 0, 1),
        ("worker:1", 0, 1),
    }, tasks
    logs = tfdeploy("logs", run_id, "-i", str(inventory), state=tmp_path / "look", check_rc=0)
    assert re.search(r"worker 1 attempt 1 resumed from step (\d+)", logs.stdout), logs.stdout
    assert f"worker 0 done at step {STEPS}" in logs.stdout
    assert f"worker 1 done at step {STEPS}" in logs.stdout
    # The recovery, as `status` says it: its cause, and when the tasks ran and trained again.
    [recovery] = _recoveries(inventory, run_id, tmp_path)
    assert recovery["attempt"] == 1 and recovery["task"] is None, recovery
    assert recovery["cause"] == "worker:1 was killed by signal 9", recovery
    started, stepping = recovery["started_after_s"], recovery["stepping_after_s"]
    assert started >= recovery["backoff"] and stepping >= started, recovery
    shown = tfdeploy("status", run_id, "-i", str(inventory), state=tmp_path / "look", check_rc=0)
    assert re.search(
        r"restart 1 \(worker:1 was killed by signal 9\): running again [0-9.]+ s later, "
        r"training again [0-9.]+ s later",
        shown.stdout,
    ), shown.stdout
    # The history of the machine that started it: the first look records its end.
    tfdeploy("status", run_id, state=tmp_path / "state", check_rc=0)
    history = tfdeploy("runs", "--json", state=tmp_path / "state", check_rc=0)
    [mine] = [r for r in json.loads(history.stdout)["runs"] if r["run_id"] == run_id]
    assert (mine["outcome"], mine["restarts"]) == ("succeeded", 1), mine
    events = _keeper_events(lab, h1, run_id)
    restarts = [e for e in events if "restart_job" in e]
    assert [e["cause"] for e in restarts] == ["worker:1 was killed by signal 9"], events
    assert events[-1]["ended"]["outcome"] == "succeeded", events
    # The keeper and both wardens leave with the run; `down` then has nothing left to stop.
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    wait_until("h2's warden to leave", lambda: not lab.leftovers(h2, 0), timeout=30)
    # The keeper's end dropped the lease its polls renewed: no host says the run is held (for
    # lease_seconds it did, and prune kept the ended run as one that "may still run").
    look = tfdeploy("status", run_id, "-i", str(inventory), "--json", state=tmp_path / "look")
    runs = json.loads(look.stdout)["runs"]
    assert len(runs) == 2 and not any(r["leased"] or r["kept"] for r in runs), runs
    tfdeploy("down", run_id, "-i", str(inventory), state=tmp_path / "look", check_rc=0)


@pytest.mark.isolated
def test_down_stops_a_kept_run_its_keeper_and_its_wardens(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """`down` of a kept run stops the keeper and the wardens first (no restart races the stop),
    then the tasks; and the run outlived several of its lease periods before (the keeper's
    polls renew it)."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path)
    run_id = _up_kept(inventory, tmp_path / "state")
    began = time.monotonic()
    wait_until(
        "worker:0 to pass step 30 (7.5 s: past the 6 s lease)",
        lambda: _step(lab, h1, run_id, "worker:0") >= 30,
        60,
    )
    assert time.monotonic() - began >= 6  # physics: 30 steps of 0.25 s
    tasks = _status(inventory, run_id, tmp_path)
    assert {t["state"] for t in tasks} == {"running"}, tasks
    tfdeploy("down", run_id, "-i", str(inventory), state=tmp_path / "fresh", check_rc=0)
    for host in (h1, h2):
        assert not pids_of(lab, host, standin.NAME)
        assert not lab.leftovers(host, 10), lab.leftovers(host)


@pytest.mark.isolated
def test_a_kept_run_waits_for_a_lost_host_and_restarts_the_job_when_it_is_back(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """The keeper's host loses contact with another host of the run for longer than the lease:
    that host's tasks stop by their lease, the keeper restarts the job once the host answers
    again (each restart that finds it still silent takes the next backoff), and the run ends
    succeeded, resumed from the checkpoints."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path, max_restarts=6)
    run_id = _up_kept(inventory, tmp_path / "state")
    wait_until("worker:1 to pass step 8", lambda: _step(lab, h2, run_id, "worker:1") >= 8, 60)
    lab.cut_link(h2)
    try:
        # Unreachable, h2 stops its task when the keeper's heartbeat (its lease) lapses.
        wait_until("h2's lease to lapse", lambda: not pids_of(lab, h2, standin.NAME), 60)

        def restarting() -> bool:
            return any("restart_job" in e for e in _keeper_events(lab, h1, run_id))

        wait_until("the keeper to restart the job", restarting, 60, interval=0.5)
    finally:
        lab.restore_link(h2)

    _wait_for_the_end(lab, h1, run_id, 180)
    events = _keeper_events(lab, h1, run_id)
    assert events[-1]["ended"]["outcome"] == "succeeded", events
    causes = [e["cause"] for e in events if "restart_job" in e]
    assert causes[0].startswith(f"host {h2.name} was lost"), causes
    tasks = _status(inventory, run_id, tmp_path)
    assert {(t["name"], t["exit_code"]) for t in tasks} == {("worker:0", 0), ("worker:1", 0)}
    logs = tfdeploy("logs", run_id, "-i", str(inventory), state=tmp_path / "look", check_rc=0)
    assert re.search(r"worker 1 attempt \d+ resumed from step", logs.stdout), logs.stdout
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    wait_until("h2's warden to leave", lambda: not lab.leftovers(h2, 0), timeout=30)


@pytest.mark.isolated
def test_a_kept_run_between_two_attempts_is_not_over(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """In a restart's backoff every task has exited, yet the run goes on: `status` must not
    record an end (`runs` would say stopped while the keeper starts the next attempt), and
    `down` stops the run there and then, keeper included, instead of "nothing to stop"."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path, restart_backoff=120)
    state = tmp_path / "state"
    run_id = _up_kept(inventory, state)
    wait_until("worker:1 to pass step 4", lambda: _step(lab, h2, run_id, "worker:1") >= 4, 60)
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])

    def backing_off() -> bool:
        stopped = not pids_of(lab, h1, standin.NAME) and not pids_of(lab, h2, standin.NAME)
        return stopped and any("restart_job" in e for e in _keeper_events(lab, h1, run_id))

    wait_until("the keeper's backoff, every task stopped", backing_off, 60, interval=0.5)
    tfdeploy("status", str(inventory), state=state, check_rc=0)
    runs = tfdeploy("runs", "--json", state=state, check_rc=0)
    [mine] = [r for r in json.loads(runs.stdout)["runs"] if r["run_id"] == run_id]
    assert mine["outcome"] == "running", mine
    down = tfdeploy("down", run_id, "-i", str(inventory), state=state, check_rc=0)
    assert f"stopped run {run_id}" in down.stdout, down.stdout
    for host in (h1, h2):
        assert not lab.leftovers(host, 10), lab.leftovers(host)


def _attached(inventory: Path, state: Path) -> tuple[Up, str]:
    """An attached `up`, once it said the run went to its keeper; the run's id."""
    up = Up(inventory, state=state)
    up.wait_for(r"is kept by its keeper on \S+: its failure policy")
    return up, up.run_id()


@pytest.mark.isolated
def test_an_attached_up_killed_mid_run_leaves_the_run_to_its_keeper(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Issue 59: an attached `up` SIGKILLed mid-run took its run with it (the hosts stopped the
    tasks when its lease lapsed). Now the run's keeper holds the lease: the run finishes, `status`
    reads both tasks exited 0, and the keeper and wardens leave with the run."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path)
    up, run_id = _attached(inventory, tmp_path / "state")
    wait_until("worker:1 to pass step 8", lambda: _step(lab, h2, run_id, "worker:1") >= 8, 60)
    up.proc.kill()
    up.finish()

    _wait_for_the_end(lab, h1, run_id, 120)
    tasks = _status(inventory, run_id, tmp_path)
    assert {(t["name"], t["exit_code"], t["reason"]) for t in tasks} == {
        ("worker:0", 0, "exited"),
        ("worker:1", 0, "exited"),
    }, tasks  # exited by themselves: not stopped by a lapsed lease
    assert _keeper_events(lab, h1, run_id)[-1]["ended"]["outcome"] == "succeeded"
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    wait_until("h2's warden to leave", lambda: not lab.leftovers(h2, 0), timeout=30)


@pytest.mark.isolated
def test_an_attached_up_asleep_past_four_leases_and_cut_off_finds_its_run_going_and_exits_0(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Issue 59: an attached `up` SIGSTOPped past its lease with its traffic dropped found its
    tasks stopped by their lease. Now, stopped while every packet between it and the hosts is
    dropped (the hosts still reach each other) for as long as four leases, it finds the tasks
    never stopped, catches up the lines it missed and exits 0 when the job ends."""
    lab = clean_lab
    hosts = lab.hosts[:2]
    lease = 6
    steps = 4 * lease * 4 + 40  # 0.25 s a step: four leases asleep, and some after
    inventory = _inventory(lab, lab_inventory, tmp_path, steps=steps)
    up, run_id = _attached(inventory, tmp_path / "state")
    wait_until("worker:0 to pass step 4", lambda: _step(lab, hosts[0], run_id, "worker:0") >= 4)
    asleep_at = _step(lab, hosts[0], run_id, "worker:0")
    up.proc.send_signal(signal.SIGSTOP)
    try:
        for h in hosts:
            lab.cut_controller(h)
        four_leases = asleep_at + 4 * lease * 4
        wait_until(
            "four leases of progress with the controller asleep and cut off",
            lambda: _step(lab, hosts[0], run_id, "worker:0") >= four_leases,
            timeout=4 * lease * 3,
        )
        assert all(pids_of(lab, h, standin.NAME) for h in hosts)  # never stopped
    finally:
        for h in hosts:
            lab.restore_controller(h)
        up.proc.send_signal(signal.SIGCONT)
    assert up.finish(timeout=120) == 0, up.report()
    for index in (0, 1):
        assert f"worker {index} done at step {steps}" in up.stdout, up.report()
    # The lines written while it slept were caught up, not skipped.
    assert f"step {four_leases - 1}" in up.stdout, up.report()
    assert "lease expired" not in up.stdout + up.stderr, up.report()
    for h in hosts:
        assert not lab.leftovers(h, 10), lab.leftovers(h)


@pytest.mark.isolated
def test_an_attached_up_shows_its_keepers_restart_and_fails_when_none_is_left(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """The keeper restarts a kept attached run, not the `up` (one policy, never two restarts
    for one failure): `up` says so, as it said its own restarts, and watches the job run again;
    with no restart left it fails the job (the keeper's verdict too); nothing is left behind."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path, steps=400, max_restarts=1)
    up, run_id = _attached(inventory, tmp_path / "state")
    for attempt in (0, 1):
        up.wait_for(rf"worker 1 attempt {attempt} ")
        wait_until("worker:1 to take a step", lambda: _step(lab, h2, run_id, "worker:1") >= 2)
        [victim] = pids_of(lab, h2, standin.NAME)
        lab.run(h2, ["kill", "-KILL", str(victim)])
        if attempt == 0:
            up.wait_for(RUNNING_AGAIN)
    assert up.finish(timeout=120) == 1, up.report()
    said = up.stdout + " ".join(up.stderr.split())
    assert (
        said.count("restarting the whole job (restart 1 of 1, TFDEPLOY_ATTEMPT=1), by its keeper")
        == 1
    ), up.report()
    assert f"worker:1@{h2.name} [attempt 1] failed; no restart left (max_restarts = 1)" in said, (
        up.report()
    )
    events = _keeper_events(lab, h1, run_id)
    assert [e["restart_job"] for e in events if "restart_job" in e] == [1], events
    for h in (h1, h2):
        assert not lab.leftovers(h, 10), lab.leftovers(h)


def _attach(run_id: str, inventory: Path, tmp_path: Path) -> Up:
    """`tfdeploy attach RUN -i INVENTORY` from another shell (no local record of the run)."""
    watcher = Up(run_id, "-i", str(inventory), state=tmp_path / "other", verb="attach")
    watcher.wait_for(rf"attached to run {re.escape(run_id)}: its keeper holds its failure policy")
    return watcher


@pytest.mark.isolated
def test_attach_shows_a_detached_runs_restart_by_its_keeper_and_exits_with_its_outcome(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """`tfdeploy attach` opens the live view of a detached kept run from any shell: the tasks'
    lines as they come, the keeper's restart after a worker is SIGKILLed on its host (attach
    restarts nothing itself), and its exit is the run's outcome (0: succeeded)."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path)
    run_id = _up_kept(inventory, tmp_path / "state")
    watcher = _attach(run_id, inventory, tmp_path)
    watcher.wait_for(r"worker:1@\S+ \| step 8$")
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])
    watcher.wait_for(
        r"restarting the whole job \(restart 1 of 2, TFDEPLOY_ATTEMPT=1\), by its keeper", 30
    )
    watcher.wait_for(RUNNING_AGAIN, 60)
    watcher.wait_for(r"worker:1@\S+ \[attempt 1\] \| worker 1 attempt 1 resumed from step", 30)
    assert watcher.finish(timeout=120) == 0, watcher.report()
    assert re.search(r"job succeeded: worker:0 and worker:1 exited 0", watcher.stdout), (
        watcher.report()
    )
    events = _keeper_events(lab, h1, run_id)
    assert [e["cause"] for e in events if "restart_job" in e] == [
        "worker:1 was killed by signal 9"
    ], events  # one restart: the keeper's, none of attach's
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    wait_until("h2's warden to leave", lambda: not lab.leftovers(h2, 0), timeout=30)


@pytest.mark.isolated
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_leaving_attach_leaves_the_run_running(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, signum: signal.Signals
) -> None:
    """attach owns nothing: Ctrl-C, SIGTERM or a closed terminal ends attach (128 + the
    signal) and says how to stop the run, which goes on, leased by its keeper alone."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path, steps=400)
    run_id = _up_kept(inventory, tmp_path / "state")
    watcher = _attach(run_id, inventory, tmp_path)
    watcher.wait_for(r"worker:0@\S+ \| step 2$")
    watcher.proc.send_signal(signum)
    assert watcher.finish() == 128 + signum, watcher.report()
    assert f"left run {run_id} running: tfdeploy down {run_id} stops it" in watcher.stdout
    before = _step(lab, h1, run_id, "worker:0")
    wait_until(  # past the 6 s lease: attach's polls never renewed it, the keeper's do
        "worker:0 to go on 30 steps",
        lambda: _step(lab, h1, run_id, "worker:0") >= before + 30,
        60,
    )
    assert {t["state"] for t in _status(inventory, run_id, tmp_path)} == {"running"}
    tfdeploy("down", run_id, "-i", str(inventory), state=tmp_path / "other", check_rc=0)
    for host in (h1, h2):
        assert not lab.leftovers(host, 10), lab.leftovers(host)


@pytest.mark.isolated
def test_a_detached_teardown_run_is_kept_too_and_its_keeper_stops_the_rest_at_a_failure(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """A detached run whose policy tears down has a keeper too (issue 59: before, nobody
    applied it, and the other worker ran on alone): a killed worker ends the run, its keeper
    stops the other, and attach ends with the job's failure (exit 1), naming the task."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path, steps=400, on_failure="teardown")
    run_id = _up_kept(inventory, tmp_path / "state")
    watcher = Up(run_id, "-i", str(inventory), state=tmp_path / "other", verb="attach")
    watcher.wait_for(r"attached to run \S+: its keeper holds its failure policy")
    watcher.wait_for(r"worker:1@\S+ \| step 2$")
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])
    assert watcher.finish() == 1, watcher.report()
    assert re.search(r"worker:1@\S+ .*killed by signal 9", watcher.stderr), watcher.report()
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    wait_until("h2's warden to leave", lambda: not lab.leftovers(h2, 0), timeout=30)
    states = {t["name"]: t for t in _status(inventory, run_id, tmp_path)}
    assert states["worker:0"]["state"] == "exited", states  # not left running to step 400
    assert states["worker:0"]["reason"] == "stopped", states
    events = _keeper_events(lab, h1, run_id)
    ended = events[-1]["ended"]
    assert (ended["outcome"], ended["why"]) == ("failed", "worker:1 was killed by signal 9"), events
    assert not [e for e in events if "restart_job" in e or "restart" in e], events
    tfdeploy("down", run_id, "-i", str(inventory), state=tmp_path / "other", check_rc=0)


def test_a_detached_runs_keeper_stops_its_ps_once_the_chief_is_done(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """A PSS-shaped detached run (teardown): once the chief exits 0, its keeper stops the ps
    server and ends the run succeeded (issue 59: nobody did, and the ps ran until `down`)."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    code = tmp_path / "code"
    code.mkdir()
    standin.write(code)
    table = {
        "name": "kept",
        "command": f"{lab.python} {STANDIN} 8",
        "role_commands": {"ps": f"{lab.python} {STANDIN} 100000"},  # never ends by itself
        "stop_grace": 2,
        "lease_seconds": 6,
    }
    inventory = lab_inventory([[{"role": "chief"}], [{"role": "ps"}]], code=code, job=table)
    run_id = _up_kept(inventory, tmp_path / "state")
    _wait_for_the_end(lab, h1, run_id, 60)
    assert _keeper_events(lab, h1, run_id)[-1]["ended"]["outcome"] == "succeeded"
    states = {t["name"]: t for t in _status(inventory, run_id, tmp_path)}
    assert (states["chief:0"]["state"], states["chief:0"]["exit_code"]) == ("exited", 0), states
    assert (states["ps:0"]["state"], states["ps:0"]["reason"]) == ("exited", "stopped"), states
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    wait_until("h2's ps and warden to leave", lambda: not lab.leftovers(h2, 0), timeout=30)
    tfdeploy("status", run_id, state=tmp_path / "state", check_rc=0)  # the first look records it
    history = tfdeploy("runs", "--json", state=tmp_path / "state", check_rc=0)
    [mine] = [r for r in json.loads(history.stdout)["runs"] if r["run_id"] == run_id]
    assert mine["outcome"] == "succeeded", mine


@pytest.fixture
def hook(lab: Lab) -> Iterator[Receiver]:
    """A webhook receiver on this machine's address on the lab's bridge (the hosts reach it)."""
    network = ipaddress.ip_network(f"{lab.hosts[0].address}/24", strict=False)
    with Receiver(str(network.network_address + 1)) as receiver:
        yield receiver


@pytest.mark.isolated
def test_a_kept_runs_keeper_tells_its_recovery_and_end_to_the_webhook_and_the_command(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, hook: Receiver
) -> None:
    """[job.notify]: `up --detach` tells `started`; the keeper, with no tfdeploy command
    running, tells `recovered` after it restarted the job and `finished` at its end, to the
    webhook and through the command on its host, with the run id, the cause and the outcome."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    told = "/tmp/told-" + tmp_path.name
    command = f'echo "$TFDEPLOY_EVENT $TFDEPLOY_RUN_ID $TFDEPLOY_OUTCOME" >> {told}'
    notify = {"webhook": hook.url, "command": command}
    inventory = _inventory(lab, lab_inventory, tmp_path, notify=notify)
    run_id = _up_kept(inventory, tmp_path / "state")
    started = hook.wait_for("started")
    assert (started["run_id"], started["by"].startswith("up on "), started["job"]) == (
        run_id,
        True,
        "kept",
    )
    wait_until("worker:1 to pass step 8", lambda: _step(lab, h2, run_id, "worker:1") >= 8, 60)
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])
    recovered = hook.wait_for("recovered")
    assert (recovered["by"], recovered["why"], recovered["attempt"]) == (
        "keeper",
        "worker:1 was killed by signal 9",
        1,
    )
    finished = hook.wait_for("finished", timeout=120)
    assert (finished["by"], finished["outcome"], finished["run_id"]) == (
        "keeper",
        "succeeded",
        run_id,
    )
    # The keeper leaves once its last word is told both ways: the command has run by then.
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    lines = lab.run(h1, ["cat", told]).stdout.splitlines()
    assert lines == [f"recovered {run_id} running", f"finished {run_id} succeeded"], lines


@pytest.mark.isolated
def test_an_up_that_holds_its_run_tells_its_failure_and_a_failing_webhook_is_said_unnamed(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, hook: Receiver
) -> None:
    """A run `up` holds (no keeper): `up` tells `started` and `failed` itself; a webhook that
    answers 500 is said (its host only: the URL's token is never printed) and fails nothing."""
    lab = clean_lab
    hook.status = 500
    inventory = _inventory(
        lab,
        lab_inventory,
        tmp_path,
        on_failure="teardown",
        keeper=False,
        steps=400,
        notify={"webhook": hook.url, "events": ["started", "failed"]},
    )
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"worker:1@\S+ \| step 2$")
    [victim] = pids_of(lab, lab.hosts[1], standin.NAME)
    lab.run(lab.hosts[1], ["kill", "-KILL", str(victim)])
    assert up.finish() == 1, up.report()
    failed = hook.wait_for("failed")
    assert failed["outcome"] == "failed" and "worker:1" in failed["why"], failed
    assert [d["event"] for d in hook.received] == ["started", "failed"]
    said = up.stdout + up.stderr
    host = hook.url.split("/")[2].split(":")[0]
    assert f"notification started: the webhook at {host} answered HTTP 500" in said, said
    assert "SECRET-TOKEN" not in said


@pytest.mark.isolated
def test_an_attached_kept_run_is_ended_by_its_keeper_who_tells_finished_once(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, hook: Receiver
) -> None:
    """An attached `up` of a kept run lets its keeper end the run (the servers' stop, its end
    told) before its own teardown, which would cut the keeper short: `finished` comes once,
    from the keeper, and `up` exits 0."""
    lab = clean_lab
    inventory = _inventory(lab, lab_inventory, tmp_path, steps=8, notify={"webhook": hook.url})
    up = Up(inventory, state=tmp_path / "state")
    assert up.finish(timeout=120) == 0, up.report()
    finished = hook.wait_for("finished")
    assert (finished["by"], finished["outcome"]) == ("keeper", "succeeded"), finished
    assert [d["event"] for d in hook.received] == ["started", "finished"], hook.received


@pytest.mark.isolated
def test_attach_to_a_restart_job_run_nobody_keeps_fails_saying_so(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """keeper = false, detached, restart-job: nobody applies the policy; attach says so and
    exits 1 at the first failure (it used to end with an internal error)."""
    lab = clean_lab
    inventory = _inventory(lab, lab_inventory, tmp_path, steps=400, keeper=False)
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    found = re.search(r"\(run (\S+)\)$", up.stdout, re.MULTILINE)
    assert found, up.stdout
    run_id = found.group(1)
    watcher = Up(run_id, "-i", str(inventory), state=tmp_path / "other", verb="attach")
    watcher.wait_for(r"worker:1@\S+ \| step 2$")
    [victim] = pids_of(lab, lab.hosts[1], standin.NAME)
    lab.run(lab.hosts[1], ["kill", "-KILL", str(victim)])
    assert watcher.finish() == 1, watcher.report()
    assert "nothing restarts the job" in watcher.stderr, watcher.report()
    assert "internal error" not in watcher.stderr
    tfdeploy("down", run_id, "-i", str(inventory), state=tmp_path / "other", check_rc=0)


@pytest.mark.isolated
def test_logs_follow_of_a_kept_run_goes_on_through_its_keepers_backoff(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """In a restart's backoff every task of a kept run has exited: `logs -f` used to end there
    ("run R ended: ... killed by signal 9") while the keeper was about to start the next
    attempt. It follows until the keeper is done with the run."""
    lab = clean_lab
    h2 = lab.hosts[1]
    inventory = _inventory(lab, lab_inventory, tmp_path, restart_backoff=4)
    run_id = _up_kept(inventory, tmp_path / "state")
    follower = Up(run_id, "-i", str(inventory), "-f", state=tmp_path / "other", verb="logs")
    follower.wait_for(r"worker:1@\S+ \| step 4$")
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])
    assert follower.finish(timeout=120) == 0, follower.report()
    said = follower.stdout
    assert re.search(r"worker 1 attempt 1 resumed from step \d+", said), follower.report()
    assert f"worker 1 done at step {STEPS}" in said, follower.report()


@pytest.mark.isolated
def test_run_wait_of_a_kept_run_waits_through_its_keepers_backoff(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Run.wait()` (a pipeline's next step) used to return in the keeper's backoff, with the
    killed worker's failure, while the keeper restarted the job: it waits for the run's end."""
    from deployer import api

    lab = clean_lab
    h2 = lab.hosts[1]
    inventory = _inventory(lab, lab_inventory, tmp_path, restart_backoff=4)
    run_id = _up_kept(inventory, tmp_path / "state")
    wait_until("worker:1 to pass step 4", lambda: _step(lab, h2, run_id, "worker:1") >= 4, 60)
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "other"))
    result = api.attach(run_id, inventory=str(inventory)).wait(timeout=120, interval=0.5)
    assert {(t.task, t.outcome, t.succeeded) for t in result.tasks} == {
        ("worker:0", "exit code 0", True),
        ("worker:1", "exit code 0", True),
    }, result.tasks


@pytest.mark.isolated
def test_attach_waits_out_an_ups_restart_backoff_longer_than_the_lease(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """A run its `up` holds (keeper = false): a restart's backoff longer than the lease used
    to let the lease lapse on the hosts, so attach said the `up` had ended the run. The `up`
    renews the lease through the backoff; attach watches the restart and exits 0 with it."""
    lab = clean_lab
    h2 = lab.hosts[1]
    job = {"keeper": False, "restart_backoff": 12, "lease_seconds": 5}
    inventory = _inventory(lab, lab_inventory, tmp_path, **job)
    up = Up(inventory, state=tmp_path / "state")
    run_id = up.run_id()
    up.wait_for(r"worker:1@\S+ \| step 2$")
    watcher = Up(run_id, "-i", str(inventory), state=tmp_path / "other", verb="attach")
    watcher.wait_for(r"attached to run \S+: the `up` that started it holds its failure policy")
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])
    watcher.wait_for(r"running again [0-9.]+ s after the failure was seen: its `up` restarted", 60)
    assert watcher.finish(timeout=120) == 0, watcher.report()
    assert up.finish(timeout=120) == 0, up.report()


@pytest.mark.isolated
def test_attach_after_a_restart_counts_the_runs_restarts(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """attach to a run its keeper restarted once already: its lines are `[attempt 1]`'s and the
    next restart is `restart 2 of 2`, the run's count, not one from zero."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    inventory = _inventory(lab, lab_inventory, tmp_path, steps=80)
    run_id = _up_kept(inventory, tmp_path / "state")
    wait_until("worker:1 to pass step 4", lambda: _step(lab, h2, run_id, "worker:1") >= 4, 60)
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])

    def restarted() -> bool:
        return any("started" in e for e in _keeper_events(lab, h1, run_id))

    wait_until("the keeper's restart", restarted, 60, interval=0.5)
    watcher = _attach(run_id, inventory, tmp_path)
    watcher.wait_for(r"worker:1@\S+ \[attempt 1\] \| step \d+$", 60)
    [victim] = pids_of(lab, h2, standin.NAME)
    lab.run(h2, ["kill", "-KILL", str(victim)])
    watcher.wait_for(
        r"restarting the whole job \(restart 2 of 2, TFDEPLOY_ATTEMPT=2\), by its keeper", 30
    )
    assert watcher.finish(timeout=180) == 0, watcher.report()
    # The keeper and both wardens leave with the run, after `attach` read its end.
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    wait_until("h2's warden to leave", lambda: not lab.leftovers(h2, 0), timeout=30)
