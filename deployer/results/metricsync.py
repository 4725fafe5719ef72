"""What this machine keeps of a run once it learns the run's end: the metrics its tasks wrote
that it has not read yet (a detached run's, all of them since `up` detached), and how the run
ended; both beside the run's archive (runstore.py), so `runs` and `report` have them once
the hosts are gone.

Every verb that learns a run's end records it, so the history never says `running` of a run
that ended: `down` (what it stopped, and the runs it found ended), `status` and `runs -i` (a run
whose every task has finished), `logs -f` (a run it followed to its end), `logs --sync`, `pull`
and `Run.wait`. Each asks the hosts only while this machine has no end recorded for the run:
once recorded, a run costs no poll again.

Where each task's metrics file was read up to is kept in the run's offsets (by `up` at its
end, and here), so nothing is read or stored twice. The local records are the run store's
(runstore.py), read defensively: a damaged one (not JSON, not an object, a non-number offset)
counts as absent and is rewritten; it never stops the verb that reads it (`down` stops its
tasks whatever the records hold).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from deployer.core.errors import HostError, TfdeployError
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.reply_types import TaskStatus
from deployer.results import runstore
from deployer.results.archive import LogArchive
from deployer.results.runs import HostRun, Target, survey_runs
from deployer.results.runstore import Outcome, RunFolder
from remote import protocol

MAX_ROUNDS = 64  # polls per host and run: 64 x 64 kB of metric lines at most
ENDED = ("succeeded", "failed", "stopped")  # an outcome no later verb changes


def keep_runs(fleet: Fleet, runs: Sequence[HostRun]) -> None:
    """For each run (as each host reports it): its unread metric lines into the local store,
    and its outcome (as the hosts report it now), unless an end is recorded already. A run
    one of whose hosts could not be polled keeps its metrics but no outcome: that host's tasks
    are not known to have ended. A run's hosts are polled at once, and its offsets read and
    written once (per host, `down` of 128 hosts read and rewrote a record of 128 tasks 128
    times, one host after the other)."""
    shares: dict[str, list[HostRun]] = {}
    for run in runs:
        shares.setdefault(run.run_id, []).append(run)
    for run_id, of_run in shares.items():
        tasks = _keep_run(fleet, run_id, of_run)
        if tasks is None or recorded_end(run_id) is not None:
            continue
        recoveries = [x.line() for r in of_run for x in r.recoveries]  # the keeper's host's
        restarts = sum(r.restarts for r in of_run)
        ended = outcome(tasks, recoveries, restarts)
        guarded = next((r.guard_stop for r in of_run if r.guard_stop), None)
        if guarded and ended["outcome"] == "stopped":  # by its keeper's guard, not `down`
            ended["why"] = guarded
        with contextlib.suppress(OSError):  # a full disk: the history is a convenience
            runstore.write_outcome(run_id, ended)


def _keep_run(fleet: Fleet, run_id: str, shares: Sequence[HostRun]) -> list[TaskStatus] | None:
    """One run's unread metric lines from each of its hosts (`shares`) into the local store;
    the tasks as the hosts report them now, or None when a host could not be polled."""
    offsets = runstore.read_offsets(run_id)
    try:
        archive = LogArchive(run_id)
    except (OSError, ValueError):
        return None
    by_host = {r.host: r for r in shares}

    def fetch(member: Member) -> tuple[list[TaskStatus], dict[str, int]]:
        return _fetch(member, by_host[member.name], offsets, archive)

    members = [fleet.member(name) for name in by_host]
    try:
        done, failures = fleet.each_settled(fetch, members)
    except (TfdeployError, OSError, ValueError):  # this disk, a store's refusal
        return None
    asked = {name: at for _, moved in done.values() for name, at in moved.items()}
    with contextlib.suppress(OSError):
        runstore.write_offsets(run_id, {**offsets, **asked})
    if failures or len(done) < len(members):
        return None
    return [t for tasks, _ in done.values() for t in tasks]


def keep_ended(fleet: Fleet, runs: Sequence[HostRun], failures: Sequence[HostError]) -> list[str]:
    """The runs among `runs` (a survey's: each host's share) that have ended on every host of
    theirs, that this machine knows (its record or archive) and whose end it has not recorded:
    their unread metrics and outcome kept (keep_runs). A run with a host that could not be
    asked (`failures`) is left as it is. Returns the run ids kept."""
    failed = {f.host for f in failures}
    shares: dict[str, list[HostRun]] = {}
    for run in runs:
        shares.setdefault(run.run_id, []).append(run)
    ended = [
        run_id
        for run_id, of_run in shares.items()
        if not any(r.active for r in of_run)
        and not failed & _hosts_of(of_run)
        and _known_here(run_id)
        and recorded_end(run_id) is None
    ]
    keep_runs(fleet, [r for run_id in ended for r in shares[run_id]])
    return ended


def keep_if_ended(fleet: Fleet, target: Target) -> None:
    """`keep_ended` for the target's run, asking its hosts only while no end is recorded here
    (`logs -f` and `pull` have no survey of their own)."""
    if target.run_id is None or recorded_end(target.run_id) is not None:
        return
    if not _known_here(target.run_id):
        return
    survey = survey_runs(fleet, target)
    keep_ended(fleet, survey.runs, survey.failures)


def kept_outcome(run_id: str) -> dict[str, object]:
    """The run's outcome record as this machine keeps it; {} when it has none or it is
    damaged."""
    return runstore.read_outcome(run_id).fields


def recorded_end(run_id: str) -> str | None:
    """The outcome this machine recorded for the run, when it is an end (ENDED); None for none,
    `running` (a detached `up` leaves that), or a damaged record."""
    said = kept_outcome(run_id).get("outcome")
    return said if isinstance(said, str) and said in ENDED else None


def _lead(tasks: Sequence[TaskStatus]) -> list[TaskStatus]:
    """The tasks whose end is the job's, as TensorFlow has it: the chief where there is one
    (PSS: its workers may be plain servers that tfdeploy stops once it is done), else the
    workers (MWMS). What else tfdeploy stopped at the end (ps, evaluators) is no failure."""
    chief = [t for t in tasks if t.name.split(":", 1)[0] == "chief"]
    return chief or [t for t in tasks if t.name.split(":", 1)[0] == "worker"]


def _hosts_of(shares: Sequence[HostRun]) -> set[str]:
    """Every host a run has: the hosts that reported a share, and the run's own newest list
    (each share carries that list: read once, not once per share, at 128 hosts)."""
    newest = max(shares, key=lambda r: r.hosts_at)
    return {r.host for r in shares} | {name for name, _ in newest.hosts}


def _known_here(run_id: str) -> bool:
    """Whether this machine started or kept the run (its record, or a folder beside it): the
    history is of this machine's runs; another machine's runs found on the hosts are theirs."""
    folder = RunFolder.of(run_id)
    return folder.record.is_file() or folder.path.is_dir()


def _fetch(
    member: Member, run: HostRun, offsets: dict[str, int], archive: LogArchive
) -> tuple[list[TaskStatus], dict[str, int]]:
    """One host's share of a run: its tasks now, and where each task's metrics were read to
    (its unread lines written to `archive`, at most MAX_ROUNDS polls)."""
    asked = {t.name: offsets.get(t.name, 0) for t in run.tasks}
    tasks: list[TaskStatus] = []
    for _ in range(MAX_ROUNDS):
        poll = member.agent.poll(run.run_id, {}, max_bytes=0, heartbeat=False, metrics=asked)
        tasks = list(poll.tasks)
        moved = False
        for name, (offset, records) in poll.metrics.items():
            moved = moved or offset > asked.get(name, 0)
            asked[name] = offset
            archive.write_metrics(name, records)  # none read: the lines dropped still count
        if not moved:
            break
    return tasks, asked


def outcome(
    tasks: Sequence[TaskStatus], recoveries: Sequence[str] = (), restarts: int = 0
) -> Outcome:
    """succeeded (every task exited 0 by itself, or every awaited one did and tfdeploy
    stopped the rest: ps servers, a kept run's evaluators), failed (the first task that did
    not, named), or stopped (by tfdeploy, `down`); `recoveries`: the keeper's newest restarts,
    each in words (results/runs.py Recovery.line), and `restarts` how many it made in all."""
    exits = {t.name: t.outcome() for t in tasks if t.finished}
    count = max(restarts, len(recoveries))
    ended = _verdict(tasks)
    ended["exits"] = exits
    if count:
        ended["restarts"], ended["recoveries"] = count, list(recoveries)
    return ended


def _verdict(tasks: Sequence[TaskStatus]) -> Outcome:
    own = [t for t in tasks if t.reason != protocol.REASON_STOPPED]
    failed = sorted((t for t in own if t.finished and not t.succeeded), key=lambda t: t.ended or 0)
    ended = max((t.ended or 0.0 for t in tasks), default=0.0) or time.time()
    if failed:
        return {
            "outcome": "failed",
            "why": f"{failed[0].name} {failed[0].outcome()}",
            "ended": ended,
        }
    awaited = _lead(tasks)
    stopped_rest = all(t in own or t not in awaited for t in tasks)
    if own and awaited and stopped_rest and all(t.succeeded for t in awaited):
        return {"outcome": "succeeded", "ended": ended}
    return {"outcome": "stopped", "why": "by tfdeploy down", "ended": ended}
