"""The lab's real Slurm cluster itself (tests/lab/slurm.py): what tfdeploy's Slurm source and
its tests rely on, checked against slurmctld/slurmd as they run here.

Each test ends on the `slurm` fixture's check: squeue empty and no process of a job on any host.
"""

from __future__ import annotations

import select
import time

import pytest

from tests.lab import SlurmCluster
from tests.lab.slurm import SLURMD_TIMEOUT


def _hold(slurm: SlurmCluster, args: str) -> str:
    """A batch job that holds its allocation (sleeps) until cancelled; returns once RUNNING."""
    job = slurm.sbatch(f"{args} -o /dev/null --wrap 'exec sleep 600'")
    slurm.wait_job(job, "RUNNING", timeout=30)
    return job


def _cancel(slurm: SlurmCluster, job: str) -> None:
    slurm.check(f"scancel {job}")
    slurm.wait_job(job, "CANCELLED", "COMPLETED", "PREEMPTED", timeout=30)


def test_batch_job_runs_a_step_on_both_nodes(slurm: SlurmCluster) -> None:
    out = slurm.shared / "both.out"
    job = slurm.sbatch(f"-N2 --ntasks-per-node=1 -o {out} --wrap 'srun hostname'")
    slurm.wait_job(job, "COMPLETED", timeout=60)
    assert sorted(out.read_text().split()) == sorted(h.hostname for h in slurm.nodes)


def test_srun_runs_one_task_per_node_with_its_rank(slurm: SlurmCluster) -> None:
    out = slurm.check("srun -N2 -n2 sh -c 'echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_NODEID'")
    assert sorted(out.splitlines()) == ["0 h2 0", "1 h3 1"]


def _readline(proc_out: object, timeout: float = 20) -> str:
    """One line from a pipe, or a failure after `timeout` (never a hang)."""
    ready, _, _ = select.select([proc_out], [], [], timeout)
    assert ready, f"no line within {timeout}s"
    return proc_out.readline()  # type: ignore[attr-defined, no-any-return]


def test_overlap_step_carries_stdin_and_stdout_both_ways(slurm: SlurmCluster) -> None:
    # What an agent speaking over a step needs: requests in, answers out, one line at a time,
    # inside an allocation that a batch job already holds.
    job = _hold(slurm, "-N2 --exclusive")
    echo = "import sys\nfor line in sys.stdin: print(line.strip().upper(), flush=True)"
    step = slurm.login_popen(f"srun --jobid={job} --overlap -w h3 -N1 -n1 python3 -u -c '{echo}' ")
    try:
        assert step.stdin is not None and step.stdout is not None
        for word in ("ping", "second", "third"):
            step.stdin.write(word + "\n")
            step.stdin.flush()
            assert _readline(step.stdout).strip() == word.upper()
        step.stdin.close()  # end of input ends the step
        assert step.wait(timeout=20) == 0, step.stderr.read() if step.stderr else ""
    finally:
        if step.poll() is None:
            step.kill()
            step.wait()
    _cancel(slurm, job)


def test_gres_grants_one_gpu_per_task_and_none_without_a_request(slurm: SlurmCluster) -> None:
    out = slurm.check(
        "srun -N2 --ntasks-per-node=2 --gpus-per-task=1 "
        "sh -c 'echo $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES-unset} ${SLURM_STEP_GPUS-unset}'"
    )
    lines = sorted(out.splitlines())
    # Each node has gpu:2; its two tasks get one each, so each sees a different single GPU.
    assert lines == ["h2 0 0", "h2 1 1", "h3 0 0", "h3 1 1"], out
    plain = slurm.check("srun -N1 sh -c 'echo ${CUDA_VISIBLE_DEVICES-unset}'")
    assert plain.strip() == "unset"
    whole = slurm.check("srun -N1 --gres=gpu:2 sh -c 'echo $CUDA_VISIBLE_DEVICES'")
    assert whole.strip() == "0,1"


def test_more_nodes_than_exist_pends_with_partition_config(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("-N5 -o /dev/null --wrap true")
    slurm.wait_job(job, "PENDING", timeout=10)

    def reason() -> str:
        return slurm.job_field(job, "Reason")

    deadline = time.monotonic() + 15
    while reason() in ("None", "Priority") and time.monotonic() < deadline:
        time.sleep(0.1)  # the scheduler sets the reason on its next pass
    assert reason() == "PartitionConfig"
    (listed,) = slurm.jobs()
    assert (listed.id, listed.state, listed.reason) == (job, "PENDING", "PartitionConfig")
    _cancel(slurm, job)


def test_srun_of_more_nodes_than_exist_waits_unless_bounded(slurm: SlurmCluster) -> None:
    # Slurm's default EnforcePartLimits=NO: srun queues the impossible request like sbatch and
    # waits; only a bound (--immediate) ends it, with Slurm's reason on stderr.
    started = time.monotonic()
    done = slurm.login_run("srun -N5 --immediate=1 true", timeout=30)
    assert done.returncode != 0
    assert "Requested partition configuration not available now" in done.stderr, done.stderr
    assert time.monotonic() - started < 20


def test_urgent_partition_requeues_a_requeueable_job(slurm: SlurmCluster) -> None:
    low = _hold(slurm, "-p debug -N2 --exclusive --requeue")
    urgent = slurm.sbatch("-p urgent -N2 --exclusive -o /dev/null --wrap 'exec sleep 600'")
    slurm.wait_job(urgent, "RUNNING", timeout=30)
    slurm.wait_job(low, "PENDING", timeout=30)
    assert slurm.job_field(low, "Restarts") == "1"
    assert slurm.job_field(low, "Reason") == "BeginTime"  # eligible again only ~120 s later
    _cancel(slurm, urgent)
    slurm.check(f"scontrol update JobId={low} StartTime=now")
    slurm.wait_job(low, "RUNNING", timeout=30)
    _cancel(slurm, low)


def test_urgent_partition_preempts_a_job_without_requeue(slurm: SlurmCluster) -> None:
    low = _hold(slurm, "-p debug -N2 --exclusive --no-requeue")
    urgent = slurm.sbatch("-p urgent -N2 --exclusive -o /dev/null --wrap true")
    assert slurm.wait_job(low, "PREEMPTED", timeout=30) == "PREEMPTED"
    slurm.wait_job(urgent, "COMPLETED", timeout=30)


@pytest.mark.slow
def test_killed_slurmd_marks_the_node_down_and_requeues_its_job(slurm: SlurmCluster) -> None:
    job = _hold(slurm, "-N1 -w h2 --requeue")
    killed = time.monotonic()
    slurm.kill_slurmd("h2")
    slurm.wait_nodes("down*", names=["h2"], timeout=SLURMD_TIMEOUT * 4 + 10)
    down_after = time.monotonic() - killed
    assert slurm.check("sinfo -h -n h2 -o %E").split("\n")[0] == "Not responding"
    # The job on it is requeued ("requeue job due to failure of node"), not left RUNNING.
    state = slurm.wait_job(job, "PENDING", "CONFIGURING", "RUNNING", timeout=30)
    assert slurm.job_field(job, "Restarts") == "1", state
    assert slurm.node_state("h3") in ("idle", "allocated", "mixed")
    slurm.start_slurmd("h2")
    slurm.wait_nodes("idle", names=["h2"], timeout=30)  # ReturnToService=2
    print(f"h2 down {down_after:.1f}s after its slurmd was killed (SlurmdTimeout={SLURMD_TIMEOUT})")
    slurm.check(f"scancel {job}")
    slurm.wait_job(job, "CANCELLED", timeout=30)


def test_leftover_check_finds_a_process_that_left_its_job(slurm: SlurmCluster) -> None:
    # Without cgroups a process that leaves with setsid outlives its step (on a real cluster the
    # job's cgroup takes it): the check every Slurm test ends on must see it.
    slurm.check("srun -N1 -w h2 sh -c 'setsid sleep 321 </dev/null >/dev/null 2>&1 &'")
    left = slurm.leftovers(settle=1)
    assert "squeue" not in left
    assert any("sleep 321" in item for item in left.get("h2", [])), left
    assert slurm.lab.kill_leftovers("h2")
    assert slurm.leftovers() == {}


@pytest.mark.slow
def test_a_crashed_node_comes_back_idle_when_its_host_is_revived(slurm: SlurmCluster) -> None:
    lab = slurm.lab
    lab.crash_host("h3")  # every process of the host dies at once, slurmd included
    slurm.wait_nodes("down*", names=["h3"], timeout=SLURMD_TIMEOUT * 4 + 10)
    lab.revive_host("h3")  # boots with its mounts and starts slurmd, as a rebooted node would
    slurm.wait_nodes("idle", names=["h3"], timeout=30)
    assert slurm.check("srun -N1 -w h3 hostname").strip() == slurm.node("h3").hostname
