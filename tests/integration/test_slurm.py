"""`tfdeploy up` on the lab's real Slurm cluster (tests/lab/slurm.py: h1 the login node reached
over SSH, h2 and h3 compute nodes): one allocation per job, every process of the run a job step,
and nothing left when it ends, however it ends. The `slurm` fixture checks after every test that
squeue is empty and no process of a job is left on any host.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab import Lab, SlurmCluster
from tests.support import standin
from tests.support.faults import EXAMPLES, Up, tfdeploy
from tests.support.helpers import to_toml

pytestmark = [
    pytest.mark.lab,
    pytest.mark.isolated,
    pytest.mark.slurm_e2e,
    # slurm_inventory's job keeps require_tensorflow: preflight wants it on the nodes
    pytest.mark.needs_tf(reason="preflight wants TensorFlow on the nodes"),
]


@pytest.fixture
def slurm_inventory(slurm_lab: Lab, slurm: SlurmCluster, tmp_path: Path) -> Callable[..., Path]:
    """`slurm_inventory(nodes=2, epochs=2, **slurm_keys)`: the digits example (MWMS) on
    `nodes` allocated nodes, the login node reached over SSH with the lab's keys."""

    def write(
        *,
        nodes: int = 2,
        epochs: int = 2,
        lease: float = 60,
        code: Path = EXAMPLES,
        command: str | None = None,
        job: dict[str, object] | None = None,
        **keys: object,
    ) -> Path:
        document = {
            "job": {
                "name": "digits",
                "code": str(code),
                "command": command or f"python3 mwms.py --epochs {epochs}",
                "python": slurm_lab.python,
                "lease_seconds": lease,
                "env": {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"},
                **(job or {}),
            },
            "ssh": {
                "user": slurm_lab.user,
                "identity": str(slurm_lab.key_path),
                "known_hosts": str(slurm_lab.known_hosts),
                "host_keys": "strict",
                "connect_timeout": 5,
            },
            "slurm": {
                "login": slurm.login.address,
                "partition": "debug",
                "time": "00:15:00",
                **keys,
                "hosts": [{"nodes": nodes, "tasks": [{"role": "worker"}]}],
            },
        }
        path = tmp_path / "slurm.toml"
        path.write_text(to_toml(document))
        return path

    return write


def _ours(slurm: SlurmCluster) -> list[str]:
    """The job ids of tfdeploy's allocations still known to squeue."""
    out = slurm.check("squeue -h -n tfdeploy-digits -o %i")
    return out.split()


STOP_GRACE_S = 10  # the supervisors' default SIGTERM-to-SIGKILL grace (remote/supervisor.py)


def _settled(slurm: SlurmCluster) -> None:
    """Waits until slurmctld shows the nodes idle again (KillWait and the steps' cleanup after
    an allocation ended; squeue is empty already)."""
    slurm.wait_nodes("idle", timeout=120)


def _training(inventory: Callable[..., Path], tmp_path: Path, lease: float = 10) -> Up:
    """`up` of a long stand-in job (the subject is the allocation's life, not TensorFlow,
    which test_mwms_trains_on_two_allocated_nodes_... runs), once both of its tasks run."""
    up = Up(_standin_job(inventory, tmp_path, lease=lease), state=tmp_path / "state")
    up.wait_for(r"worker:1@h3 pid \d+ running", timeout=300)
    return up


def _wait_gone(slurm: SlurmCluster, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _ours(slurm):
            return True
        time.sleep(0.5)
    return False


@pytest.mark.starts_tf
def test_mwms_trains_on_two_allocated_nodes_and_the_allocation_is_released(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    inventory = slurm_inventory()
    done = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=420, check_rc=0)
    out = done.stdout + done.stderr
    assert "submitted allocation" in out
    assert "runs on h2, h3" in out, out
    assert "test_accuracy=" in out and "job succeeded" in out, out
    assert "released allocation" in out, out
    assert _ours(slurm) == [], "the allocation outlived up"
    _settled(slurm)


def _standin_job(
    inventory: Callable[..., Path],
    tmp_path: Path,
    steps: int = 2000,
    lease: float = 60,
    **job: object,
) -> Path:
    """A TF-shaped stand-in (no TensorFlow: the subject is the allocation's life); `job`: more
    [job] keys (a failure policy)."""
    code = tmp_path / "code"
    standin.write(code)
    command = f"python3 {standin.NAME} {steps} --interval 0.25"
    return inventory(code=code, command=command, lease=lease, job=job or None)


def _kept_detached_run(
    slurm: SlurmCluster, inventory: Callable[..., Path], tmp_path: Path, max_restarts: int
) -> tuple[str, str, str, str]:
    """`up --detach` of a 60-step restart-job stand-in: its run id, its keeper's node, its
    allocation, and the glob of its folder on a node."""
    policy = {"on_failure": "restart-job", "max_restarts": max_restarts, "restart_backoff": 1}
    job = _standin_job(inventory, tmp_path, 60, **policy, stop_grace=2)
    up = tfdeploy("up", "--detach", str(job), state=tmp_path / "a", timeout=300, check_rc=0)
    found = re.search(r"run (\S+) is running detached, kept by its keeper on (\S+):", up.stdout)
    assert found, up.stdout
    run_id, keeper_host = found.groups()
    (job_id,) = _ours(slurm)
    return run_id, keeper_host, job_id, f"~/.tfdeploy/hosts/*/runs/{run_id}"


def _keeper_record_once_ended(lab: Lab, host: str, runs: str, *words: str) -> str:
    """keeper.json once it says `ended` (and every word of `words`), read on the keeper's node."""
    deadline = time.monotonic() + 180
    while True:
        got = lab.run(host, ["sh", "-c", f"cat {runs}/keeper.json || true"]).stdout
        if '"ended"' in got and all(w in got for w in words):
            return got
        assert time.monotonic() < deadline, f"the keeper never ended the run: {got[-500:]}"
        time.sleep(0.5)


@pytest.mark.both_trackings
@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_detach_then_down_from_a_fresh_shell_releases_the_allocation(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    inventory = _standin_job(slurm_inventory, tmp_path)
    tfdeploy("up", "--detach", str(inventory), state=tmp_path / "a", timeout=300, check_rc=0)
    (job_id,) = _ours(slurm)
    status = tfdeploy("status", str(inventory), state=tmp_path / "b", timeout=120, check_rc=0)
    assert f"Slurm allocation {job_id} (running" in status.stdout, status.stdout
    assert status.stdout.count("running") >= 3, status.stdout  # the allocation and both tasks
    down = tfdeploy("down", str(inventory), state=tmp_path / "c", timeout=180, check_rc=0)
    assert f"released allocation {job_id}" in down.stdout + down.stderr, down.stdout
    assert _wait_gone(slurm, 30)
    _settled(slurm)


@pytest.mark.both_trackings
@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_scancel_of_a_detached_runs_allocation_ends_its_tasks_under_linuxproc(
    slurm_lab: Lab, slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    """proctrack/linuxproc follows the process tree: the tasks of a detached run, started by
    the allocation's holder step (remote/holder.py), stay in that step's tree because the
    holder reaps its orphans (PR_SET_CHILD_SUBREAPER), so `scancel` (or the time limit) ends
    them with the allocation. Before the holder they escaped tracking and ran on outside it."""
    inventory = _standin_job(slurm_inventory, tmp_path)
    tfdeploy("up", "--detach", str(inventory), state=tmp_path / "a", timeout=300, check_rc=0)
    (job_id,) = _ours(slurm)
    for node in ("h2", "h3"):
        assert slurm_lab.run(node, ["pgrep", "-f", standin.NAME]).stdout.split(), node
    slurm.check(f"scancel {job_id}")
    deadline = time.monotonic() + 60
    while any(slurm_lab.run(n, ["pgrep", "-f", standin.NAME]).stdout for n in ("h2", "h3")):
        assert time.monotonic() < deadline, "a task outlived its allocation's scancel"
        time.sleep(0.2)
    assert _wait_gone(slurm, 30)
    _settled(slurm)


@pytest.mark.names_tf(reason="the allocation never runs: no task starts")
def test_more_nodes_than_the_partition_has_are_refused_in_slurms_words(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    inventory = slurm_inventory(nodes=5)
    done = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=120, check_rc=2)
    assert "Requested node configuration is not available" in done.stderr, done.stderr
    assert "the partition has 2 nodes" in done.stderr
    assert "hint:" in done.stderr
    assert "submitted" not in done.stdout
    assert _ours(slurm) == []


def _blocker(slurm: SlurmCluster) -> str:
    """A job holding both nodes: tfdeploy's allocation must pend behind it."""
    job = slurm.sbatch("--exclusive -N2 -p debug -t 10 -o /dev/null --wrap 'sleep 600'")
    slurm.wait_job(job, "RUNNING")
    return job


@pytest.mark.names_tf(reason="the allocation never runs: no task starts")
def test_a_pending_allocation_is_cancelled_at_the_wait_bound(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    blocker = _blocker(slurm)
    try:
        inventory = slurm_inventory(wait=4)
        done = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "waiting for 2 nodes in debug: Resources" in done.stdout, done.stdout
        assert "was cancelled (wait = 4)" in done.stderr, done.stderr
        assert _ours(slurm) == []
    finally:
        slurm.check(f"scancel {blocker}")


@pytest.mark.names_tf(reason="the allocation never runs: no task starts")
def test_a_pending_allocation_is_cancelled_by_ctrl_c(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    blocker = _blocker(slurm)
    try:
        up = Up(slurm_inventory(), state=tmp_path / "state")
        up.wait_for(r"waiting for 2 nodes in debug: Resources")
        assert len(_ours(slurm)) == 1
        up.proc.send_signal(signal.SIGINT)
        assert up.finish(timeout=60) == 130, up.report()
        assert "cancelled allocation" in up.stdout, up.report()
        assert _ours(slurm) == []
    finally:
        slurm.check(f"scancel {blocker}")


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_a_sigkilled_controller_holds_no_allocation_past_its_lease(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    lease = 10.0
    up = _training(slurm_inventory, tmp_path, lease)
    assert len(_ours(slurm)) == 1
    up.proc.kill()  # SIGKILL: no teardown, no scancel; the keeper's step loses its stdin
    up.finish()
    # The body ends the allocation once the lease lapses (+ the keeper's beat and the body's
    # look, 2 s each, and Slurm's KillWait); the slack is for a loaded machine, a bound and not
    # a measurement. Were the keeper kept alive, the allocation would last its 15 minutes.
    assert _wait_gone(slurm, lease + 60), "the allocation outlived its controller's lease"
    # Each supervisor stops its task when the same lease lapses, SIGTERM then SIGKILL after the
    # grace (10 s): a task that outlives the SIGTERM (an MWMS task does: TensorFlow's preemption
    # notifier takes it) may end after the allocation does. Its end is the event waited for.
    left = slurm.leftovers(settle=STOP_GRACE_S + 30)
    assert not left, f"the run outlived its lease: {left}"
    _settled(slurm)


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_a_node_whose_slurmd_dies_ends_the_job_naming_the_node(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    up = _training(slurm_inventory, tmp_path)
    slurm.kill_slurmd("h3")
    assert up.finish(timeout=180) == 1, up.report()  # on_failure = "teardown"
    assert "Slurm requeued allocation" in up.stdout, up.report()
    assert "node h3 failed" in up.stdout, up.report()
    assert "released allocation" in up.stdout, up.report()
    assert _ours(slurm) == []
    # The node comes back (as a rebooted one would): its slurmd ends the orphaned steps.
    slurm.start_slurmd("h3")
    slurm.heal()


# A task that saves its checkpoint on the time limit's warning signal and exits 0, as a task
# whose handler ends it does; the next run's tasks resume from it.
ON_WARNING = """import os, signal, sys, time
path = os.path.join(os.environ["TFDEPLOY_CHECKPOINT_DIR"], os.environ["TFDEPLOY_TASK"])
if os.path.exists(path):
    print("resumed at step " + open(path).read(), flush=True)
    sys.exit(0)
def save(*_):
    with open(path, "w") as f:
        f.write("7")
    print("checkpoint saved on SIGUSR1", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
print("training", flush=True)
time.sleep(600)
"""


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_the_time_limits_warning_reaches_every_task_and_the_next_run_resumes(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    """`signal = "USR1@60"`: Slurm signals the allocation's body (`scancel --batch` sends what
    `--signal=B:USR1@60` sends at the time), which passes SIGUSR1 to the run's recorded task
    process groups on every node through the agents (remote/relay.py). A process of the same
    user on a node that only looks like a supervisor is not signalled. The tasks save and exit
    0, which is no success: the run ends at the warning, unrestarted under restart-job (the
    allocation is ending), and the next `up` resumes from the checkpoint they saved."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "warned.py").write_text(ON_WARNING)
    checkpoints = slurm.dir / f"ckpt-{tmp_path.name}"  # the nodes' shared storage, as NFS
    inventory = slurm_inventory(
        code=code,
        command="python3 warned.py",
        signal="USR1@60",
        job={"checkpoint_dir": str(checkpoints), "on_failure": "restart-job"},
    )
    up = Up(inventory, state=tmp_path / "state")
    up.wait_for(r"worker:0@h2 \| training", timeout=300)
    up.wait_for(r"worker:1@h3 \| training", timeout=60)
    assert "its tasks get SIGUSR1 1m00s before the time limit" in up.stdout, up.report()
    # What a name-based relay (`pkill -USR1 -P $(pgrep -x tfd-supervisor)`) would have hit: a
    # process named as the agent's supervisors are, whose child notes a USR1.
    place = slurm.dir / "bystander"
    place.mkdir(exist_ok=True)
    hit = place / "hit"
    script = place / "tfd-supervisor"
    script.write_text(
        f"#!/bin/sh\nsh -c 'trap \"touch {hit}\" USR1; while :; do sleep 0.2; done'\n"
    )
    script.chmod(0o755)
    bystander = slurm.lab.popen(slurm.nodes[0], str(script))
    try:
        (job_id,) = _ours(slurm)
        slurm.check(f"scancel --batch --signal=USR1 {job_id}")
        assert up.finish(timeout=120) == 1, up.report()
        assert up.stdout.count("checkpoint saved on SIGUSR1") == 2, up.report()
        assert "ended at its allocation's time-limit warning, not restarted" in up.stderr
        assert "tfdeploy up` again resumes from the checkpoint" in up.stderr, up.report()
        assert "restarting" not in up.stdout.lower(), up.report()
        assert "released allocation" in up.stdout, up.report()
        assert not hit.exists(), "a process named like a supervisor was signalled"
    finally:
        slurm.lab.run(slurm.nodes[0], "pkill -f '[b]ystander/' || true")
        bystander.kill()
        bystander.wait()
    assert _wait_gone(slurm, 30)
    again = Up(inventory, state=tmp_path / "state")
    assert again.finish(timeout=300) == 0, again.report()
    assert again.stdout.count("resumed at step 7") == 2, again.report()
    assert _wait_gone(slurm, 30)
    _settled(slurm)


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_a_preempted_allocation_is_reported_as_such(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    up = _training(slurm_inventory, tmp_path)
    urgent = slurm.sbatch("-p urgent -N2 --exclusive -t 2 -o /dev/null --wrap 'sleep 15'")
    try:
        assert up.finish(timeout=180) == 1, up.report()
        assert "preempted by a higher-priority job" in up.stdout, up.report()
        assert "released allocation" in up.stdout, up.report()
        assert _ours(slurm) == []
    finally:
        slurm.check(f"scancel {urgent}")


# A task that saves its step to a checkpoint beside the lab, resumes from it, and on a restart
# (TFDEPLOY_ATTEMPT > 0) ends after five more steps; the first attempt runs until it is stopped.
RESUMING = """import json, os, pathlib, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
ckpt = pathlib.Path(sys.argv[1]) / f"worker{index}"
step = int(ckpt.read_text()) if ckpt.exists() else 0
attempt = int(os.environ["TFDEPLOY_ATTEMPT"])
print(f"attempt {attempt} starts at step {step}", flush=True)
for _ in range(5 if attempt else 10**6):
    step += 1
    ckpt.with_suffix(".tmp").write_text(str(step))
    os.replace(ckpt.with_suffix(".tmp"), ckpt)  # a task killed mid-write leaves the last one
    time.sleep(0.2)
print(f"attempt {attempt} ended at step {step}", flush=True)
"""


def _resuming(
    slurm: SlurmCluster, inventory: Callable[..., Path], tmp_path: Path
) -> tuple[Up, Path]:
    """`up` of RESUMING on two nodes under restart-job, once both workers run; and the
    directory of their checkpoints (beside the lab, which the nodes see)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "resume.py").write_text(RESUMING)
    ckpt = slurm.dir / "ckpt" / tmp_path.name
    ckpt.mkdir(parents=True)
    written = inventory(
        code=code,
        command=f"python3 resume.py {ckpt}",
        job={"on_failure": "restart-job", "max_restarts": 1, "restart_backoff": 1},
    )
    up = Up(written, state=tmp_path / "state")
    up.wait_for(r"worker:0@h2 \| attempt 0 starts at step 0", timeout=300)
    up.wait_for(r"worker:1@h3 \| attempt 0 starts at step 0", timeout=60)
    return up, ckpt


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_a_requeued_allocation_restarts_the_job_from_its_checkpoint_when_it_runs_again(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    """on_failure = "restart-job": the allocation is asked with --requeue; a higher-priority
    job preempts it, Slurm requeues it (same id) and runs it again once the nodes are free;
    `up` waits for that, makes the nodes ready again, and every task resumes from its step."""
    up, ckpt = _resuming(slurm, slurm_inventory, tmp_path)
    (job_id,) = _ours(slurm)
    assert slurm.job_field(job_id, "Requeue") == "1"  # asked so, whatever the cluster's default
    urgent = slurm.sbatch("-p urgent -N2 --exclusive -t 2 -o /dev/null --wrap 'sleep 5'")
    try:
        up.wait_for(r"waiting for it to run again", timeout=120)
        slurm.wait_job(urgent, "COMPLETED", timeout=60)
        # Slurm makes a requeued job eligible ~2 min later (BeginTime); an admin's nudge:
        slurm.start_requeued(job_id)
        assert up.finish(timeout=240) == 0, up.report()
    finally:
        slurm.check(f"scancel {urgent}")
    out = up.stdout
    assert f"Slurm requeued allocation {job_id} (preempted by a higher-priority job)" in out, (
        up.report()
    )
    assert f"allocation {job_id} runs again on h2, h3" in out, up.report()
    for index, host in ((0, "h2"), (1, "h3")):
        resumed = re.search(
            rf"worker:{index}@{host} \[attempt 1\] \| attempt 1 starts at step (\d+)", out
        )
        assert resumed and int(resumed.group(1)) > 0, up.report()
        assert int((ckpt / f"worker{index}").read_text()) == int(resumed.group(1)) + 5
    assert f"released allocation {job_id}" in out, up.report()
    assert _wait_gone(slurm, 30)
    _settled(slurm)


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_ctrl_c_while_up_waits_for_a_requeued_allocation_releases_it(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    """The requeued allocation waits (pending, BeginTime) for `up`'s restart: Ctrl-C then
    ends `up` as anywhere else, and the pending allocation is cancelled, not left queued to
    run later without anyone."""
    up, _ = _resuming(slurm, slurm_inventory, tmp_path)
    (job_id,) = _ours(slurm)
    urgent = slurm.sbatch("-p urgent -N2 --exclusive -t 2 -o /dev/null --wrap 'sleep 5'")
    try:
        up.wait_for(r"waiting for it to run again", timeout=120)
        up.proc.send_signal(signal.SIGINT)
        assert up.finish(timeout=120) == 130, up.report()
        assert f"released allocation {job_id}" in up.stdout, up.report()
        assert _ours(slurm) == []
    finally:
        slurm.check(f"scancel {urgent}")
    _settled(slurm)


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_a_kept_allocation_is_not_handed_to_an_inventory_that_asks_another(
    slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    # Before, the kept allocation in `debug` went to an inventory asking `urgent`, silently (its
    # tasks saw SLURM_JOB_PARTITION=debug). Now only the same request gets it.
    code = tmp_path / "code"
    code.mkdir()
    (code / "task.py").write_text(
        "import os\nprint('partition', os.environ['SLURM_JOB_PARTITION'])\n"
    )
    quick = {"code": code, "command": "python3 task.py", "job": {"require_tensorflow": False}}
    state = tmp_path / "state"
    kept = slurm_inventory(keep_allocation=True, **quick)
    first = tfdeploy("up", str(kept), state=state, timeout=300, check_rc=0)
    assert "kept the allocation for the next up" in first.stderr + first.stdout
    (job_id,) = _ours(slurm)
    other = slurm_inventory(keep_allocation=True, partition="urgent", time="00:10:00", **quick)
    refused = tfdeploy("up", str(other), state=state, timeout=120, check_rc=2)
    said = refused.stdout + refused.stderr
    assert f"allocation {job_id} (tfdeploy-digits) was kept by an up that asked for another" in said
    assert "partition debug (this inventory: urgent)" in said, said
    assert "time 00:15:00 (this inventory: 00:10:00)" in said, said
    assert "tfdeploy down INVENTORY" in said
    assert _ours(slurm) == [job_id], "the refused up submitted or released an allocation"
    same = slurm_inventory(keep_allocation=True, **quick)
    again = tfdeploy("up", str(same), state=state, timeout=300, check_rc=0)
    out = again.stdout + again.stderr
    assert f"using allocation {job_id}, kept by the last up" in out and "partition debug" in out
    tfdeploy("down", str(same), state=state, timeout=120, check_rc=0)
    assert _wait_gone(slurm, within=60)
    _settled(slurm)


def _wait_for_worker_1_past_step_8(lab: Lab, runs: str) -> None:
    """Until the stand-in's worker:1, on h3, has checkpointed past step 8 (its ckpt file)."""

    def step_of_worker_1() -> int:
        said = lab.run("h3", ["sh", "-c", f"cat {runs}/code/ckpt/worker-1 || echo 0"])
        return int(said.stdout.split()[-1])

    deadline = time.monotonic() + 120
    while step_of_worker_1() < 8:
        assert time.monotonic() < deadline, "worker:1 never passed step 8"
        time.sleep(0.5)


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_a_detached_run_restarts_inside_its_allocation_by_its_keeper_and_releases_it(
    slurm_lab: Lab, slurm: SlurmCluster, slurm_inventory: Callable[..., Path], tmp_path: Path
) -> None:
    """Issue 59 on Slurm: `up --detach` of a restart-job job hands the run to a keeper on the
    allocation's first node; a task SIGKILLed on its node with no tfdeploy command running is
    restarted inside the same allocation, both tasks resume and end 0, and once no task is left
    the allocation's body ends it: nothing left on any node."""
    run_id, keeper_host, job_id, runs = _kept_detached_run(slurm, slurm_inventory, tmp_path, 1)
    h3 = slurm_lab.host("h3")

    _wait_for_worker_1_past_step_8(slurm_lab, runs)
    pids = slurm_lab.run(h3, ["pgrep", "-f", standin.NAME]).stdout.split()
    slurm_lab.run(h3, ["kill", "-KILL", *pids])

    record = _keeper_record_once_ended(slurm_lab, keeper_host, runs)
    assert '"outcome": "succeeded"' in record and "worker:1 was killed by signal 9" in record
    assert _ours(slurm) == [job_id]  # the same allocation throughout
    logs = tfdeploy("logs", run_id, state=tmp_path / "a", timeout=120, check_rc=0).stdout
    assert re.search(r"worker 1 attempt 1 resumed from step ([1-9]\d*)", logs), logs
    assert "worker 0 done at step 60" in logs and "worker 1 done at step 60" in logs, logs
    # The body sees no task left (it looks every 30 s, twice) and ends the allocation.
    assert _wait_gone(slurm, 120), "the allocation outlived its run"
    _settled(slurm)


@pytest.mark.names_tf(reason="its tasks are stand-ins without TensorFlow, not the digits default")
def test_a_detached_run_whose_allocation_slurm_requeues_is_rejoined_and_finishes(
    slurm_lab: Lab,
    slurm: SlurmCluster,
    slurm_inventory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """Issue 59's last case: Slurm requeues the allocation of a detached restart-job run (here
    `scontrol requeue`, as a preemption or a failed node does), every step ends, the tasks, the
    keeper and the wardens with them. When the same allocation runs again, its holders start
    the wardens and the keeper again from the run's records (remote/rejoin.py); the keeper
    restarts the whole job, which resumes from its checkpoint and ends 0, with no tfdeploy
    command running; then the allocation ends by itself and nothing is left."""
    run_id, keeper_host, job_id, runs = _kept_detached_run(slurm, slurm_inventory, tmp_path, 2)

    _wait_for_worker_1_past_step_8(slurm_lab, runs)
    slurm.check(f"scontrol requeue {job_id}")
    slurm.wait_job(job_id, "PENDING", timeout=60)
    slurm.wait_nodes("idle", timeout=120)

    def old_steps_left() -> bool:  # slurmd cleans each node up after the old steps ended
        return any(f"[{job_id}." in p.cmdline for n in ("h2", "h3") for p in slurm_lab.processes(n))

    deadline = time.monotonic() + 60
    while old_steps_left():  # a run again before that was seen to fail at once (0:00)
        assert time.monotonic() < deadline, "the requeued allocation's old steps never ended"
        time.sleep(0.2)
    # Slurm makes a requeued job eligible ~2 min later (BeginTime); an admin's nudge:
    slurm.start_requeued(job_id)
    slurm.wait_job(job_id, "RUNNING", timeout=120)

    record = _keeper_record_once_ended(slurm_lab, keeper_host, runs, '"rejoined"')
    assert '"outcome": "succeeded"' in record, record
    assert f"Slurm requeued allocation {job_id}" in record, record
    assert _ours(slurm) == [job_id]  # the same allocation, run again
    logs = tfdeploy("logs", run_id, state=tmp_path / "a", timeout=120, check_rc=0).stdout
    assert re.search(r"worker 1 attempt \d resumed from step ([1-9]\d*)", logs), logs
    assert "worker 0 done at step 60" in logs and "worker 1 done at step 60" in logs, logs

    def records_left() -> str:  # the records that held the run's secret leave with the run
        look = f"ls {runs}/rejoin-*.json 2>/dev/null || true"
        return "".join(slurm_lab.run(n, ["sh", "-c", look]).stdout for n in ("h2", "h3"))

    deadline = time.monotonic() + 60
    while left := records_left():
        assert time.monotonic() < deadline, left
        time.sleep(0.5)
    assert _wait_gone(slurm, 120), "the allocation outlived its rejoined run"
    _settled(slurm)
