"""The lab's real Slurm cluster itself (tests/lab/slurm.py): what tfdeploy's Slurm source and
its tests rely on, checked against slurmctld/slurmd as they run here.

Each test ends on the `slurm` fixture's check: squeue empty and no process of a job on any host.
"""

from __future__ import annotations

import random
import select
import time
from pathlib import Path

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
    slurm.start_requeued(low)
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


@pytest.mark.both_trackings  # what it checks happens on linuxproc only
def test_leftover_check_finds_a_process_that_left_its_job(slurm: SlurmCluster) -> None:
    # Without cgroups a process that leaves with setsid outlives its step (on a real cluster the
    # job's cgroup takes it): the check every Slurm test ends on must see it.
    if slurm.proctrack == "cgroup":
        pytest.skip("under proctrack/cgroup Slurm kills such a process with its step itself")
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


# ---- tfdeploy's readers of Slurm's output and options, against Slurm itself (issue 58) --------


def _generated_hostlists(seed: int = 58, count: int = 300) -> list[str]:
    """Hostlists of every form Slurm prints, generated from the grammar: plain names, several
    brackets per name (`rack[1-2]-n[01-04]`), lists and single numbers in a bracket
    (`a[1-3,5]`), zero padding of either width (`n[01-10]`, `n[8-10]`, `n[008-10]`), commas
    outside brackets (`a1,b[2-3]`), pieces with dots, dashes and underscores, empty pieces."""
    rng = random.Random(seed)
    pieces = ["", "n", "gpu", "rack", "-n", "a.b", "x_y", "h-", "c1-", "Node"]

    def numeral() -> str:
        n = rng.choice([0, 1, 2, 7, 8, 9, 10, 11, 99, 100])
        return str(n).zfill(rng.choice([1, 1, 2, 3]))

    def rng_range() -> str:
        lo = numeral()
        if rng.random() < 0.3:
            return lo
        hi = int(lo) + rng.choice([0, 1, 2, 3, 12])
        return f"{lo}-{str(hi).zfill(rng.choice([1, 2, 3]))}"

    def token() -> str:
        if rng.random() < 0.2:
            return rng.choice(["h1", "gpu01", "login", "n-7", "a.b.c"])
        brackets = rng.choice([1, 1, 1, 2, 2, 3])
        out = ""
        for i in range(brackets):
            # a first piece never starts with '-': scontrol would read it as an option (and
            # tfdeploy refuses such a name, which it would hand to scontrol and srun)
            piece = rng.choice(pieces if i else [p for p in pieces if p[:1] not in ("", "-")])
            ranges = ",".join(rng_range() for _ in range(rng.choice([1, 1, 2, 3])))
            out += f"{piece}[{ranges}]"
        return out

    return [",".join(token() for _ in range(rng.choice([1, 1, 2, 3]))) for _ in range(count)]


# Forms Slurm refuses, and tfdeploy with it. (Slurm also reads forms it never prints, such as a
# space or a `+` inside a bracket: tfdeploy refuses those; they are not compared.)
REFUSED_HOSTLISTS = (
    "h[-]",
    "h[]",
    "h[5-3]",
    "h[1-3]x",
    "x[1-2]y[3-4]z",
    "h[1-2]]",
    "a-[1-2]-b",
    "h[0-9999999999]",
    "n[0-1048576]",
)


def test_the_hostlist_parser_expands_as_scontrol_show_hostnames(slurm: SlurmCluster) -> None:
    from deployer.sources.slurm.outputs import UnreadableOutput, expand_hostlist

    # The forms issue 58 names, then generated ones, then forms Slurm refuses.
    named = [
        "rack[1-2]-n[01-04]",
        "a[1-3,5]",
        "n[01-10]",
        "n[8-10]",
        "a1,b[2-3]",
        "a[1-2]b[3-4]c[5,6]",
    ]
    expressions = [*named, *_generated_hostlists(), *REFUSED_HOSTLISTS]
    slurms = slurm.hostnames(expressions)
    for expression, by_slurm in zip(expressions, slurms, strict=True):
        try:
            ours: list[str] | None = expand_hostlist(expression, "test", limit=100_000)
        except UnreadableOutput:
            ours = None
        assert ours == by_slurm, expression
    assert sum(s is None for s in slurms) == len(REFUSED_HOSTLISTS)


def test_the_sbatch_option_table_is_the_lab_sbatchs(slurm: SlurmCluster) -> None:
    from deployer.sources.slurm.sbatch_options import LONG_OPTIONS

    assert slurm.sbatch_long_options() == LONG_OPTIONS


def test_every_prefix_resolves_as_sbatchs_getopt_long_resolves_it(slurm: SlurmCluster) -> None:
    from deployer.sources.slurm.sbatch_options import LONG_OPTIONS, resolve

    prefixes = sorted({n[:i] for n in LONG_OPTIONS for i in range(1, len(n) + 1)})
    said = slurm.sbatch_says(prefixes)
    for prefix in prefixes:
        kind, names = said[prefix]
        found = resolve(prefix)
        if kind == "ambiguous":
            assert found.ambiguous and sorted(found.candidates) == sorted(names), prefix
        elif kind in ("requires", "takes-none"):
            assert (found.name, found.ambiguous) == (names[0], False), prefix
        else:  # took an option whose value is optional without saying its name
            assert kind == "other" and found.name is not None, (prefix, kind)
            assert LONG_OPTIONS[found.name] == "optional", prefix


def test_refused_abbreviations_are_what_sbatch_really_takes_them_for(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # What an abbreviation did before it was refused: sbatch took `--job-n=` for --job-name and
    # `--parti=` for --partition (the allocation then invisible to tfdeploy's `squeue -n`).
    from deployer.core.errors import InventoryError
    from deployer.sources import load_inventory
    from tests.support.slurm_outputs import BASE

    written = {"--job-n": "probe58", "--parti": "urgent", "--comm": "c"}
    taken = {"--job-n": "JobName", "--parti": "Partition", "--comm": "Comment"}
    names = {"--job-n": "--job-name", "--parti": "--partition", "--comm": "--comment"}
    options = " ".join(f"{o}={v}" for o, v in written.items())
    job = slurm.sbatch(f"--hold -o /dev/null {options} --wrap true")
    try:
        shown = f" {slurm.check(f'scontrol show job -o {job}').strip()} "
        for option, value in written.items():
            assert f" {taken[option]}={value} " in shown, (option, shown)
            path = tmp_path / "inv.toml"
            extra = f'sbatch_options = ["{option}={value}"]\n'
            path.write_text(BASE.format(extra=extra, group=""))
            with pytest.raises(InventoryError, match=f"sbatch reads it as {names[option]}"):
                load_inventory(path)
        ambiguous = slurm.login_run("sbatch --n=1 --hold --wrap true")
        assert ambiguous.returncode != 0 and "is ambiguous" in ambiguous.stderr
    finally:
        _cancel(slurm, job)
