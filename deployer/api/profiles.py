"""`tfdeploy profile`: one TensorFlow profile of every task of a running run, taken over the
same interval, brought home (docs/profile.md).

Every host of the run is asked at once; each traces its tasks into their own directories
(remote/profiling.py), starting START_IN seconds after it read the request, so the traces line
up across hosts without a filesystem they share (TensorFlow's remote trace wants its log
directory "accessible to both the client and server"). The traces then come home like a pull,
into `<to>/<run>/profile/<stamp>/<role>-<index>/`, the layout TensorBoard's profile plugin and
xprof read (`plugins/profile/<time>/<host>_<port>.xplane.pb` below each task's folder).
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deployer.api.actions import Say, discovered, newest_run
from deployer.core.errors import HostError, HostsFailed, UsageError
from deployer.hosts.fleet import DEFAULT_CONCURRENCY, Fleet
from deployer.results.pull import pull
from deployer.results.runs import resolve, survey_runs
from remote import protocol

# Seconds between a host reading the request and its traces' start: each trace's client imports
# TensorFlow first (3 s on an idle core, several times that beside a training job), and every
# host must have read the request by then. A trace that starts late says so (`started_after`).
START_IN = 15.0
# Traces whose starts lie further apart than this are said to be out of step.
IN_STEP_S = 1.0


@dataclass(frozen=True)
class TaskTrace:
    """One task's part of a profile: its trace's folder here, or why it has none."""

    task: str
    host: str
    serves: bool  # it has a profiler port: a TensorFlow task of a job with [job] profiler
    folder: Path | None  # <to>/<run>/profile/<stamp>/<role>-<index>; None: not traced
    why: str | None  # not traced: the host's words
    started_after: float | None  # seconds from the host's reading of the request to the start


@dataclass(frozen=True)
class Profiled:
    """What `profile` brought home: one folder for the capture, a trace per traced task."""

    run_id: str
    folder: Path  # <to>/<run>/profile/<stamp>
    seconds: float
    traces: tuple[TaskTrace, ...]
    failures: tuple[HostError, ...]  # hosts that could not be asked

    @property
    def traced(self) -> tuple[TaskTrace, ...]:
        return tuple(t for t in self.traces if t.folder is not None)

    @property
    def missed(self) -> tuple[TaskTrace, ...]:
        """Tasks that serve a profiler and were not traced (a task that serves none is no miss)."""
        return tuple(t for t in self.traces if t.serves and t.folder is None)

    @property
    def spread(self) -> float | None:
        """How far apart the traced tasks' starts lie, seconds (None: fewer than two known)."""
        starts = [t.started_after for t in self.traced if t.started_after is not None]
        return max(starts) - min(starts) if len(starts) > 1 else None

    def lines(self) -> list[str]:
        """What the CLI prints: each task that serves a profiler, the ones that serve none, then
        where the traces are and how to open them."""
        serving = [t for t in self.traces if t.serves]
        said = [
            f"{t.task} on {t.host}: traced for {self.seconds:g} s"
            if t.folder is not None
            else f"{t.task} on {t.host}: not traced: {t.why}"
            for t in serving
        ]
        others = [f"{t.task} on {t.host}" for t in self.traces if not t.serves]
        if others:
            said.append(
                f"no profiler in {', '.join(others)}: not TensorFlow tasks, or the job's "
                "profiler is off ([job] profiler = true)"
            )
        said += [f"{f.host}: not asked: {f.cause}" for f in self.failures]
        spread = self.spread
        if spread is not None and spread > IN_STEP_S:
            said.append(
                f"warning: the traces started up to {spread:.1f} s apart (a busy host imported "
                "TensorFlow late): compare their steps, not their clocks"
            )
        said.append(
            f"profile: {len(self.traced)} of {len(serving)} tasks with a profiler traced, in "
            f"{self.folder}/ (a folder per task)"
        )
        said.append(
            f"open it: tfdeploy tensorboard {self.run_id}, or tensorboard --logdir {self.folder} "
            "(the Profile tab; pip install 'tfdeploy-cluster[tensorboard]'), or xprof --logdir "
            f"{self.folder} --port 8791"
        )
        return said


class NothingTraced(UsageError):
    """No task of the run could be traced: each one's reason is in the message."""


def profile(
    run_id: str,
    *,
    inventory: str | None = None,
    seconds: float = 3.0,
    tasks: Sequence[str] | None = None,
    to: str | os.PathLike[str] = "tfdeploy-runs",
    concurrency: int = DEFAULT_CONCURRENCY,
    say: Say | None = None,
) -> Profiled:
    """Traces every TensorFlow task of the running run `run_id` (or `tasks`) for `seconds`,
    all over one interval, and brings the traces home into `to/<run>/profile/<stamp>/`.
    `run_id` an inventory file: its job's newest run on the hosts, said through `say`.

    Raises UsageError when no host has the run, NothingTraced when no task could be traced
    (each one's reason said), HostsFailed when no host of the run could be asked."""
    if not 0 < seconds <= protocol.MAX_PROFILE_SECONDS:
        raise UsageError(
            f"--seconds must be above 0 and at most {protocol.MAX_PROFILE_SECONDS:g}, "
            f"got {seconds:g}",
            hint="a few seconds of steady training is what a profile needs",
        )
    target = discovered(newest_run(resolve(run_id, inventory), "profile", say or _nothing))
    assert target.run_id is not None
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    folder = Path(to) / target.run_id / "profile" / stamp
    with Fleet(target.hosts, concurrency=concurrency) as fleet:
        survey = survey_runs(fleet, target)
        hosts = sorted({r.host for r in survey.runs})
        if not hosts:
            if survey.failures:
                raise HostsFailed(survey.failures, what="listing runs failed", outcome=None)
            raise UsageError(f"profile: {survey.nothing_found(target)}")
        replies, failures = fleet.each_settled(
            lambda m: m.agent.profile(
                target.run_id or "", stamp, seconds=seconds, start_in=START_IN, tasks=tasks
            ),
            [fleet.member(h) for h in hosts],
        )
        if not replies:
            raise HostsFailed(failures, what="profile failed", outcome=None)
        traced = {
            t["name"]: t["folder"]
            for shapes in replies.values()
            for t in shapes
            if t["traced"] and t["folder"]
        }
        if traced:
            _bring_home(fleet, target.run_id, traced, folder)
    traces = tuple(
        TaskTrace(
            task=t["name"],
            host=host,
            serves=t["serves"],
            folder=folder / _dirname(t["name"]) if t["traced"] else None,
            why=t["why"],
            started_after=t["started_after"],
        )
        for host, shapes in sorted(replies.items())
        for t in shapes
    )
    result = Profiled(target.run_id, folder, seconds, traces, tuple(failures))
    if not result.traced:
        raise NothingTraced(
            "profile: no task of run "
            f"{target.run_id} could be traced: "
            + "; ".join(f"{t.task} on {t.host}: {t.why}" for t in traces),
            hint="[job] profiler = true starts TensorFlow's profiler server in each TF task "
            "(docs/profile.md); a run started without it cannot be traced",
        )
    return result


def _bring_home(fleet: Fleet, run_id: str, traced: dict[str, str], folder: Path) -> None:
    """The traces pulled like `tfdeploy pull` (each task's trace folder named by its absolute
    path on its host: a task's relative paths are its code directory's), then laid out as one
    folder per task. A host's folder names are its words: a name that is not a plain absolute
    path is not pulled, and nothing is moved from outside the landing folder."""
    landing = folder.parent / f".{folder.name}.pulling"
    wanted = {task: remote for task, remote in traced.items() if _plain_absolute(remote)}
    if not wanted:
        return
    pull(fleet, run_id, [f"{f}/**" for f in wanted.values()], landing, tasks=list(wanted))
    top = landing.resolve()
    # A host's tasks share its files: one task's folder may list another's trace.
    pulled = sorted((landing / run_id).glob("*.abs"))
    for task, remote in wanted.items():
        for part in pulled:
            source = (part / remote.lstrip("/")).resolve()
            if source.is_dir() and source.is_relative_to(top):
                _merge(source, folder / _dirname(task))
    shutil.rmtree(landing, ignore_errors=True)


def _plain_absolute(path: str) -> bool:
    parts = Path(path).parts
    return path.startswith("/") and len(path) < 4096 and ".." not in parts and "." not in parts


def _merge(source: Path, into: Path) -> None:
    for file in sorted(source.rglob("*")):
        if file.is_file() and not file.is_symlink():
            dest = into / file.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            file.rename(dest)


def _dirname(task: str) -> str:
    """worker:1 -> worker-1, as `pull` names a task's folder."""
    return task.replace(":", "-")


def _nothing(_: str) -> None:
    pass
