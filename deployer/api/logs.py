"""A run's logs, from this machine's archive or from the hosts: the one rule that decides which,
for `tfdeploy logs`, `Run.logs` and `Run.follow` alike.

The rule: once `up` saw the run end, the archive holds all of it and is read (its hosts may be
gone); a damaged archive sends the read to the hosts; hosts that cannot be asked send it back
to whatever the archive has. `sync` copies what the hosts have into the archive first.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from deployer.api.actions import Say, discovered, inventory_masker, newest_run
from deployer.core.errors import HostError, HostsFailed, TfdeployError, UsageError
from deployer.core.lines import Assembler, LineAssembler, RawLines
from deployer.core.secrets import Masker
from deployer.hosts.fleet import Fleet
from deployer.hosts.reply_types import TaskStatus
from deployer.results.archive import (
    LIMIT_BYTES,
    LogArchive,
    archive_ended,
    damaged,
    has_archive,
    let_go,
)
from deployer.results.metricsync import keep_if_ended, kept_outcome
from deployer.results.runs import (
    Target,
    archived_runs,
    ended_line,
    follow_logs,
    resolve,
    sync_archive,
)
from deployer.results.state import RUN_ID, load_if_readable
from deployer.sources import load_inventory

Lines = Callable[[str, list[str]], None]  # (label "task@host", lines): as a View's `lines`


def _nothing(_: str) -> None:
    pass


def read_logs(
    run_id: str,
    on_lines: Lines,
    *,
    inventory: str | None = None,
    task: str | None = None,
    tail: int | None = None,
    follow: bool = False,
    sync: bool = False,
    say: Say | None = None,
    target: Callable[[], Target] | None = None,
    hide: Masker | None = None,
    raw: bool = False,
    ended: Callable[[str], None] | None = None,
) -> None:
    """Calls `on_lines(label, lines)` with what the run's tasks (or `task`, e.g. "worker:0")
    printed, secrets masked: from this machine's archive once `up` saw the run end, else from
    the hosts (and from the archive when they cannot be asked). `tail`: each task's last
    `tail` lines; `follow`: until every task has ended, then `ended` gets one line saying how
    the run ended; `sync`: copy what the hosts have into the archive, then read it. `raw`: the
    lines as the tasks wrote them, escape sequences and control characters included (by default
    the output filter, deployer/core/lines.py, makes them safe for a terminal). `say` receives
    notes on where the lines come from (a damaged
    or cut archive). `inventory` names the run's inventory file when this machine has no
    record of the run.

    Raises UsageError when neither the archive nor any host has the run (or the task),
    HostsFailed when hosts cannot be asked and the archive has nothing of the run.
    """
    say = _once(say or _nothing)
    given, hide = hide, hide or logs_masker(run_id, inventory)
    reader = _Reader(run_id, task, tail, lambda label, lines: on_lines(label, _masked(hide, lines)))
    reader.assembler = RawLines if raw else LineAssembler
    # --raw asks the hosts first: the archive keeps what a terminal obeys only defanged.
    if RUN_ID.match(run_id) and not sync and not raw and archive_ended(run_id):
        if not damaged(run_id, task):
            reader.archived(say)  # `up` saw it end: all of it is here, the hosts may be gone
            if follow and ended is not None:
                kept = kept_outcome(run_id)
                how = f"{kept.get('outcome', 'ended')} {kept.get('why', '')}".strip()
                ended(f"run {run_id} had ended: {how} (from the local archive)")
            return
        for note in reader.damage_notes():
            say(note)
        say("reading the run's hosts instead")
    found = discovered(target() if target is not None else resolve(run_id, inventory))
    if found.run_id is None:  # an inventory: its newest run, by the same rule as a run id
        newest = newest_run(found, "logs", say).run_id
        assert newest is not None
        where = inventory or run_id  # the inventory file: its env tables mask the secrets
        read_logs(
            newest,
            on_lines,
            inventory=where,
            task=task,
            tail=tail,
            follow=follow,
            sync=sync,
            say=say,
            hide=given,
            raw=raw,
            ended=ended,
        )
        return
    reader.run_id = found.run_id
    with Fleet(found.hosts) as fleet:
        if sync:
            if not sync_archive(fleet, found.run_id, LogArchive(found.run_id, hide=hide)):
                raise _unknown_task(found.run_id, task)
            keep_if_ended(fleet, found)  # the history learns its end (metricsync.py)
            reader.archived(say)
            return
        final: list[TaskStatus] = []
        try:
            seen = follow_logs(
                fleet,
                found.run_id,
                reader.emit,
                task=task,
                tail=tail,
                follow=follow,
                assembler=reader.assembler,
                final=final,
            )
        except (HostError, HostsFailed) as exc:
            if not has_archive(found.run_id):
                raise
            reader.archived(say, f"{exc.message.splitlines()[0]}; from the local archive instead:")
            return
        if follow and final and all(s.finished for s in final):
            keep_if_ended(fleet, found)  # followed to its end: the history learns it
    if not seen:
        raise _unknown_task(found.run_id, task)
    if follow and ended is not None:
        ended(ended_line(found.run_id, final))


def logs_masker(run_id: str, inventory: str | None = None) -> Masker:
    """The secrets a run's tasks were given, as far as this shell can know them: the env tables
    of its inventory and forward_env from this environment. Without a readable inventory (a
    run id of another machine, a deleted file), every secret-looking value of this environment:
    the logs are shown either way, and a forwarded token is most likely set here too."""
    path = inventory
    if path is None and RUN_ID.match(run_id):
        record = load_if_readable(run_id)
        path = record.inventory if record is not None else None
    try:
        loaded = load_inventory(path) if path is not None else None
    except TfdeployError:
        loaded = None
    if loaded is None:
        return Masker.of([os.environ])
    return inventory_masker(loaded)


class _Reader:
    """One read of a run's logs: where lines go, and the archive's side of the rule."""

    def __init__(self, run_id: str, task: str | None, tail: int | None, emit: Lines) -> None:
        self.run_id, self.task, self.tail, self.emit = run_id, task, tail, emit
        self.assembler: Callable[[], Assembler] = LineAssembler

    def archived(self, say: Say, note: str | None = None) -> None:
        runs = archived_runs(self.run_id, self.task, self.tail, self.assembler)
        first = next(runs, None)
        if first is None and self.task:
            raise UsageError(
                f"the local archive has no line of task {self.task} of run {self.run_id} (it "
                "printed nothing, or the run has no such task)",
                hint="`tfdeploy status INVENTORY` lists the runs on the inventory's hosts",
            )
        for said in [*([note] if note else []), *self.damage_notes(), *self._let_go_notes()]:
            say(said)
        for label, lines in itertools.chain([first] if first else [], runs):
            self.emit(label, lines)

    def damage_notes(self) -> list[str]:
        return [
            f"local archive of run {self.run_id}, {name}: {what}"
            for name, what in damaged(self.run_id, self.task).items()
        ]

    def _let_go_notes(self) -> list[str]:
        kept = f"{LIMIT_BYTES >> 20}-{2 * LIMIT_BYTES >> 20} MiB"
        return [
            f"{name}: the local archive keeps a task's last {kept}; the first {gone} bytes of "
            f"its log are not here (`tfdeploy logs {self.run_id}` without --sync reads the "
            "hosts' whole log)"
            for name, gone in let_go(self.run_id, self.task).items()
        ]


def _once(say: Say) -> Say:
    """`say`, with a note said twice (the damage notes before and after a re-read) said once."""
    said: set[str] = set()

    def once(note: str) -> None:
        if note not in said:
            said.add(note)
            say(note)

    return once


def _masked(hide: Masker, lines: list[str]) -> list[str]:
    return [hide(line) for line in lines] if hide.values else lines


def _unknown_task(run_id: str, task: str | None) -> UsageError:
    what = f"task {task} of run" if task else "run"
    return UsageError(
        f"no host has {what} {run_id}",
        hint="`tfdeploy status INVENTORY` lists the runs on the inventory's hosts",
    )
