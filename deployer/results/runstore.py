"""The run store: a run's local folder on this machine, `<state>/runs/<run-id>/`, and the
files beside it. Every file of it is named here, once (RunFolder), and every reader and writer
of the run's records asks here: `up` (its facts, journal and outcome), `down`, `status` and
`logs` (the outcome and metric offsets they keep, results/metricsync.py), `up --resume` (the
resumes, the offsets), `runs` and `report` (all of it).

What the folder holds:

- `facts.json` (Facts): the run as `up` planned it, written when `up` ends (and kept by a
  resume); `outcome.json` (Outcome): how it ended, written by `up`, or by the first verb that
  learns the end of a detached run; `metric_offsets.json`: where each task's metrics file was
  read up to, so nothing is read or stored twice.
- `cost.json`: what the run's machines cost (deployer/sources/costs.py RunCost), kept once
  the figure is final (the run ended, every price had): the prices and the instances' ends it
  came from are not all to be had later.
- `journal.jsonl` (JournalEntry), `metrics/<role>-<i>.jsonl`, `usage/<role>-<i>.jsonl`: series,
  bounded and sampled as results/metricstore.py keeps a series (each with its
  `.history.jsonl` and `.index.json`); the metrics record's shape is the reply edge's
  (deployer/hosts/replies.py metric_fields), shared with the task-side writer.
- `<role>-<i>.log` and `archive.json`: the log archive (results/archive.py writes them; its
  rotation, `.log.1`, is its own format), and `report.html`, where `report` puts its page.
- Beside the folder: `<run-id>.json`, the run's record (results/state.py RunRecord), and
  `<run-id>.artifacts`, the marker that the run's job.artifacts came home.

Why a module of its own, not metricstore grown: metricstore is one concept, how a series is
kept (its two files and index, their bounds, an even sample read back); this is another, which
files a run has and what each holds. Together they would be near 800 lines.

**Untrusted input**: the files are this machine's, but a full disk cuts one, a person or a
script edits one. Every document is read by metricstore.read_bounded (at most DOCUMENT_BYTES,
nested at most boundedjson.DEPTH deep); one that is missing, damaged or hostile reads as a
Document with no object (`damaged` says which), never as an error. What is written has the
shapes below (Facts, Outcome, JournalEntry); what is read back is an untrusted mapping that
each reader takes field by field (reportpage.sane_facts, runlist.summary).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from deployer.core.secrets import Masker
from deployer.core.statedir import state_dir
from deployer.results import metricstore
from deployer.results.metricstore import Series

RUNS = "runs"  # under the state directory: the records, and a folder per run
FACTS = "facts.json"
OUTCOME = "outcome.json"
OFFSETS = "metric_offsets.json"
ARCHIVE_INDEX = "archive.json"
REPORT = "report.html"
COST = "cost.json"
DOCUMENT_BYTES = 32 * 1024 * 1024  # a document at most (128 hosts' facts: ~200 kB)

METRICS = metricstore.Kind("metrics", metricstore.metric_record)
USAGE = metricstore.Kind("usage", metricstore.usage_sample)
JOURNAL = metricstore.Kind("", metricstore.journal_entry)  # in the run's folder itself
JOURNAL_SERIES = "journal"  # journal.jsonl


@dataclass(frozen=True)
class RunFolder:
    """Where each file of one run is on this machine."""

    run_id: str
    runs: Path  # <state>/runs

    @classmethod
    def of(cls, run_id: str) -> RunFolder:
        return cls(run_id, runs_root())

    @property
    def path(self) -> Path:
        return self.runs / self.run_id

    @property
    def record(self) -> Path:
        return self.runs / f"{self.run_id}.json"

    @property
    def artifacts_marker(self) -> Path:
        return self.runs / f"{self.run_id}.artifacts"

    @property
    def facts(self) -> Path:
        return self.path / FACTS

    @property
    def outcome(self) -> Path:
        return self.path / OUTCOME

    @property
    def offsets(self) -> Path:
        return self.path / OFFSETS

    @property
    def archive_index(self) -> Path:
        return self.path / ARCHIVE_INDEX

    @property
    def report(self) -> Path:
        return self.path / REPORT

    @property
    def cost(self) -> Path:
        return self.path / COST


def runs_root() -> Path:
    return state_dir() / RUNS


def run_dir(run_id: str) -> Path:
    return RunFolder.of(run_id).path


def log_name(task: str) -> str:
    """`worker-0.log` of `worker:0` (the caller checked that `task` is a task's name)."""
    return task.replace(":", "-") + ".log"


def listed_runs() -> tuple[set[str], set[str]]:
    """The names this machine keeps runs under: the runs with a record, those with a folder
    (unchecked: a name may be no run id); none when the state directory cannot be read."""
    try:
        entries = list(runs_root().iterdir())
    except OSError:
        return set(), set()
    records = {p.stem for p in entries if p.suffix == ".json"}
    folders = {p.name for p in entries if p.is_dir()}
    return records, folders


# The run's documents.


class Facts(TypedDict, total=False):
    """facts.json as `up` writes it (deployer/up/records.py run_facts)."""

    run_id: str
    job: str
    inventory: str
    began: float
    command: str
    image: str | None
    requirements: list[str]
    hosts: list[dict[str, str]]
    tasks: list[dict[str, Any]]  # name, host, command, gpus, tf_config, cluster_env, env
    resumed: list[dict[str, float]]  # each `up --resume`: at, attempt
    exits: dict[str, str | None]
    started_at: dict[str, float | None]
    ended_at: dict[str, float | None]
    # what the host sources found, as `plan --json` lists it ("instances": EC2's): a run's cost
    machines: dict[str, list[dict[str, Any]]]


class Outcome(TypedDict, total=False):
    """outcome.json: how the run ended (results/metricsync.py outcome), or `running`."""

    outcome: str  # succeeded, failed, stopped, running
    why: str
    ended: float
    exits: dict[str, str]
    restarts: int
    recoveries: list[str]


class JournalEntry(TypedDict):
    """A line of journal.jsonl: what `up` said, and when."""

    t: float
    kind: str  # step, phase
    text: str


@dataclass(frozen=True)
class Document:
    """A document of the run as read: the JSON object its file holds (None: there is no file,
    or it holds none: cut short, nested too deep, edited)."""

    found: dict[str, Any] | None
    path: Path

    @property
    def fields(self) -> dict[str, Any]:
        """The object, or {} (a reader takes each field defensively either way)."""
        return self.found or {}

    @property
    def exists(self) -> bool:
        """Whether the file is there (asked when a reader needs to tell damage from none)."""
        return self.path.exists()

    @property
    def damaged(self) -> bool:
        return self.found is None and self.exists


def _read(path: Path) -> Document:
    data = metricstore.read_bounded(path, DOCUMENT_BYTES)
    return Document(data if isinstance(data, dict) else None, path)


def read_facts(run_id: str) -> Document:
    return _read(RunFolder.of(run_id).facts)


def read_outcome(run_id: str) -> Document:
    return _read(RunFolder.of(run_id).outcome)


def read_record(run_id: str) -> Document:
    """The run's record as a plain document, for readers that take what they can of it
    (`runs`, `prune --local`); results/state.py `load` is the strict reader."""
    return _read(RunFolder.of(run_id).record)


def read_cost(run_id: str) -> Document:
    return _read(RunFolder.of(run_id).cost)


def write_cost(run_id: str, cost: Mapping[str, object]) -> None:
    _write(RunFolder.of(run_id).cost, dict(cost))


def read_archive_index(run_id: str) -> dict[str, Any]:
    return _read(RunFolder.of(run_id).archive_index).fields


def read_offsets(run_id: str) -> dict[str, int]:
    """Where each task's metrics were read up to; a damaged entry is left out, so that task
    is read again from 0 (the store may then hold some records twice, never a wrong one)."""
    return {
        str(name): at
        for name, at in _read(RunFolder.of(run_id).offsets).fields.items()
        if isinstance(at, int) and not isinstance(at, bool) and at >= 0
    }


def resumes(run_id: str) -> list[dict[str, Any]]:
    """The resumes the run's facts record (each an object; anything else is left out)."""
    said = read_facts(run_id).fields.get("resumed")
    return [r for r in said if isinstance(r, dict)] if isinstance(said, list) else []


def write_facts(run_id: str, facts: Facts, hide: Masker | None = None) -> None:
    """The run's facts, every text of them passed through `hide` (the run's secrets masked)."""
    _write(RunFolder.of(run_id).facts, (hide or Masker()).record(facts))


def write_outcome(run_id: str, outcome: Mapping[str, object], hide: Masker | None = None) -> None:
    """How the run ended (an Outcome: `up` adds to what it knows, so any mapping of one)."""
    _write(RunFolder.of(run_id).outcome, (hide or Masker()).record(outcome))


def write_offsets(run_id: str, offsets: Mapping[str, int], hide: Masker | None = None) -> None:
    _write(RunFolder.of(run_id).offsets, (hide or Masker()).record(dict(offsets)))


def _write(path: Path, data: object) -> None:
    """The document written beside its file and moved over it (a reader sees the old or the
    new one), private: facts name hosts and environments."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


# The run's series.


def append_metrics(
    run_id: str, task: str, records: Iterable[Mapping[str, Any]], dropped: int = 0
) -> None:
    metricstore.append(run_dir(run_id), METRICS, task, records, dropped)


def append_usage(run_id: str, task: str, samples: Iterable[Mapping[str, Any]]) -> None:
    metricstore.append(run_dir(run_id), USAGE, task, samples)


def append_journal(run_id: str, entries: Iterable[JournalEntry]) -> None:
    metricstore.append(run_dir(run_id), JOURNAL, JOURNAL_SERIES, entries)


def metrics(run_id: str, points: int = metricstore.POINTS) -> dict[str, Series]:
    """Every task's metrics, by task name, at most `points` records each."""
    return metricstore.read(run_dir(run_id), METRICS, points)


def usage(run_id: str, points: int = metricstore.POINTS) -> dict[str, Series]:
    return metricstore.read(run_dir(run_id), USAGE, points)


def journal(run_id: str, points: int = metricstore.POINTS) -> Series:
    """The run's journal (up's steps and phases), at most `points` entries."""
    return metricstore.series(run_dir(run_id), JOURNAL, JOURNAL_SERIES, points)


def each_metric(run_id: str, task: str) -> Iterator[dict[str, Any]]:
    """Every good metrics record of the task, one at a time (metricstore.each)."""
    return metricstore.each(run_dir(run_id), METRICS, task)


def each_sample(run_id: str, task: str) -> Iterator[dict[str, Any]]:
    return metricstore.each(run_dir(run_id), USAGE, task)


def last_metrics(run_id: str) -> list[Series]:
    """Each task's last metrics record (in task name order), read from the end of its files."""
    directory = run_dir(run_id)
    return [metricstore.last(directory, METRICS, t) for t in metricstore.tasks(directory, METRICS)]


def metrics_dropped(run_id: str) -> int:
    """The lines of every task's metrics file that the edge dropped."""
    return metricstore.dropped(run_dir(run_id), METRICS)
