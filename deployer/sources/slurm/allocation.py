"""One allocation per job, as Slurm's commands see it: checked before anything waits, submitted,
waited for (saying why it waits), its lease keeper started, a requeue told apart, and what Slurm
did to it said in words.

These are steps on one cluster; which allocation an `up` holds, and its end, is held.py's. A
SIGKILLed `up` ends nothing: its keeper's step loses its stdin and stops renewing the lease, and
the allocation's body ends it `lease_seconds` later.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from deployer.config.sources import Say
from deployer.core.errors import TfdeployError
from deployer.hosts.transport import Session, Transport
from deployer.sources.slurm import batch
from deployer.sources.slurm.cluster import Cluster, SlurmRefused, words
from deployer.sources.slurm.outputs import NEVER_REASONS, JobState, QueuedJob, say_duration
from deployer.sources.slurm.settings import SlurmSettings

POLL_S = 2.0  # between squeue calls while the allocation waits
SAY_EVERY_S = 20.0  # a waiting line at least this often, and whenever the reason changes
# How long an allocation whose nodes were all lost may take to show that Slurm requeued it:
# the steps die first, the job turns COMPLETING, then PENDING (the lab's KillWait is 5 s).
REQUEUE_SETTLE_S = 60.0


class AllocationWaitEnded(TfdeployError):
    """The allocation did not start within `wait`; it was cancelled."""


class AllocationLost(TfdeployError):
    """The allocation ended (or was requeued) before its nodes could be used."""


@dataclass(frozen=True)
class Running:
    """An allocation as this `up` last saw it start running: its nodes, and since when (a
    requeue that ran it again before anyone looked is told apart by a later start)."""

    job_id: str
    nodes: tuple[str, ...]
    since: float  # Unix seconds


def check_request(cluster: Cluster, settings: SlurmSettings) -> None:
    """A request Slurm can never meet is refused now, before anything waits: an unknown
    partition, then sbatch's own judgement (`--test-only`, in Slurm's words), then the
    partition's size and limits, which sbatch may accept and leave pending forever."""
    part = cluster.partition(settings.partition)
    argv = batch.sbatch_argv(settings, test_only=True)
    code, out, err = cluster.call(argv, stdin=batch.body(settings).encode())
    if code != 0:
        raise SlurmRefused(
            f"Slurm refuses {settings.nodes} nodes in partition {part.name!r} for "
            f"{settings.time}: {words(err, out)} (sbatch --test-only; the partition has "
            f"{part.total_nodes} nodes, MaxNodes={_or_unlimited(part.max_nodes)}, "
            f"MaxTime={_or_unlimited(part.max_time, say_duration)})",
            hint=f"compare [slurm] with `scontrol show partition {part.name}` and "
            "`sinfo -o '%P %D %l %G'`: nodes, time, gpus, constraint",
        )
    where = f"partition {part.name!r}"
    if settings.nodes > part.total_nodes:
        raise SlurmRefused(
            f"{settings.nodes} nodes asked of {where}, which has {part.total_nodes} "
            f"(scontrol show partition {part.name}: TotalNodes={part.total_nodes})",
            hint="lower nodes in [[slurm.hosts]], or choose a larger partition (`sinfo -s`)",
        )
    if part.max_nodes is not None and settings.nodes > part.max_nodes:
        raise SlurmRefused(
            f"{settings.nodes} nodes asked of {where}, whose jobs may have {part.max_nodes} "
            f"(MaxNodes={part.max_nodes})",
            hint="lower nodes in [[slurm.hosts]], or choose another partition (`sinfo -s`)",
        )
    if part.max_time is not None and _limit(settings.time) > part.max_time:
        raise SlurmRefused(
            f"time {settings.time} is over the time limit of {where}, "
            f"{say_duration(part.max_time)} (MaxTime)",
            hint=f"set time in [slurm] to at most {say_duration(part.max_time)}",
        )


def _or_unlimited(value: int | None, say: Callable[[float], str] = str) -> str:
    return "UNLIMITED" if value is None else say(value)


def _limit(time_limit: str) -> int:
    from deployer.sources.slurm.outputs import limit_seconds

    return limit_seconds(time_limit) or 0


def submit(cluster: Cluster, settings: SlurmSettings) -> str:
    argv = batch.sbatch_argv(settings)
    code, out, err = cluster.call(argv, stdin=batch.body(settings).encode())
    if code != 0:
        raise SlurmRefused(
            f"sbatch refused the allocation: {words(err, out)}",
            hint="check the [slurm] keys with `sbatch --test-only` on the login node",
        )
    from deployer.sources.slurm.outputs import parse_submitted

    return parse_submitted(out, "sbatch --parsable")


def wait_running(
    cluster: Cluster,
    settings: SlurmSettings,
    job_id: str,
    say: Say,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> QueuedJob:
    """Until the allocation runs, saying why it waits; cancelled (and raised) at the bound or
    at a reason that never resolves. Ctrl-C: its holder's release cancels it."""
    start = clock()
    said: tuple[str, str] | None = None
    said_at = start
    while True:
        job = cluster.job(job_id)
        if job is None or job.state.ended:
            state = job.state.value if job else "gone"
            raise AllocationLost(
                f"allocation {job_id} ended before it ran ({state})",
                hint=f"see why on the login node: scontrol show job {job_id}",
            )
        if job.state is JobState.RUNNING:
            return job
        waited = clock() - start
        if job.reason in NEVER_REASONS:
            cluster.cancel(job_id)
            raise SlurmRefused(
                f"allocation {job_id} can never start in partition {settings.partition!r}: "
                f"Slurm says {job.reason}; it was cancelled",
                hint=f"`scontrol show partition {settings.partition}` shows its limits; ask for "
                "fewer nodes, less time, or another partition",
            )
        now = (job.state.value, job.reason)
        # Reason "None": the scheduler has not looked at it yet (it runs a second later, or
        # says why it waits): not worth a line until it lasts.
        news = now != said and (job.reason != "None" or waited >= SAY_EVERY_S)
        if news or clock() - said_at >= SAY_EVERY_S:
            say(waiting_line(settings, job, waited))
            said, said_at = now, clock()
        if settings.wait and waited >= settings.wait:
            cluster.cancel(job_id)
            raise AllocationWaitEnded(
                f"allocation {job_id} waited {say_duration(waited)} for {settings.nodes} nodes "
                f"in {settings.partition} ({job.reason}) and was cancelled (wait = "
                f"{settings.wait:g})",
                hint="raise wait in [slurm] (0: as long as it takes), or ask for fewer nodes",
            )
        sleep(POLL_S)


def requeued(
    cluster: Cluster,
    running: Running,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> QueuedJob | None:
    """The allocation once Slurm shows it requeued (pending again, or running again since the
    nodes were lost); None: it still runs as it did, so its nodes were lost some other way.
    One that ended for good (preempted without requeue, cancelled) is AllocationLost."""
    deadline = clock() + REQUEUE_SETTLE_S
    while True:
        job = cluster.job(running.job_id)
        if job is None or job.state.ended:
            said = what_slurm_did(cluster, running.job_id, running.nodes) if job else None
            raise AllocationLost(
                said or f"allocation {running.job_id} is gone",
                hint="it cannot run again: `tfdeploy up` asks for a new one",
            )
        if job.state.waiting or ran_again(running, job):
            return job
        if clock() >= deadline:
            return None
        sleep(POLL_S)


def ran_again(running: Running, job: QueuedJob, now: float | None = None) -> bool:
    """Running, but started after the run began: requeued and run again before anyone asked."""
    if job.state is not JobState.RUNNING or job.elapsed is None:
        return False
    now = time.time() if now is None else now
    return now - job.elapsed > running.since + POLL_S


def waiting_line(settings: SlurmSettings, job: QueuedJob, waited: float) -> str:
    """ "waiting for 2 nodes in gpu: Resources, 1m40s" (squeue's state when not PENDING)."""
    state = "" if job.state is JobState.PENDING else f"{job.state.value}, "
    return (
        f"waiting for {settings.nodes} nodes in {settings.partition}: {state}{job.reason}, "
        f"{say_duration(waited)} (allocation {job.id})"
    )


@dataclass(frozen=True)
class Keeper:
    """The lease keeper: a step on the allocation's first node that renews the body's lease
    while its session is open (batch.KEEPER), and its transport (a channel of the cluster's
    login connection, Cluster.steps_on)."""

    session: Session
    transport: Transport

    def tell(self, mode: str) -> None:
        """Hands the allocation over: "detached" (the body ends it once no task of the run is
        left) or "keep" (the body holds it for the next `up`), whatever becomes of the lease."""
        with self.session.lock:
            self.session.request(mode.encode() + b"\n", 30.0)

    def close(self) -> None:
        """Its stdin closed: the keeper stops renewing (after a requeue it is gone already)."""
        with contextlib.suppress(Exception):
            self.session.close()
        with contextlib.suppress(Exception):
            self.transport.close()


def start_keeper(cluster: Cluster, job_id: str, first_node: str) -> Keeper:
    """The keeper on the first node, answering its first beat."""
    from deployer.hosts.step_transport import StepTransport

    launcher = batch.step_launcher(job_id, first_node)
    transport = StepTransport(first_node, cluster.steps_on(first_node), launcher)
    keeper: Keeper | None = None
    try:
        keeper = Keeper(transport.open_session(batch.keeper_argv(job_id)), transport)
        reply = keeper.session.request(b"beat\n", 60.0)
        if reply.strip() != b"ok":
            raise AllocationLost(f"the lease keeper of allocation {job_id} said {reply!r}")
        return keeper
    except BaseException:
        if keeper is not None:
            keeper.close()
        else:
            transport.close()
        raise


def what_slurm_did(cluster: Cluster, job_id: str, nodes: tuple[str, ...]) -> str | None:
    """Why the allocation no longer runs, when Slurm ended or requeued it during the run (a
    node that failed, a preemption, the time limit); None: it still runs."""
    job = cluster.job(job_id)
    if job is None or job.state is JobState.RUNNING:
        return None
    states = cluster.nodes(nodes) if nodes else {}
    failed = [
        n
        for n in states.values()
        if any(word in n.state for word in ("DOWN", "NOT_RESPONDING", "FAIL")) or "*" in n.state
    ]
    said = ", ".join(n.state for n in failed)
    lost = f"node {', '.join(n.name for n in failed)} failed: {said}" if failed else ""
    what = f"allocation {job.id}"
    if job.state.waiting:
        why = lost or "preempted by a higher-priority job"
        return f"Slurm requeued {what} ({why}); it is {job.state.value.lower()} ({job.reason})"
    if job.state is JobState.PREEMPTED:
        return f"Slurm preempted {what}: a higher-priority job took its nodes"
    if job.state is JobState.TIMEOUT:
        return f"{what} reached its time limit"
    if job.state is JobState.NODE_FAIL or lost:
        return f"Slurm ended {what}: {lost or 'a node failed'}"
    return f"{what} ended outside tfdeploy ({job.state.value.lower()})"
