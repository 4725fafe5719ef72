"""The fault matrix of issue 5: every way a run can go wrong, on the lab's real sshd hosts.

Each case runs the real CLI as a subprocess and asserts the exit code, what is printed (the failing
task or host named), and, through `clean_lab`, that no process of the run and no TF port is left on
ANY lab host; `final_states` reads the run directories back from the hosts (from a fresh shell with
no local state) and checks every task recorded how it ended.

Tasks are a tiny Python script (below) that serves its TF port and behaves as its flags say; the
PSS-shaped cases (a ps crash, a frozen worker) run the TF-shaped stand-in (tests/support/
standin.py). No TensorFlow: the subject is tfdeploy (issue 61).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab, LabHost
from tests.support import standin
from tests.support.faults import (
    _STARTED,
    Up,
    final_states,
    pids_of,
    tfdeploy,
)

pytestmark = pytest.mark.lab

REMOTE = Path(__file__).resolve().parents[2] / "remote"

# The task every non-TF case runs: binds its TF port like a TF server (so "no TF port left"
# means something), prints, sleeps, and exits as told.
TASK = r"""
import argparse, json, os, signal, socket, sys, time
p = argparse.ArgumentParser()
p.add_argument("--lines", type=int, default=0)
p.add_argument("--interval", type=float, default=0.2)
p.add_argument("--sleep", type=float, default=3600)
p.add_argument("--code", type=int, default=0)
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--no-serve", action="store_true")
p.add_argument("--fail-first", type=int, default=0)
p.add_argument("--first-attempt-sleep", type=float, default=None)  # attempt 0 sleeps this long
a = p.parse_args()
if a.first_attempt_sleep is not None and os.environ.get("TFDEPLOY_ATTEMPT", "0") == "0":
    a.sleep = a.first_attempt_sleep
name, run = os.environ["TFDEPLOY_TASK"], os.environ["TFDEPLOY_RUN_ID"]
if a.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
cfg = json.loads(os.environ.get("TF_CONFIG") or "{}")
kind, index = cfg["task"]["type"], cfg["task"]["index"]
if not a.no_serve and kind in cfg["cluster"]:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(cfg["cluster"][kind][index].rsplit(":", 1)[1])))
    server.listen()
if a.fail_first:
    marker = "/tmp/starts-" + run + "-" + name.replace(":", "-")
    with open(marker, "a") as f:
        f.write("x")
    if os.path.getsize(marker) <= a.fail_first:
        print(name, "failing on purpose, start", os.path.getsize(marker), flush=True)
        sys.exit(3)
print(name, "up in", run, flush=True)
for i in range(a.lines):
    print("n", i, flush=True)
    time.sleep(a.interval)
time.sleep(a.sleep)
sys.exit(a.code)
"""


@pytest.fixture(autouse=True)
def _no_up_left_running(clean_lab: Lab) -> Iterator[None]:
    """A test that fails half-way still interrupts its `up`, before clean_lab looks at the hosts."""
    yield
    while _STARTED:
        up = _STARTED.pop()
        if up.proc.poll() is None:
            up.proc.send_signal(signal.SIGINT)
            try:
                up.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                up.proc.kill()
                up.proc.wait()


def write_code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "task.py").write_text(TASK)
    return code


def task_inventory(
    lab: Lab,
    lab_inventory: Any,
    tmp_path: Path,
    tasks: list[list[dict[str, Any]]],
    *,
    args: str = "",
    file: str = "inventory.toml",
    **job: Any,
) -> Path:
    """An inventory whose tasks run TASK with `args` (a task's own `args` key overrides)."""
    code = write_code(tmp_path)
    command = f"{lab.python} task.py {args}".strip()
    hosts_tasks = [
        [
            {k: v for k, v in t.items() if k != "args"}
            | ({"command": f"{lab.python} task.py {t['args']}"} if "args" in t else {})
            for t in host
        ]
        for host in tasks
    ]
    table = {"name": "faults", "command": command, "stop_grace": 2, "lease_seconds": 5} | job
    table.setdefault("role_commands", {"ps": command})
    return lab_inventory(hosts_tasks, code=code, job=table, name=file)  # type: ignore[no-any-return]


def wait_until(what: str, check: Callable[[], Any], timeout: float) -> float:
    """Seconds it took for check() to become true; fails after timeout."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - began


def no_task_left(lab: Lab, hosts: list[LabHost]) -> Callable[[], bool]:
    return lambda: not any(pids_of(lab, h, "task.py") for h in hosts)


def first_error(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("error:"))


# ---- task failures ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "culprit", "outcome"),
    [
        (
            [[{"role": "worker"}], [{"role": "worker", "args": "--sleep 1 --code 1"}]],
            "worker:1",
            "exit code 1",
        ),
        (
            [[{"role": "chief", "args": "--sleep 1 --code 3"}], [{"role": "worker"}]],
            "chief:0",
            "exit code 3",
        ),
    ],
    ids=["worker-crash", "chief-crash"],
)
def test_a_crashing_task_fails_the_job_naming_it(
    clean_lab: Lab,
    lab_inventory: Any,
    tmp_path: Path,
    layout: list[list[dict[str, Any]]],
    culprit: str,
    outcome: str,
) -> None:
    lab = clean_lab
    inventory = task_inventory(lab, lab_inventory, tmp_path, layout)
    up = Up(inventory, state=tmp_path / "state")
    assert up.finish() == 1, up.report()
    host = lab.hosts[0 if culprit.startswith("chief") else 1]
    label = f"{culprit}@{host.name}"
    assert first_error(up.stderr).startswith(f"error: {label} failed ({outcome}); its last")
    states = final_states(inventory, up.run_id(), tmp_path, hosts=2)
    assert states[label]["reason"] in ("exited",)
    others = [t for k, t in states.items() if k != label]
    assert [t["reason"] for t in others] == ["stopped"]


def test_a_task_killed_by_sigkill_is_reported_as_a_signal(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    inventory = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2)
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"worker:1 up in", count=1)
    [pid] = pids_of(lab, lab.hosts[1], "task.py")
    lab.run(lab.hosts[1], ["kill", "-KILL", str(pid)])
    assert up.finish() == 1, up.report()
    label = f"worker:1@{lab.hosts[1].name}"
    assert first_error(up.stderr).startswith(f"error: {label} failed (killed by signal 9)")
    states = final_states(inventory, up.run_id(), tmp_path)
    assert (states[label]["signal"], states[label]["reason"]) == (9, "signal")


def test_ps_crash_fails_the_pss_job_naming_the_ps(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    # The ps crashes (exit 3) 5 steps after it reached every peer: the job is running by then.
    inventory = _pss_inventory(lab, lab_inventory, tmp_path, ps="--ps-exit 5")
    up = Up(inventory, state=tmp_path / "state")
    assert up.finish(timeout=60) == 1, up.report()
    label = f"ps:0@{lab.hosts[0].name}"
    assert first_error(up.stderr).startswith(f"error: {label} failed (exit code 3)")
    assert f"{label} | ps 0 crashing" in " ".join(up.stdout.split())
    final_states(inventory, up.run_id(), tmp_path, hosts=3)


@pytest.mark.isolated
def test_frozen_pss_worker_is_caught_by_the_stall_watchdog(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    h1, _, h3 = lab.hosts[:3]
    # The chief blocks on a peer at step 2, as a PSS chief waits forever on a frozen worker
    # (shared/TF_NOTES.md); worker:0 ends; worker:1 steps on until the test freezes it. Every
    # awaited task is then silent: the window only has to outlast a loaded start's peer dials.
    inventory = _pss_inventory(
        lab,
        lab_inventory,
        tmp_path,
        chief="--freeze-at 2 --fail-task chief:0",
        worker0="3",
        stall_timeout=5,
    )
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"\| chief 0 waiting on a peer", timeout=60)
    up.wait_for(r"\| worker 0 done at step")
    up.wait_for(r"worker:1@\S+\s+\| step 1$")
    [worker] = pids_of(lab, h3, standin.NAME)
    lab.freeze(h3, worker)
    # `up` ends only through the watchdog, which the error below names.
    assert up.finish(timeout=90) == 1, up.report()
    error = " ".join(up.stderr.split())
    awaited = "chief:0, worker:0, worker:1"  # the stand-in's workers are awaited, not servers
    assert f"job stalled: no awaited task ({awaited}) wrote output or exited" in error
    assert f"frozen (stopped by a signal, e.g. SIGSTOP): worker:1@{h3.name}" in error
    assert f"chief:0@{h1.name}" in error.split("silent for")[1]
    states = final_states(inventory, up.run_id(), tmp_path, hosts=3)
    assert states[f"worker:1@{h3.name}"]["signal"] == 9  # SIGTERM waits while frozen


_PSS_STEPS = 100_000  # the stand-in's steps: more than any of these tests lets it run


def _pss_inventory(
    lab: Lab,
    lab_inventory: Any,
    tmp_path: Path,
    *,
    chief: str = "",
    worker0: str = "",
    ps: str = "",
    **job: Any,
) -> Path:
    """A PSS-shaped job of stand-ins (tests/support/standin.py): chief and ps on h1, a worker on
    h2 and h3; each dials every other task first. `chief`, `ps`: their extra flags; `worker0`:
    worker:0's own steps and flags."""
    code = tmp_path / "code"
    standin.write(code)
    run = f"{lab.python} {standin.NAME}"
    command = f"{run} {_PSS_STEPS} --peers"
    return lab_inventory(  # type: ignore[no-any-return]
        [
            [{"role": "chief", "command": f"{command} {chief}".strip()}, {"role": "ps"}],
            [{"role": "worker"} | ({"command": f"{run} {worker0} --peers"} if worker0 else {})],
            [{"role": "worker"}],
        ],
        code=code,
        job={
            "name": "pssfault",
            "command": command,
            "role_commands": {"ps": f"{command} {ps}".strip()},
            "stop_grace": 2,
            "lease_seconds": 10,
            **job,
        },
    )


# ---- failure policy -----------------------------------------------------------------------


def test_restart_policy_restarts_a_failed_worker_then_gives_up(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    flaky = "--sleep 2 --fail-first 2"
    # A ps makes it a PSS-shaped job: restarting one task is refused for MWMS (restart-job).
    chief = {"role": "chief", "args": "--sleep 4"}
    layout = [[chief, {"role": "ps"}], [{"role": "worker", "args": flaky}]]
    inventory = task_inventory(
        lab, lab_inventory, tmp_path, layout, on_failure="restart", max_restarts=3
    )
    up = Up(inventory, state=tmp_path / "state")
    assert up.finish() == 0, up.report()
    label = f"worker:0@{lab.hosts[1].name}"
    for n in (1, 2):
        assert f"restarting {label} (exit code 3): restart {n} of 3" in up.stdout
    assert "restart 3 of 3" not in up.stdout
    states = final_states(inventory, up.run_id(), tmp_path)
    assert (states[label]["restarts"], states[label]["exit_code"]) == (2, 0)
    table = tfdeploy("status", up.run_id(), "-i", str(inventory), state=tmp_path / "s", check_rc=0)
    assert re.search(r"worker:0 .* 2 ", table.stdout), table.stdout  # the restarts column

    give_up = task_inventory(
        lab,
        lab_inventory,
        tmp_path,
        [[{"role": "worker", "args": "--sleep 0.5 --code 3 --no-serve"}, {"role": "ps"}]],
        on_failure="restart",
        max_restarts=1,
        file="give_up.toml",
    )
    up = Up(give_up, state=tmp_path / "state")
    assert up.finish() == 1, up.report()
    label = f"worker:0@{lab.hosts[0].name}"
    assert "restart 1 of 1" in up.stdout
    assert first_error(up.stderr).startswith(f"error: {label} failed after 1 restart (exit code 3)")


# ---- Ctrl-C in every phase -----------------------------------------------------------------


def _interrupt(up: Up, timeout: float = 30) -> float:
    """SIGINT like a terminal's Ctrl-C; returns how long `up` took to exit with 130. The
    proof that Ctrl-C cut the caller's phase (a hung connect, a capped transfer, a long
    setup, a start that never ends) is the exit 130 and the phase's own line never printed,
    which hold under any load; how quick the exit is belongs in bench/."""
    began = time.monotonic()
    up.proc.send_signal(signal.SIGINT)
    assert up.finish(timeout=timeout) == 130, up.report()
    assert "interrupted" in up.stderr and "was stopped" in up.stderr, up.stderr
    return time.monotonic() - began


@pytest.mark.isolated
def test_ctrl_c_during_preflight(clean_lab: Lab, lab_inventory: Any, tmp_path: Path) -> None:
    lab = clean_lab
    inventory = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2)
    lab.cut_link(lab.hosts[1])  # its connect hangs: preflight stays open long enough
    try:
        up = Up(inventory, state=tmp_path / "state")
        up.wait_for(r"^tfdeploy: preflight of 2 host")
        time.sleep(0.5)
        _interrupt(up)
    finally:
        lab.restore_link(lab.hosts[1])
    assert "preflight ok" not in up.stdout


@pytest.mark.isolated
def test_ctrl_c_during_push(clean_lab: Lab, lab_inventory: Any, tmp_path: Path) -> None:
    lab = clean_lab
    inventory = task_inventory(
        lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2, artifacts=["*.bin"]
    )
    (tmp_path / "code" / "weights.bin").write_bytes(os.urandom(2_000_000))
    lab.cap_bandwidth(lab.hosts[1], "1mbit")  # 2 MB take ~16 s to send
    try:
        up = Up(inventory, state=tmp_path / "state")
        up.wait_for(r"^tfdeploy: preflight ok")
        time.sleep(1.0)
        _interrupt(up)
    finally:
        lab.uncap_bandwidth(lab.hosts[1])
    assert "pushed" not in up.stdout
    assert "artifact" not in up.stdout  # no task ran: nothing to pull, nothing to say (#28)


@pytest.mark.isolated
@pytest.mark.parametrize("phase", ["seed", "peers"])
def test_ctrl_c_during_a_fanout_push_stops_within_seconds(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, phase: str
) -> None:
    """Issue 28 item 11: the seed's push ran on the main thread, outside the fleet, so Ctrl-C
    left its session half-way through a stream and the stop waited 64 s behind it."""
    lab = clean_lab
    inventory = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 3)
    (tmp_path / "code" / "weights.bin").write_bytes(os.urandom(4_000_000))
    try:
        if phase == "seed":
            lab.cap_uplink("2mbit")  # the seed's 4 MB take ~16 s to arrive
        else:
            for host in lab.hosts[1:3]:  # the copies between hosts take ~32 s
                lab.cap_bandwidth(host, "1mbit")
        up = Up(inventory, state=tmp_path / "state")
        up.wait_for(r"^tfdeploy: preflight ok")
        time.sleep(2.0 if phase == "seed" else 5.0)
        took = _interrupt(up)
    finally:
        lab.uncap_uplink()
        for host in lab.hosts[1:3]:
            lab.uncap_bandwidth(host)
    assert "could not stop" not in up.stdout + up.stderr, up.report()
    assert "pushed" not in up.stdout
    # A host still copying from a stopped peer sees its connection end (or time out: 10 s) and
    # its agent leaves with the dropped connection.
    gone = wait_until(
        "the hosts' agents to leave", lambda: not any(lab.leftovers(h, 0) for h in lab.hosts), 15
    )
    print(
        f"Ctrl-C during the fan-out's {phase} phase: exit {took:.1f} s after it, hosts idle "
        f"{gone:.1f} s later"
    )


def test_ctrl_c_during_setup_stops_the_setup_commands(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    inventory = task_inventory(
        lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2, setup=["sleep 61"]
    )
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"^tfdeploy: setup \(1 command")
    wait_until(
        "setup running on both hosts",
        lambda: all(pids_of(lab, h, "sleep 61") for h in lab.hosts[:2]),
        20,
    )
    _interrupt(up)  # the setup alone takes 61 s
    assert "starting" not in up.stdout
    # clean_lab: no `sleep 61` left on either host


def test_ctrl_c_during_start_stops_the_started_servers(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    layout = [[{"role": "ps", "args": "--no-serve"}], [{"role": "worker"}]]
    inventory = task_inventory(lab, lab_inventory, tmp_path, layout, start_timeout=60)
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"^tfdeploy: starting ps:0")
    wait_until("ps:0 running", lambda: pids_of(lab, lab.hosts[0], "task.py"), 20)
    _interrupt(up)  # ps:0 never serves: the start alone waits out start_timeout (60 s)
    states = final_states(inventory, up.run_id(), tmp_path)
    assert states[f"ps:0@{lab.hosts[0].name}"]["reason"] == "stopped"
    assert f"worker:0@{lab.hosts[1].name}" not in states  # never started


def test_second_ctrl_c_kills_at_once(clean_lab: Lab, lab_inventory: Any, tmp_path: Path) -> None:
    lab = clean_lab
    inventory = task_inventory(
        lab,
        lab_inventory,
        tmp_path,
        [[{"role": "worker"}]] * 2,
        args="--ignore-term",
        stop_grace=60,
    )
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"\| worker:\d up in", count=2)
    began = time.monotonic()
    up.proc.send_signal(signal.SIGINT)
    up.wait_for(r"^tfdeploy: interrupted: stopping")
    time.sleep(1.0)  # the graceful stop is now waiting for tasks that ignore SIGTERM
    up.proc.send_signal(signal.SIGINT)
    assert up.finish(timeout=30) == 130, up.report()  # within half the 60 s grace: killed
    took = time.monotonic() - began
    assert "second Ctrl-C: killing every task now" in up.stdout
    print(f"double Ctrl-C: exit {took:.1f} s after the first")
    states = final_states(inventory, up.run_id(), tmp_path)
    assert {t["signal"] for t in states.values()} == {9}


# ---- controller loss -------------------------------------------------------------------------


def test_up_killed_then_the_lease_stops_every_task(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    hosts = lab.hosts[:3]
    inventory = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 3)
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"\| worker:\d up in", count=3)
    run_id = up.run_id()
    up.proc.kill()
    up.finish()
    time.sleep(2)
    assert all(pids_of(lab, h, "task.py") for h in hosts), "tasks died with the controller"
    # within the lease, its check interval, stop_grace and a margin (5 + 1 + 2 + 12 s)
    took = wait_until("the lease to stop every task", no_task_left(lab, hosts), 20)
    print(f"lease: every task stopped {took + 2:.1f} s after `up` was killed")
    states = final_states(inventory, run_id, tmp_path, hosts=3)
    assert {t["reason"] for t in states.values()} == {"lease expired"}


def test_up_paused_longer_than_the_lease_says_the_controller_was_paused(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Issue 28 item 13: SIGSTOP of `up` past the lease ended in `worker:1@h2 failed (lease
    expired)`, as if the task or its host had failed."""
    lab = clean_lab
    inventory = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2)
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"\| worker:\d up in", count=2)
    run_id = up.run_id()
    up.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until("the lease to stop every task", no_task_left(lab, lab.hosts[:2]), 20)
    finally:
        up.proc.send_signal(signal.SIGCONT)
    assert up.finish() == 1, up.report()
    error = " ".join(up.stderr.split())
    assert re.search(
        r"error: worker:\d@h\d failed \(lease expired\): this controller was paused for \d+ s "
        r"\(SIGSTOP, Ctrl-Z, a suspended machine\?\), longer than the lease \(5 s without a "
        r"heartbeat\), so the hosts stopped the run themselves",
        error,
    ), error
    states = final_states(inventory, run_id, tmp_path)
    assert {t["reason"] for t in states.values()} == {"lease expired"}


def test_detached_run_outlives_the_lease_and_down_works_without_local_state(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    inventory = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2)
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = re.search(r"run (\S+) is running detached", up.stdout)
    assert run_id, up.stdout
    time.sleep(5 + 3)  # past lease_seconds: a detached run holds no lease
    assert all(pids_of(lab, h, "task.py") for h in lab.hosts[:2])
    down = tfdeploy("down", str(inventory), state=tmp_path / "fresh-shell", check_rc=0)
    assert down.stdout.count(f"stopped run {run_id.group(1)}") == 2
    states = final_states(inventory, run_id.group(1), tmp_path)
    assert {t["reason"] for t in states.values()} == {"stopped"}


@pytest.mark.isolated
def test_sshd_killed_tasks_keep_running_and_down_works_once_it_is_back(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    inventory = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2)
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = re.search(r"run (\S+) is running detached", up.stdout)
    assert run_id, up.stdout
    lab.kill_sshd(lab.hosts[1])
    try:
        down = tfdeploy("down", run_id.group(1), state=tmp_path / "state", check_rc=3)
        assert f"{lab.hosts[1].name}: connection refused" in down.stderr
        time.sleep(1)
        assert pids_of(lab, lab.hosts[1], "task.py"), "tasks died with sshd"
    finally:
        lab.start_sshd(lab.hosts[1])
    tfdeploy("down", run_id.group(1), "-i", str(inventory), state=tmp_path / "new", check_rc=0)
    states = final_states(inventory, run_id.group(1), tmp_path, hosts=2)
    assert {t["reason"] for t in states.values()} == {"stopped"}


# ---- runs after the inventory changed ----------------------------------------------------------


def _detach(inventory: Path, state: Path) -> str:
    up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    found = re.search(r"run (\S+) is running detached", up.stdout)
    assert found, up.stdout
    return found.group(1)


def test_down_and_status_reach_every_host_of_a_run_whatever_the_inventory_says_now(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Issue 28 item 2: with h3 dropped from the inventory, `down RUN` stopped h1 and h2, said
    nothing of h3, exited 0, and worker:2 ran on there (a detached run holds no lease)."""
    lab = clean_lab
    three = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 3)
    full = tmp_path / "full.toml"
    full.write_text(three.read_text())  # for final_states: the run's hosts as they were
    state = tmp_path / "state"
    run_id = _detach(three, state)
    task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2)  # h3 dropped
    try:
        _reach_the_dropped_host(lab, tmp_path, three, state, run_id)
    finally:  # whatever failed, the lab's hosts are left clean for the next test
        tfdeploy("down", str(full), state=tmp_path / "cleanup")
    states = final_states(full, run_id, tmp_path, hosts=3)
    assert {t["reason"] for t in states.values()} == {"stopped"}


def _reach_the_dropped_host(
    lab: Lab, tmp_path: Path, three: Path, state: Path, run_id: str
) -> None:
    h1, h2, h3 = lab.hosts[:3]
    # This machine's record of the run lists its hosts: all three are asked.
    status = tfdeploy("status", run_id, "--json", state=state, check_rc=0)
    hosts = sorted(r["host"] for r in json.loads(status.stdout)["runs"])
    assert hosts == [h1.name, h2.name, h3.name]

    # A fresh shell knows only the inventory; the run's own record on h1 and h2 names h3.
    fresh = tfdeploy("status", run_id, "-i", str(three), state=tmp_path / "fresh", check_rc=3)
    assert f"{h3.name}: run {run_id} also has this host ({h3.address})" in fresh.stderr
    down = tfdeploy("down", run_id, "-i", str(three), state=tmp_path / "fresh", check_rc=3)
    assert f"stopped run {run_id} on {h1.name}" in down.stdout
    assert "stopping failed on 1 host; the run was stopped on the other hosts:" in down.stderr
    assert f"{h3.name}: run {run_id} also has this host" in down.stderr
    assert pids_of(lab, h3, "task.py"), "h3's task was stopped without being reached?"

    # From the machine that started it, `down RUN` reaches h3 too.
    down = tfdeploy("down", run_id, state=state, check_rc=0)
    assert f"stopped run {run_id} on {h3.name}" in down.stdout, down.stdout
    assert not pids_of(lab, h3, "task.py")


def test_status_and_down_of_a_renamed_job_say_what_they_looked_for_and_where(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Issue 28 item 2: after renaming the job, `status` said "no runs found" and `down`
    "nothing to stop" while the run under the old name was live."""
    lab = clean_lab
    inventory = task_inventory(lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2)
    run_id = _detach(inventory, tmp_path / "state")
    try:
        _say_where_nothing_was_found(lab, lab_inventory, tmp_path, run_id)
    finally:
        tfdeploy("down", str(inventory), state=tmp_path / "cleanup", check_rc=0)
    final_states(inventory, run_id, tmp_path)


def _say_where_nothing_was_found(lab: Lab, lab_inventory: Any, tmp_path: Path, run_id: str) -> None:
    h1, h2 = lab.hosts[:2]
    renamed = task_inventory(
        lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2, name="renamed", file="new.toml"
    )
    # (earlier tests' runs of job 'faults' may still be on the lab's hosts: they are counted)
    said = f"no runs of job 'renamed' on {h1.name} and {h2.name}; runs of other jobs there: "
    said += r"'faults': \d+ runs? \(newest " + run_id + r"\)"
    status = tfdeploy("status", str(renamed), state=tmp_path / "s", check_rc=0)
    assert re.search(said, " ".join(status.stdout.split())), status.stdout
    down = tfdeploy("down", str(renamed), state=tmp_path / "s", check_rc=0)
    assert re.search(f"nothing to stop: {said}", " ".join(down.stdout.split())), down.stdout
    assert all(pids_of(lab, h, "task.py") for h in (h1, h2))


# ---- host loss ---------------------------------------------------------------------------------


@pytest.mark.isolated
@pytest.mark.parametrize("fault", ["cut-link", "crash"])
def test_host_loss_is_detected_within_10_s_and_the_rest_torn_down(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, fault: str
) -> None:
    lab = clean_lab
    hosts, victim = lab.hosts[:3], lab.hosts[1]
    inventory = task_inventory(
        lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 3, args="--lines 1000 --interval 0.5"
    )
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"\| worker:\d up in", count=3)
    run_id = up.run_id()
    try:
        if fault == "cut-link":
            lab.cut_link(victim)
        else:
            lab.crash_host(victim)
        faulted = time.monotonic()
        detected = up.wait_for(rf"^tfdeploy: host {victim.name} lost after", timeout=30)
        assert up.finish() == 1, up.report()
        assert detected - faulted < 10, f"loss seen after {detected - faulted:.1f} s"
        assert first_error(up.stderr).startswith(f"error: host {victim.name} was lost")
        survivors = [h for h in hosts if h != victim]
        for h in survivors:  # torn down before `up` returned
            assert not pids_of(lab, h, "task.py"), f"{h.name} still runs tasks"
        if fault == "cut-link":
            # Unreachable, the host's supervisors stop its tasks when the lease lapses.
            wait_until("the cut host's lease to lapse", no_task_left(lab, [victim]), 20)
    finally:
        if fault == "cut-link":
            lab.restore_link(victim)
        else:
            lab.revive_host(victim)
    # The victim's end of the dead connection stays open (sshd has no keepalive of its own); the
    # agent session on it leaves by itself once idle (remote/agent.py SERVE_IDLE_S = 15 s).
    wait_until("the victim's agent session to leave", lambda: not lab.leftovers(victim, 0), 30)
    states = final_states(inventory, run_id, tmp_path)
    for label, task in states.items():
        expected = "lease expired" if label.endswith(f"@{victim.name}") else "stopped"
        assert task["reason"] == expected, (label, task)
    # A crashed host comes back empty (its disk was a tmpfs); a cut one kept its run directory.
    assert (f"worker:1@{victim.name}" in states) == (fault == "cut-link")
    print(f"{fault}: loss detected {detected - faulted:.1f} s after the fault")


@pytest.mark.isolated
@pytest.mark.parametrize("outage", ["past-the-lease", "within-the-lease"])
def test_a_lost_host_that_comes_back_is_watched_again_and_the_restarted_job_ends_0(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, outage: str
) -> None:
    """restart-job after a host's link is cut for longer than the host-loss limit: the restart
    waits for the host (saying so), stops what the last attempt left there, starts the next
    attempt on every host and watches every host again, so the job ends 0 (issue 58: `up`
    stopped polling the host it had marked lost, its new task was stopped by the lease unseen,
    and `up` waited for it until killed; with the link still cut, the restart's start failed)."""
    lab = clean_lab
    h1, h2 = lab.hosts[:2]
    lease = 8 if outage == "past-the-lease" else 60
    inventory = task_inventory(
        lab,
        lab_inventory,
        tmp_path,
        [[{"role": "worker"}]] * 2,
        args="--first-attempt-sleep 3600 --sleep 1",
        on_failure="restart-job",
        max_restarts=5,
        restart_backoff=1,
        lease_seconds=lease,
        # `up`'s own recovery, as where a source can replace hosts (a keeper holds a static
        # inventory's run: tests/integration/test_keeper.py has its lost host that comes back).
        keeper=False,
    )
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"\| worker:\d up in", count=2)
    run_id = up.run_id()
    lab.cut_link(h2)
    try:
        up.wait_for(rf"host {h2.name} lost after", timeout=60)
        if outage == "past-the-lease":
            # Unreachable, the host's supervisor stops attempt 0's task when the lease lapses,
            # and `up` cannot see it: it must neither start without the host nor lose it.
            wait_until("the cut host's lease to lapse", no_task_left(lab, [h2]), 60)
            up.wait_for(rf"{h2.name} still unreachable: restart \d of 5 waits", timeout=60)
    finally:
        lab.restore_link(h2)
    up.wait_for(rf"contact with {h2.name} is back", timeout=90)
    assert up.finish(timeout=120) == 0, up.report()
    assert re.search(r"job succeeded: worker:0 and worker:1 exited 0", up.stdout), up.report()
    states = final_states(inventory, run_id, tmp_path)
    assert {label: t["exit_code"] for label, t in states.items()} == {
        f"worker:0@{h1.name}": 0,
        f"worker:1@{h2.name}": 0,
    }, states
    assert no_task_left(lab, [h1, h2])()


# ---- logs across reconnects ----------------------------------------------------------------------


def _ssh_sessions(lab: Lab, host: LabHost) -> set[int]:
    """sshd's per-connection processes on the host (not the listener)."""
    return {
        p.pid
        for p in lab.processes(host)
        if p.cmdline.startswith("sshd: ") and "[listener]" not in p.cmdline
    }


@pytest.mark.isolated
def test_logs_survive_reconnects_with_no_line_lost_or_doubled(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    count = 1500
    inventory = task_inventory(
        lab,
        lab_inventory,
        tmp_path,
        [[{"role": "worker"}]],
        args=f"--lines {count} --interval 0.005 --sleep 0",
    )
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"\| n 100$")
    host = lab.hosts[0]
    for _ in range(3):  # drop the controller's connection three times mid-stream
        old = _ssh_sessions(lab, host)
        assert old, "the controller has no SSH connection to the host"
        for pid in old:
            lab.run(host, ["kill", "-KILL", str(pid)])
        wait_until(
            "the controller to reconnect", lambda old=old: _ssh_sessions(lab, host) - old, 20
        )
        time.sleep(0.5)
    assert up.finish() == 0, up.report()
    numbers = [int(n) for n in re.findall(r"^worker:0@\S+ \| n (\d+)$", up.stdout, re.M)]
    lost, doubled = set(range(count)) - set(numbers), len(numbers) - len(set(numbers))
    assert (len(lost), doubled) == (0, 0), f"{len(lost)} lines lost, {doubled} printed twice"
    assert numbers == list(range(count))  # and in order


# ---- runs sharing hosts, busy ports, partial starts ---------------------------------------------


def test_concurrent_runs_stay_apart_and_a_busy_port_is_a_preflight_error(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    layout = [[{"role": "worker"}]] * 2
    args = "--lines 100000 --interval 0.2"
    first = task_inventory(lab, lab_inventory, tmp_path, layout, args=args, port=2500)
    second = task_inventory(
        lab, lab_inventory, tmp_path, layout, args=args, port=2600, file="second.toml"
    )
    state = tmp_path / "state"
    ids = []
    for inventory in (first, second):
        up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
        found = re.search(r"run (\S+) is running detached", up.stdout)
        assert found, up.stdout
        ids.append(found.group(1))
    a, b = ids
    clash = tfdeploy("up", str(first), state=state, check_rc=3)
    for h in lab.hosts[:2]:
        assert f"{h.name}: TF port(s) {lab.tf_port(h, 2500)} already in use" in clash.stderr
    time.sleep(1)
    logs_b = tfdeploy("logs", b, state=state, check_rc=0).stdout
    assert f"up in {b}" in logs_b and a not in logs_b
    tfdeploy("down", a, state=state, check_rc=0)
    states_a = final_states(first, a, tmp_path)
    assert {t["reason"] for t in states_a.values()} == {"stopped"}
    status_b = json.loads(tfdeploy("status", b, "--json", state=state, check_rc=0).stdout)
    assert {t["state"] for r in status_b["runs"] for t in r["tasks"]} == {"running"}
    assert len(pids_of(lab, lab.hosts[0], "task.py")) == 1  # run b's alone
    tfdeploy("down", b, state=state, check_rc=0)
    final_states(second, b, tmp_path)


def test_a_start_failing_on_one_host_stops_what_started_elsewhere(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    bad = lab.hosts[2]
    # Setup plants a file where worker:1's task directory must go: its start fails on that host
    # only, after ps:0 and worker:0 were started on the others.
    sabotage = (
        f'if [ "$(hostname)" = {bad.hostname} ]; then '
        "mkdir -p ../tasks; touch ../tasks/worker-1; fi"
    )
    layout = [[{"role": "ps"}], [{"role": "worker"}], [{"role": "worker"}]]
    inventory = task_inventory(lab, lab_inventory, tmp_path, layout, setup=[sabotage])
    up = Up(inventory, state=tmp_path / "state")
    assert up.finish() == 1, up.report()
    error = first_error(up.stderr)
    assert error == "error: starting worker:0, worker:1 failed on 1 host:", up.stderr
    assert f"  {bad.name}: " in up.stderr and "every task started so far was stopped" in up.stderr
    states = final_states(inventory, up.run_id(), tmp_path)
    assert {k: t["reason"] for k, t in states.items()} == {
        f"ps:0@{lab.hosts[0].name}": "stopped",
        f"worker:0@{lab.hosts[1].name}": "stopped",
    }


# ---- a damaged agent on a host -----------------------------------------------------------------


def test_a_corrupted_agent_file_is_installed_again_and_every_verb_works(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """A disk error or a half-copied file (`)(` appended) in the installed agent: the next
    connection's hello sees the files no longer match their content id and installs them again,
    where every verb used to fail with a SyntaxError."""
    from deployer.hosts.bootstrap import agent_id

    lab = clean_lab
    host = lab.hosts[3]
    workdir = f"/tmp/tfdeploy-damaged-{os.getpid()}-{time.monotonic_ns()}"  # its own agent
    code = tmp_path / "code"
    code.mkdir()
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={"name": "damaged", "command": "true", "workdir": workdir},
        hosts=[host],
    )
    state = tmp_path / "state"
    tfdeploy("up", str(inventory), state=state, check_rc=0)  # installs the agent
    home = f"{workdir}/agent/{agent_id()}"
    wanted = {
        name: hashlib.sha256((REMOTE / name).read_bytes()).hexdigest()
        for name in ("agent.py", "results.py")
    }
    try:
        for name in wanted:  # agent.py is imported at every hello, results.py only by a pull
            lab.run(host, f"printf ')(' >> {home}/{name}", timeout=10).check_returncode()
        again = tfdeploy("status", str(inventory), state=state)
        said = again.stdout + again.stderr
        assert again.returncode == 0, said
        assert "SyntaxError" not in said and "agent failed" not in said, said
        assert "damaged-" in said, said  # the run of the `up` above, as its host reports it
        for name, digest in wanted.items():
            got = lab.run(host, f"sha256sum {home}/{name}", timeout=10).stdout.split()[0]
            assert got == digest, f"{name} was not installed again"
    finally:
        lab.run(host, f"rm -rf {workdir}", timeout=10)
