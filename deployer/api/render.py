"""Static renderings for people and scripts: the plan as a rich table and as one JSON document."""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from deployer.config.plan import Plan, Task
from deployer.config.roles import role
from deployer.config.sources import SourceTable
from deployer.core.errors import HostError
from deployer.core.fold import counts_text, fold, more_line, tally_lines
from deployer.core.secrets import masked
from deployer.core.text import plural, task_order
from deployer.hosts.reply_types import TaskStatus
from deployer.watch.board import evaluation_failed, failed_evaluator
from deployer.watch.series import TaskProgress, TaskSeries
from remote import protocol

if TYPE_CHECKING:  # runs reaches the hosts (paramiko); rendering a plan must not load it
    from deployer.results.runs import HostRun
    from deployer.sources.costs import RunCost


def _gpu_text(task: Task, auto: bool = False) -> str:
    if auto and not task.gpus and role(task.role).implicit_gpus:
        return "auto"  # counted by nvidia-smi at preflight, then split as docs/inventory.md says
    return ",".join(str(g) for g in task.gpus) or "-"


def _auto_hosts(plan: Plan) -> set[str]:
    return {h.name for h in plan.inventory.hosts if h.gpus_auto}


def source_table(found: SourceTable) -> Table:
    """What a host source found (e.g. EC2 instances), as the source describes it."""
    table = Table(title=found.title)
    for column in found.columns:
        table.add_column(column, overflow="fold")
    for row in found.rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


COMPACT_CONFIGS = 16 * 1024  # bytes of TF_CONFIG text beyond which the cluster is shown once


def plan_table(plan: Plan) -> RenderableType:
    """One row per task, then the TF_CONFIG each task gets (secrets masked).

    A TF_CONFIG holds the whole cluster, so printing one per task grows with the square of the
    hosts (2,000 hosts: 75 MB). Beyond COMPACT_CONFIGS the cluster is shown once; `plan --json`
    always has every task's in full.
    """
    job = plan.job
    title = (
        f"job {job.name}: {plural(len(plan.tasks), 'task')} on {plural(len(plan.hosts), 'host')}"
    )
    table = Table(title=title)
    for column in ("task", "host", "address", "GPUs", "command"):
        table.add_column(column, overflow="fold")
    auto = _auto_hosts(plan)
    for task in plan.tasks:
        address = task.endpoint if task.port is not None else f"{task.address} (no TF port)"
        gpus = _gpu_text(task, task.host in auto)
        # Text, not str: addresses come from the inventory and rich would parse "[...]" as markup.
        table.add_row(task.name, task.host, Text(address), gpus, Text(task.command))
    parts: list[RenderableType] = [source_table(s) for s in plan.inventory.tables]
    return Group(*parts, table, *_gpu_masks(plan, auto), *_tf_configs(plan), *_rank_vars(plan))


def _gpu_masks(plan: Plan, auto: set[str]) -> list[RenderableType]:
    """Each task's CUDA_VISIBLE_DEVICES as `up` exports it (Task.env), shell-quoted so that the
    empty mask of a task without GPUs (TF sees none) reads as `""`. A task whose share of a
    `gpus = "auto"` host is split at preflight says so instead of a value it may not get."""
    lines = Text()
    for task in plan.tasks:
        lines.append(f"{task.name:<12}", style="bold")
        if _gpu_text(task, task.host in auto) == "auto":
            lines.append(' CUDA_VISIBLE_DEVICES: split at preflight (gpus = "auto")\n')
        else:
            mask = task.env["CUDA_VISIBLE_DEVICES"] or '""'
            lines.append(f" CUDA_VISIBLE_DEVICES={mask}\n")
    return [_heading("CUDA_VISIBLE_DEVICES per task"), lines]


def _rank_vars(plan: Plan) -> list[RenderableType]:
    """Outside TensorFlow, each rank's variables as its convention names them (frameworks.py)."""
    ranked = [t for t in plan.tasks if t.rank is not None]
    if not ranked:
        return []
    lines = Text()
    for task in ranked:
        lines.append(f"{task.name:<12}", style="bold")
        lines.append(" " + " ".join(f"{k}={v}" for k, v in task.cluster_env.items()) + "\n")
    return [_heading(f"{ranked[0].framework} variables per task"), lines]


def _tf_configs(plan: Plan) -> list[RenderableType]:
    cluster = json.dumps(plan.cluster)
    tasks = [t for t in plan.tasks if t.rank is None]
    if not tasks:
        return []
    sizes = itertools.accumulate(len(t.env["TF_CONFIG"]) for t in tasks)
    if all(total <= COMPACT_CONFIGS for total in sizes):  # stops at the first one beyond
        return [_heading("TF_CONFIG per task"), _config_lines(tasks)]
    unusual = [t for t in tasks if not _is_usual_config(t, cluster)]
    shared = Text()
    shared.append("every task", style="bold")
    shared.append(' TF_CONFIG={"cluster": CLUSTER, "task": {"type": ROLE, "index": INDEX}}')
    shared.append(" with ROLE:INDEX as in the task column (plan --json shows each in full)\n")
    shared.append("CLUSTER", style="bold")
    shared.append(f" {cluster}")
    parts: list[RenderableType] = [_heading("TF_CONFIG"), shared]
    if unusual:
        parts += [_heading("tasks with another TF_CONFIG"), _config_lines(unusual)]
    return parts


def _is_usual_config(task: Task, cluster: str) -> bool:
    """Whether the task's TF_CONFIG is exactly the cluster plus its own type and index."""
    config = task.env["TF_CONFIG"]
    head = '{"cluster": '
    tail = f', "task": {json.dumps({"type": task.role, "index": task.index})}}}'
    return (
        len(config) == len(head) + len(cluster) + len(tail)
        and config.startswith(head)
        and config.endswith(tail)
        and config.startswith(cluster, len(head))
    )


def _heading(text: str) -> Text:
    return Text(text, style="bold underline")


def _config_lines(tasks: Sequence[Task]) -> Text:
    configs = Text()
    for task in tasks:
        configs.append(f"{task.name:<12}", style="bold")
        configs.append(f" TF_CONFIG={task.env['TF_CONFIG']}\n")
    return configs


def plan_document(plan: Plan) -> dict[str, Any]:
    job = plan.job
    secret = job.secret_env
    auto = _auto_hosts(plan)
    return {
        "job": {
            "name": job.name,
            "code": str(job.code),
            "command": job.command,
            "python": job.python,
            "workdir": job.workdir,
            "port": job.port,
            "setup": list(job.setup),
            "env": masked(job.env, secret),
            "cluster": plan.cluster,
        },
        "tasks": [
            {
                "role": t.role,
                "index": t.index,
                "host": t.host,
                "address": t.address,
                "port": t.port,
                "gpus": list(t.gpus),
                "command": t.command,
                "env": masked(t.env, secret),
                # gpus = "auto": the GPUs are counted by nvidia-smi at preflight
                **({"gpus_auto": True} if t.host in auto else {}),
            }
            for t in plan.tasks
        ],
        **_sources_document(plan),
    }


def _sources_document(plan: Plan) -> dict[str, Any]:
    return {s.json_key: list(s.documents) for s in plan.inventory.tables}


def status_table(
    runs: Sequence[HostRun],
    height: int | None = None,
    *,
    brief_ended: bool = False,
    costs: Mapping[str, RunCost] | None = None,
) -> RenderableType:
    """One heading and one table per run, newest first, readable at 80 columns.

    The run id (30+ characters) is the heading, not a column, and a task's outcome shares the
    state column in short words, so numbers (pid, start time, restarts) never have to wrap;
    `restarts` is left out while no task of the run was restarted. Tasks are in role and index
    order (worker:2 before worker:10), whatever order the hosts answered in.

    With a `height` (a terminal's lines), runs whose tasks do not fit it are folded: counts per
    role and state, the tasks worth a look (failed, frozen, restarted, then running), and one
    line for the rest (`status --all` and `--json` have every task).

    With `brief_ended`, a run with no task left running is one line (its outcome counted): the
    hosts keep every run, and a table for each old run buries the one that is running.

    `costs` (run id -> what its EC2 instances cost): a line under the run's heading, and
    after an ended run's counts.
    """
    costs = costs or {}
    by_run: dict[str, list[HostRun]] = {}
    for r in runs:
        by_run.setdefault(r.run_id, []).append(r)
    ended = [k for k, v in by_run.items() if brief_ended and not any(r.active for r in v)]
    listed = ended if height is None else ended[: max(3, height // 4)]
    chrome = len(listed) + (len(listed) < len(ended)) + bool(ended)
    at_most = None if height is None else status_rows(height - chrome, len(by_run) - len(ended))
    parts: list[RenderableType] = []
    for run_id, host_runs in by_run.items():
        if run_id not in ended:
            cost = costs.get(run_id)
            parts += [
                _run_heading(run_id, host_runs),
                *([Text(f"  {cost.line()}")] if cost else []),
                *_recovery_lines(host_runs),
                *_run_tasks(host_runs, at_most),
                Text(""),
            ]
    parts += [_ended_line(run_id, by_run[run_id], costs.get(run_id)) for run_id in listed]
    if len(listed) < len(ended):
        parts.append(Text(f"… {plural(len(ended) - len(listed), 'older ended run')}"))
    if ended:
        parts.append(Text("`status RUN_ID` or `status --all` lists an ended run's tasks", "dim"))
    elif parts:
        parts.pop()  # the gap after the last table
    return Group(*parts)


SHOWN_RECOVERIES = 3  # a run's newest restarts under its heading (`status --json` has them all)


def _recovery_lines(host_runs: list[HostRun]) -> list[Text]:
    """The keeper's restarts, newest last: why each began, and when the run ran and trained
    again after the failure was seen."""
    found = [x for r in host_runs for x in r.recoveries]
    lines = [Text(f"  {x.line()}", "yellow") for x in found[-SHOWN_RECOVERIES:]]
    restarts = max(sum(r.restarts for r in host_runs), len(found))
    if restarts > SHOWN_RECOVERIES:
        earlier = plural(restarts - SHOWN_RECOVERIES, "earlier restart")
        lines.insert(0, Text(f"  … {earlier} (status --json has them)", "dim"))
    return lines


def _ended_line(run_id: str, host_runs: list[HostRun], cost: RunCost | None = None) -> Text:
    """`run ID: ended, counts`, one line at 80 columns: the id already says job and date."""
    line = Text()
    line.append(f"run {run_id}", style="bold")
    counts = Counter(_kind(t) for r in host_runs for t in r.tasks)
    line.append(f": ended, {counts_text(counts)}")
    restarts = sum(r.restarts for r in host_runs)
    if restarts:
        line.append(f", {plural(restarts, 'restart')} by its keeper")
    if cost is not None:
        line.append(f", {cost.line() if cost.usd is None else 'cost ' + cost.cell()}")
    _note_failed_evaluators(line, host_runs)
    _note_guard_stop(line, host_runs)
    return line


RUN_CHROME = 8  # lines of a folded run besides its task rows: heading, tally, table, more, gap
PROMPT_LINES = 2  # the command typed and the prompt after it stay on the screen too


def status_rows(height: int, runs: int) -> int:
    """Task rows each run may show so that every run fits `height` lines (3 at least)."""
    return max(3, (height - PROMPT_LINES) // max(runs, 1) - RUN_CHROME)


def _run_tasks(host_runs: list[HostRun], at_most: int | None) -> list[RenderableType]:
    rows = sorted(((r.host, t) for r in host_runs for t in r.tasks), key=_row_order)
    gpu = {(r.host, u.task): u.text() for r in host_runs for u in r.gpu_use}
    if at_most is None or len(rows) <= at_most + 2:  # the 2 lines that folding adds
        return [RunTasks(rows, gpu)]
    folded = fold(rows, at_most, _status_interest, lambda row: _kind(row[1]))
    tally = tally_lines((t.name.partition(":")[0], _kind(t)) for _, t in rows)
    more = f"{more_line(folded)} (`status --all` lists every task)"
    return [Text("\n".join(tally)), RunTasks(folded.shown, gpu), Text(more, style="dim")]


def _row_order(row: tuple[str, TaskStatus]) -> tuple[tuple[str, int], str]:
    return task_order(row[1].name), row[0]


def _kind(task: TaskStatus) -> str:
    """The state as counted: the table's words, with no comma (they are listed with commas)."""
    return "frozen" if task.frozen and not task.finished else _state_text(task)


def _status_interest(row: tuple[str, TaskStatus]) -> int:
    """Smallest first: failed or frozen, restarted, not finished, finished well."""
    task = row[1]
    if evaluation_failed(task) or task.frozen:
        return 0
    if task.restarts:
        return 1
    return 2 if not task.finished else 3


def _run_heading(run_id: str, host_runs: list[HostRun]) -> Text:
    heading = Text()
    heading.append(f"run {run_id}", style="bold")
    created = min((r.created for r in host_runs if r.created), default=0)
    facts = [f"job {host_runs[0].job}"] if host_runs[0].job else []
    if created:
        facts.append("created " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created)))
    if any(r.detached for r in host_runs):
        facts.append("detached")
    if any(r.kept for r in host_runs):  # who holds its policy now (docs/up.md, "A kept run")
        facts.append("kept by its keeper")
    elif any(r.leased for r in host_runs) and any(
        not t.finished for r in host_runs for t in r.tasks
    ):
        facts.append("watched by its `up`")
    starting = sorted(r.host for r in host_runs if r.starting)
    if starting:  # no task yet: its `up` is pushing, installing or setting it up there
        facts.append(f"starting on {', '.join(starting)}: its `up` is preparing it")
    if facts:
        heading.append(f" ({', '.join(facts)})")
    _note_failed_evaluators(heading, host_runs)
    _note_guard_stop(heading, host_runs)
    return heading


def _note_guard_stop(line: Text, host_runs: list[HostRun]) -> None:
    """Its keeper's guard stopped the run (max_cost, gpu_idle_stop): say why, where its tasks'
    `stopped` alone would read as a `down`."""
    why = next((r.guard_stop for r in host_runs if r.guard_stop), None)
    if why:
        line.append(f"; stopped by its keeper: {why}", style="bold yellow")


def _note_failed_evaluators(line: Text, host_runs: list[HostRun]) -> None:
    """The job may have succeeded without the evaluation it was asked for: say so in red."""
    failed = [f"{t.name} {_state_text(t)}" for r in host_runs for t in _failed_evaluators(r)]
    if failed:
        line.append(f"; evaluator failed: {'; '.join(failed)}", style="bold red")


def _failed_evaluators(host_run: HostRun) -> list[TaskStatus]:
    return [t for t in host_run.tasks if failed_evaluator(t)]


STATUS_METRICS = ("step", "steps/s", "ETA", "loss", "CPU", "RSS")


class RunTasks:
    """The tasks of one run as a table that fits the width it is given: columns are dropped
    (start time first) before any number would have to wrap; host and state text may wrap.
    The GPU column (a running task's utilization and memory) is there while a task has one."""

    # dropped, in this order, while the table does not fit
    OPTIONAL = ("started", "RSS", "ETA", "loss", "CPU", "steps/s")

    def __init__(
        self, rows: list[tuple[str, TaskStatus]], gpu: Mapping[tuple[str, str], str] | None = None
    ) -> None:
        self.rows = rows  # (host, task)
        self.gpu = gpu or {}  # (host, task name) -> "40% 500 MiB"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        gpu = self.gpu
        cells = [
            self._cells(host, t) | {"GPU": gpu.get((host, t.name), "")} for host, t in self.rows
        ]
        shown = [
            c
            for c in self.COLUMNS
            if (c != "restarts" or any(t.restarts for _, t in self.rows))
            and (c != "GPU" or any(row["GPU"] for row in cells))
            and (c not in STATUS_METRICS or any(row[c] != "-" for row in cells))
        ]
        for column in self.OPTIONAL:
            if self._width(shown, cells) <= options.max_width:
                break
            if column in shown:
                shown.remove(column)
        yield self._table(shown, cells)

    COLUMNS = ("task", "host", "pid", "state", "GPU", *STATUS_METRICS, "started", "restarts")

    @staticmethod
    def _cells(host: str, t: TaskStatus) -> dict[str, str]:
        started = time.strftime("%H:%M:%S", time.localtime(t.started)) if t.started else "-"
        p = task_progress(t) or TaskProgress()
        return {
            "step": p.step_text(),
            "steps/s": p.rate_text(),
            "ETA": p.eta_text(),
            "loss": p.loss_text(),
            "CPU": p.cpu_text(),
            "RSS": p.rss_text(),
            "task": t.name,
            "host": host,
            "pid": str(t.pid or "-"),
            "state": _state_text(t),
            "started": started,
            "restarts": str(t.restarts),
        }

    @staticmethod
    def _width(shown: list[str], cells: list[dict[str, str]]) -> int:
        """The table's natural width: each column's widest cell, one space either side, and a
        border between and around them. Counted from the strings (the cells are plain text):
        rich's own measuring pass cost as much as drawing the table, per row."""
        widest = [max([cell_len(name)] + [cell_len(row[name]) for row in cells]) for name in shown]
        return sum(widest) + 3 * len(shown) + 1

    @staticmethod
    def _table(shown: list[str], cells: list[dict[str, str]]) -> Table:
        table = Table()
        for name in shown:
            number = name in ("pid", "restarts", *STATUS_METRICS)
            wraps = name in ("host", "state")
            table.add_column(
                name, no_wrap=not wraps, overflow="fold", justify="right" if number else "left"
            )
        for row in cells:
            table.add_row(*(Text(row[name]) if name == "host" else row[name] for name in shown))
        return table


def _state_text(task: TaskStatus) -> str:
    """Short words for the table: running, exited 0, killed (signal 9), stopped, lost; and
    the host's file system that was full when it ended."""
    ended = _ended_text(task)
    return f"{ended}, disk full ({task.disk_full})" if task.disk_full is not None else ended


def _ended_text(task: TaskStatus) -> str:
    if not task.finished:
        return f"{task.state}, frozen (SIGSTOP)" if task.frozen else task.state
    if task.state == protocol.STATE_LOST:
        return "lost (supervisor gone)"
    if task.reason == protocol.REASON_STOPPED:
        return "stopped by tfdeploy"
    if task.time_limited:
        return "preempted (its allocation's time limit)"
    if task.preempted:
        return "preempted (spot interruption)"
    if task.reason == protocol.REASON_LEASE_EXPIRED:
        return task.reason
    if task.signal is not None:
        return f"killed (signal {task.signal})"
    code = task.exit_code
    if code is not None and 128 < code <= 128 + 64:
        return f"exited {code} (signal {code - 128}?)"
    return f"exited {code}"


def status_json(
    runs: Sequence[HostRun],
    unreachable: Sequence[HostError] = (),
    costs: Mapping[str, RunCost] | None = None,
) -> str:
    """One document for scripts: the runs the hosts reported, and the hosts that could not be
    asked (`unreachable`: host and why), so one dead host does not hide the others' answers;
    `costs`: what each run's EC2 instances cost, by run id (a run has one, its hosts many)."""
    return json.dumps(
        {
            "runs": [
                {
                    "run_id": r.run_id,
                    "host": r.host,
                    "job": r.job,
                    "created": r.created,
                    "detached": r.detached,
                    # no task yet on this host: its `up` is preparing it (push, setup, start)
                    "starting": r.starting,
                    # its keeper lives on this host / an `up` holds its lease there
                    "kept": r.kept,
                    "leased": r.leased,
                    # the keeper's restarts, on its host: how many in all, and the newest 20
                    # of them: attempt, cause, task (restarted alone), backoff,
                    # started_after_s and stepping_after_s (failure seen -> running again /
                    # first new step record)
                    "restarts": r.restarts,
                    "recoveries": [dataclasses.asdict(x) for x in r.recoveries],
                    # on the keeper's host, once its guard stopped the run: why; else null
                    "guard_stop": r.guard_stop,
                    # evaluators of this host that ended by themselves without success
                    "failed_evaluators": [t.name for t in _failed_evaluators(r)],
                    # a running task's GPU use: {gpus, memory_mib, utilization}, else null
                    # its step, steps/s, ETA, loss (TFDEPLOY_METRICS), CPU and RSS, else null
                    "tasks": [
                        _task_json(t) | {"gpu": _gpu_json(r, t), "progress": _progress_json(t)}
                        for t in r.tasks
                    ],
                }
                for r in runs
            ],
            "unreachable": [{"host": f.host, "error": f.cause} for f in unreachable],
            # per run id: usd (null: unknown, and why), running (so far), each group's
            # instances with their price source (deployer/sources/costs.py RunCost.to_json)
            "costs": {run_id: cost.to_json() for run_id, cost in (costs or {}).items()},
        },
        indent=2,
    )


def _task_json(task: TaskStatus) -> dict[str, object]:
    return {k: v for k, v in task.__dict__.items() if k not in ("usage", "last")}


def task_progress(task: TaskStatus) -> TaskProgress | None:
    """What the hosts say of a task's progress: its last metrics records and its resources."""
    if not task.last and task.usage is None:
        return None
    series = TaskSeries()
    series.add_records(task.last, task.ended or time.time())
    if task.usage is not None:
        series.add_sample(time.time(), cpu=task.usage.cpu, rss=float(task.usage.rss))
    found = series.progress()
    return found if task.state == protocol.STATE_RUNNING else replace(found, eta_s=None)


def _progress_json(task: TaskStatus) -> dict[str, object] | None:
    found = task_progress(task)
    if found is None:
        return None
    return found.to_json() | {"last": dict(task.last[-1]) if task.last else None}


def _gpu_json(run: HostRun, task: TaskStatus) -> dict[str, object] | None:
    use = next((u for u in run.gpu_use if u.task == task.name), None)
    return None if use is None else {k: v for k, v in use.__dict__.items() if k != "task"}
