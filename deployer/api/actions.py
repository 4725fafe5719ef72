"""What `tfdeploy down` and `tfdeploy pull` do, shared by the CLI's verbs and the `Run` handle:
one path for both. Messages go to the callbacks a caller passes; errors are raised, typed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from deployer.config.inventory import Inventory, discover_hosts
from deployer.config.model import Job
from deployer.config.sources import ANY_TIME, AT_DOWN
from deployer.core.errors import HostsFailed, Interrupted, TfdeployError, UsageError
from deployer.core.secrets import Masker
from deployer.hosts.fleet import DEFAULT_CONCURRENCY, Fleet
from deployer.hosts.gpurelease import prove_runs_released
from deployer.hosts.reply_types import escaped_text
from deployer.results.metricsync import keep_ended, keep_if_ended, keep_runs
from deployer.results.pull import KEPT, PullResult, artifacts_home, pull, resume_command
from deployer.results.runs import HostRun, Survey, Target, stop_runs, survey_runs
from deployer.results.state import artifacts_pulled, mark_artifacts_pulled
from deployer.up import firewall
from deployer.watch.progress import SayProgress, StopCountdown

Say = Callable[[str], None]
E = TypeVar("E", bound=TfdeployError)


def discovered(target: Target) -> Target:
    """The target with its host sources' hosts found (a no-op without sources)."""
    return dataclasses.replace(target, inventory=discover_hosts(target.inventory))


# How long `down` may spend pulling a detached run's job.artifacts before it cuts the pull.
ARTIFACTS_TIMEOUT_S = 600.0


def stop(
    target: Target,
    *,
    terminate: bool,
    say: Say,
    warn: Say | None = None,
    artifacts: bool = True,
    artifacts_timeout: float = ARTIFACTS_TIMEOUT_S,
    progress: Say | None = None,
) -> list[str]:
    """`tfdeploy down`: stops the target's runs (or its one run, finished tasks' escaped
    processes too), removes their firewall rules, pulls the job.artifacts of detached runs
    not pulled yet (unless `artifacts` is false; cut after `artifacts_timeout` seconds, what
    arrived kept), and terminates what the sources created that is due at `down` (every
    machine they created, with `terminate`). Returns the hosts where something was stopped. A
    host that could not be asked is raised after the others were stopped (HostsFailed); a
    run id no host has is a UsageError."""
    warn = warn or say
    found_target = discovered(target)
    job = found_target.inventory.job
    with Fleet(found_target.hosts) as fleet:
        survey = survey_runs(fleet, found_target)
        found, unreachable = survey.runs, survey.failures
        # A named run is stopped even with every task finished: its escaped processes may not be.
        running = {f"{t.name}@{r.host}": r.host for r in found for t in r.tasks if not t.finished}
        shows = SayProgress(progress) if progress is not None else None
        with StopCountdown(shows, running, job.stop_grace) as countdown:
            stopped, failed = stop_runs(
                fleet,
                found,
                grace=job.stop_grace,
                finished_too=target.run_id is not None,
                on_host=countdown.done,
            )
        # Their metrics and outcome, for `runs` and `report`: the runs this stop ended, the
        # one named, and the runs found ended whose end this machine has not recorded yet
        # (a detached run that ended by itself); not every old run of the job: one poll per
        # run and host each, once.
        keep_runs(fleet, [r for r in found if r.active or r.run_id == target.run_id])
        keep_ended(fleet, [r for r in found if r.run_id != target.run_id], unreachable)
        gpus_held = prove_runs_released(
            fleet, [(s.run.host, s.run.run_id, s.pids) for s in stopped]
        )
        if job.firewall:  # after the stop: ports stay closed until tasks are gone
            for r in found:
                for failure in firewall.remove(fleet, [fleet.member(r.host)], r.run_id):
                    warn(f"could not remove the firewall rules on {failure.message}")
        shown = [s for s in stopped if s.anything]
        hide = inventory_masker(found_target.inventory)
        for s in shown:
            say(f"stopped run {s.run.run_id} on {s.run.host}{_before_start(s.run)}")
            if s.escaped:
                say(f"{s.run.host}: {escaped_text(s.escaped, hide)}")
        if artifacts:  # before any machine is terminated: they are the files' only copy
            for line in detached_artifacts(fleet, found, job, artifacts_timeout):
                say(line)
    # An unreachable host is no reason to keep paying for it: terminating ends its tasks too.
    terminate_sources(target.inventory, ANY_TIME if terminate else AT_DOWN, say)
    if unreachable or failed:
        done = "the run was stopped on the other hosts" if shown else "nothing was stopped"
        raise HostsFailed([*unreachable, *failed], what="stopping failed", outcome=done)
    if gpus_held:  # docs/gpus.md: exit 3, the stop did not free the GPU
        raise HostsFailed(gpus_held, what="GPU memory still held", outcome="the run was stopped")
    if target.run_id is not None and not found:
        raise unknown_run(target, survey)
    if not shown:
        say(f"nothing to stop: {_nothing_running(target, survey)}")
    return [s.run.host for s in shown]


def pull_files(
    target: Target,
    patterns: Sequence[str],
    to: str | os.PathLike[str],
    *,
    tasks: Sequence[str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    inventory: str | None = None,
) -> PullResult:
    """`tfdeploy pull` and `Run.pull`: the target run's files home. Ctrl-C (or a signal) is
    raised as Interrupted whose hint is the pull that fetches the rest (`inventory`: the
    `-i` it repeats)."""
    found = discovered(target)
    assert found.run_id is not None, "pull needs a run id"
    with Fleet(found.hosts, concurrency=concurrency) as fleet:
        try:
            pulled = pull(fleet, found.run_id, list(patterns), Path(to), tasks=tasks)
        except KeyboardInterrupt as exc:
            signum = int(getattr(exc, "signum", signal.SIGINT))
            again = resume_command(
                found.run_id, list(patterns), os.fspath(to), tasks=tasks, inventory=inventory
            )
            raise Interrupted(f"pull interrupted; {KEPT}", hint=again, signum=signum) from None
        keep_if_ended(fleet, found)  # a pull after the run ended: its end for the history
    return pulled


def waiting_artifacts(runs: Sequence[HostRun], job: Job) -> list[str]:
    """Detached runs of `runs` that have ended with job.artifacts not pulled yet (this
    machine's marker: `down` leaves it), newest first."""
    if not job.artifacts:
        return []
    ids = dict.fromkeys(r.run_id for r in runs if r.detached)
    active = {r.run_id for r in runs if r.active}
    return [i for i in ids if i not in active and not artifacts_pulled(i)]


def detached_artifacts(
    fleet: Fleet, runs: Sequence[HostRun], job: Job, timeout: float
) -> list[str]:
    """`down`'s pull: job.artifacts of each detached run among `runs` not pulled yet, into
    job.artifacts_to, as `up` pulls an attached run's; the lines to say. The pull is cut after
    `timeout` seconds (the connections in flight dropped): what arrived is kept and the line
    says the `pull` that fetches the rest."""
    lines: list[str] = []
    for run_id in dict.fromkeys(r.run_id for r in runs if r.detached):
        if not job.artifacts or artifacts_pulled(run_id):
            continue
        hosts = {r.host for r in runs if r.run_id == run_id}
        with _Bound(fleet, timeout) as bound:
            got = artifacts_home(fleet, job, run_id, hosts)
        lines += [f"run {run_id}: {line}" for line in got]
        if bound.passed:
            again = resume_command(run_id, job.artifacts, job.artifacts_to)
            lines.append(
                f"run {run_id}: the artifacts pull was cut after {timeout:g} s "
                f"(--artifacts-timeout): {KEPT}: {again}"
            )
        elif not any(line.startswith("artifacts were not pulled") for line in got):
            mark_artifacts_pulled(run_id, job.artifacts_to)
    return lines


class _Bound:
    """A deadline on calls through a fleet: once it passes, the connections with a call in
    flight are dropped (every second, until the block ends), so the calls fail at once."""

    def __init__(self, fleet: Fleet, seconds: float) -> None:
        self.fleet, self.seconds, self.passed = fleet, seconds, False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _Bound:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        self.passed = True
        while not self._done.is_set():
            self.fleet.interrupt()
            self._done.wait(1.0)


def newest_run(target: Target, verb: str, say: Say) -> Target:
    """An inventory named without a run id (`logs`, `pull`): its job's newest run on the hosts
    (the hosts are the record: another shell's runs count), said through `say`. A run id
    named is kept as it is. Raises UsageError when no host has a run of the job, HostsFailed
    when no host could be asked."""
    if target.run_id is not None:
        return target
    found = discovered(target)
    with Fleet(found.hosts) as fleet:
        survey = survey_runs(fleet, found)
    if not survey.runs:
        if survey.failures:
            raise HostsFailed(survey.failures, what="listing runs failed", outcome=None)
        raise UsageError(
            f"{verb}: {survey.nothing_found(found)}",
            hint="`tfdeploy up INVENTORY` starts one; `tfdeploy status INVENTORY` lists runs",
        )
    newest = survey.runs[0].run_id  # newest first
    say(
        f"{verb}: run {newest}, the newest of job {found.inventory.job.name!r} on its hosts "
        f"(`tfdeploy {verb} RUN_ID ...` for another; `tfdeploy status INVENTORY` lists them)"
    )
    return dataclasses.replace(found, run_id=newest)


def terminate_sources(inventory: Inventory, when: tuple[str, ...], say: Say) -> None:
    """Ends the machines the inventory's sources created whose end is due at `when`; never one
    they only discovered."""
    for source in inventory.sources:
        source.terminate(when, say)


def inventory_masker(inventory: Inventory) -> Masker:
    """Every secret a task of this inventory may carry (in its output, its command line): the
    env tables, and forward_env as this shell has it."""
    job = inventory.job
    forwarded = {n: os.environ[n] for n in job.forward_env if n in os.environ}
    envs = [job.env, forwarded, *(s.env for h in inventory.hosts for s in h.tasks)]
    return Masker.of(envs, job.secret_env)


def unknown_run(target: Target, survey: Survey) -> UsageError:
    return UsageError(
        survey.nothing_found(target),
        hint="`tfdeploy status INVENTORY` lists the runs on the inventory's hosts",
    )


def _before_start(run: HostRun) -> str:
    """What stopping a run its `up` was still preparing means, for `down`'s line."""
    if not run.starting:
        return ""
    return (
        " before any task of it started (its `up` was preparing it): the host refuses the "
        "rest of it, and that `up` starts nothing"
    )


def _nothing_running(target: Target, survey: Survey) -> str:
    if not survey.runs:
        return survey.nothing_found(target)
    ids = sorted({r.run_id for r in survey.runs})
    what = f"run {ids[0]} has" if len(ids) == 1 else f"the {len(ids)} runs of the job have"
    return f"{what} no running task on {', '.join(sorted({r.host for r in survey.runs}))}"


def with_run(error: E, run_id: str) -> E:
    """The error, marked with the run it belongs to (TfdeployError.run_id)."""
    error.run_id = run_id
    return error
