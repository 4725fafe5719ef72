"""One function per verb: each loads what it needs, calls the layers below, and prints.

Errors are raised, never printed here: main.run renders each one once.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import os
import shlex
import time

from rich.text import Text

from deployer import api
from deployer.api.actions import inventory_masker, pull_files
from deployer.api.actions import stop as api_stop
from deployer.api.actions import unknown_run as _unknown_run
from deployer.api.views import LazyView
from deployer.cli.console import Env
from deployer.cli.render import plan_json, plan_table, status_json, status_table
from deployer.config.inventory import Inventory, discover_hosts
from deployer.config.model import NetcheckMode
from deployer.core.errors import (
    ExitStatus,
    HostError,
    HostsFailed,
    TfdeployError,
    UsageError,
)
from deployer.core.secrets import Masker
from deployer.hosts.fleet import Fleet, Member
from deployer.results.archive import (
    LIMIT_BYTES,
    LogArchive,
    archive_ended,
    damaged,
    has_archive,
    let_go,
)
from deployer.results.runs import (
    Target,
    archived_runs,
    find_runs,
    follow_logs,
    resolve,
    survey_runs,
    sync_archive,
    task_ended,
    task_host,
)
from deployer.results.state import RUN_ID as STATE_RUN_ID
from deployer.results.state import load_if_readable
from deployer.results.tunnel import Tunnel, allow_many_files
from deployer.sources import load_inventory
from deployer.watch.view import PlainView, make_view, masked_view


def _inventory(path: str) -> Inventory:
    """Loads (pure), then discovers the host sources' hosts: the one place the CLI does that I/O."""
    return discover_hosts(load_inventory(path))


def _with_discovered_hosts(target: Target) -> Target:
    return dataclasses.replace(target, inventory=discover_hosts(target.inventory))


def plan_verb(args: argparse.Namespace, env: Env) -> int:
    plan = api.plan(args.inventory)
    if args.json:
        env.raw_out.write(plan_json(plan) + "\n")
    else:
        env.out.print(plan_table(plan))
    return ExitStatus.OK


def up_verb(args: argparse.Namespace, env: Env) -> int:
    api.up(
        args.inventory,
        detach=args.detach,
        netcheck=_netcheck(args),
        refresh_env=args.refresh_env,
        concurrency=args.concurrency,
        view=LazyView(lambda: make_view(env.out, env.raw_out)),
        say=functools.partial(_say, env),
        warn=lambda line: env.err.print(Text(f"tfdeploy: {line}")),
    )
    return ExitStatus.OK


def _netcheck(args: argparse.Namespace) -> NetcheckMode | None:
    """--no-netcheck, else --netcheck MODE, else None: the inventory's job.netcheck decides."""
    if args.no_netcheck:
        return NetcheckMode.OFF
    return NetcheckMode(args.netcheck) if args.netcheck else None


def _say(env: Env, line: str) -> None:
    env.out.print(Text(line))


def check_verb(args: argparse.Namespace, env: Env) -> int:
    api.check(
        args.inventory,
        netcheck=_netcheck(args),
        refresh_env=args.refresh_env,
        concurrency=args.concurrency,
        view=LazyView(lambda: make_view(env.out, env.raw_out)),
    )
    return ExitStatus.OK


def down_verb(args: argparse.Namespace, env: Env) -> int:
    api_stop(
        resolve(args.target, args.inventory),
        terminate=args.terminate,
        say=functools.partial(_say, env),
        warn=lambda line: env.err.print(Text(line)),
    )
    return ExitStatus.OK


def _logs_masker(run_id: str, inventory: str | None) -> Masker:
    """The secrets a run's tasks were given, as far as this shell can know them: the env tables
    of its inventory and forward_env from this environment. Without a readable inventory (a
    run id of another machine, a deleted file), every secret-looking value of this environment:
    the logs are shown either way, and a forwarded token is most likely set here too."""
    path = inventory
    if path is None and STATE_RUN_ID.match(run_id):
        record = load_if_readable(run_id)
        path = record.inventory if record is not None else None
    try:
        loaded = load_inventory(path) if path is not None else None
    except TfdeployError:
        loaded = None
    if loaded is None:
        return Masker.of([os.environ])
    return inventory_masker(loaded)


def _unknown_task(run_id: str, task: str | None = None) -> UsageError:
    what = f"task {task} of run" if task else "run"
    return UsageError(
        f"no host has {what} {run_id}",
        hint="`tfdeploy status INVENTORY` lists the runs on the inventory's hosts",
    )


def status_verb(args: argparse.Namespace, env: Env) -> int:
    """Tasks and states from the hosts. A host that cannot be asked still leaves the others'
    answers printed (a JSON document marks it `unreachable`), then exits 3 naming it."""
    target = _with_discovered_hosts(resolve(args.target, args.inventory))
    with Fleet(target.hosts) as fleet:
        survey = survey_runs(fleet, target)
    runs = survey.runs
    if args.json:
        env.raw_out.write(status_json(runs, survey.failures) + "\n")
    elif runs:
        fit = env.out.is_terminal and not args.all  # a pipe or file gets every task
        brief = not args.all and target.run_id is None  # a run named gets its tasks
        env.out.print(status_table(runs, env.out.height if fit else None, brief_ended=brief))
    if survey.failures:
        shown = "the other hosts' answers are shown" if runs or args.json else None
        raise HostsFailed(survey.failures, what="listing runs failed", outcome=shown)
    if target.run_id is not None and not runs:
        raise _unknown_run(target, survey)
    if not runs and not args.json:
        env.out.print(Text(survey.nothing_found(target)))
    return ExitStatus.OK


def logs_verb(args: argparse.Namespace, env: Env) -> int:
    if args.sync and args.follow:
        raise UsageError("--sync copies what the hosts have and prints it; it does not follow")
    view = masked_view(PlainView(env.raw_out), _logs_masker(args.run_id, args.inventory))

    said: list[str] = []

    def say(note: str) -> None:
        if note not in said:
            said.append(note)
            env.err.print(Text(note), style="yellow")

    def archived(note: str | None = None) -> int:
        runs = archived_runs(args.run_id, args.task, args.tail)
        first = next(runs, None)
        if first is None and args.task:
            raise UsageError(
                f"the local archive has no line of task {args.task} of run {args.run_id} (it "
                "printed nothing, or the run has no such task)",
                hint="`tfdeploy status INVENTORY` lists the runs on the inventory's hosts",
            )
        if note:
            say(note)
        for what in _damage_notes(args.run_id, args.task):
            say(what)
        for what in _let_go_notes(args.run_id, args.task):
            say(what)
        for label, lines in itertools.chain([first] if first else [], runs):
            view.lines(label, lines)
        return ExitStatus.OK

    if STATE_RUN_ID.match(args.run_id) and not args.sync and archive_ended(args.run_id):
        if not damaged(args.run_id, args.task):
            return archived()  # `up` saw it end: all of it is here, the hosts may be gone
        for what in _damage_notes(args.run_id, args.task):
            say(what)
        say("reading the run's hosts instead")
    target = _with_discovered_hosts(resolve(args.run_id, args.inventory))
    if target.run_id is None:
        raise UsageError("logs needs a run id (see `tfdeploy status INVENTORY`)")
    with Fleet(target.hosts) as fleet:
        if args.sync:
            if not sync_archive(fleet, target.run_id, LogArchive(target.run_id)):
                raise _unknown_task(target.run_id, args.task)
            return archived()
        try:
            found = follow_logs(
                fleet,
                target.run_id,
                view.lines,
                task=args.task,
                tail=args.tail,
                follow=args.follow,
            )
        except (HostError, HostsFailed) as exc:
            if not has_archive(target.run_id):
                raise
            return archived(f"{exc.message.splitlines()[0]}; from the local archive instead:")
    if not found:
        raise _unknown_task(target.run_id, args.task)
    return ExitStatus.OK


def _let_go_notes(run_id: str, task: str | None) -> list[str]:
    kept = f"{LIMIT_BYTES >> 20}-{2 * LIMIT_BYTES >> 20} MiB"
    return [
        f"{name}: the local archive keeps a task's last {kept}; the first {gone} bytes of its "
        f"log are not here (`tfdeploy logs {run_id}` without --sync reads the hosts' whole log)"
        for name, gone in let_go(run_id, task).items()
    ]


def _damage_notes(run_id: str, task: str | None) -> list[str]:
    return [
        f"local archive of run {run_id}, {name}: {what}"
        for name, what in damaged(run_id, task).items()
    ]


def pull_verb(args: argparse.Namespace, env: Env) -> int:
    target = resolve(args.run_id, args.inventory)
    if target.run_id is None:
        raise UsageError("pull needs a run id (see `tfdeploy status INVENTORY`)")
    result = pull_files(
        target,
        args.paths,
        args.to,
        tasks=args.task,
        concurrency=args.concurrency,
        inventory=args.inventory,
    )
    view = PlainView(env.raw_out)
    for refusal in result.refused:
        view.step(f"not pulled: {refusal}")
    view.step(result.summary())
    return ExitStatus.INCOMPLETE if result.not_kept else ExitStatus.OK


def tunnel_verb(args: argparse.Namespace, env: Env) -> int:
    target = _with_discovered_hosts(resolve(args.run_id, args.inventory))
    if target.run_id is None:
        raise UsageError("tunnel needs a run id (see `tfdeploy status INVENTORY`)")
    with Fleet(target.hosts) as fleet:
        runs = find_runs(fleet, target)
        host, task = task_host(runs, args.task)
        ended = task_ended(runs, task)
        if ended is not None:
            raise UsageError(
                f"{task} of run {target.run_id} has ended ({ended}): nothing of it serves "
                "any more, so no tunnel was opened",
                hint=f"`tfdeploy status {target.run_id}` shows the run's tasks",
            )
        member = fleet.member(host)
        allow_many_files()
        with Tunnel(member.agent.transport, args.remote_port, args.local_port or 0) as tunnel:
            view = PlainView(env.raw_out)
            view.step(
                f"{tunnel.url} -> {task}@{host} port {args.remote_port} (its loopback, over SSH); "
                "Ctrl-C ends the tunnel, and so does the end of the task"
            )
            try:
                ended = _forward_while_running(tunnel, view, member, target.run_id, task)
            except KeyboardInterrupt:
                return ExitStatus.OK
            view.step(f"{task} of run {target.run_id} has ended ({ended}): the tunnel is closed")
            return ExitStatus.OK


TASK_CHECK_S = 2.0  # how often a tunnel asks whether its task still runs


def _forward_while_running(
    tunnel: Tunnel, view: PlainView, member: Member, run_id: str, task: str
) -> str:
    """Reports failed connections until the task ends; returns how it ended."""
    reported, checked = 0, time.monotonic()
    while True:
        time.sleep(0.5)
        for error in tunnel.errors[reported:]:
            view.step(f"a connection failed: {error}")
        reported = len(tunnel.errors)
        if time.monotonic() - checked < TASK_CHECK_S:
            continue
        checked = time.monotonic()
        try:
            poll = member.agent.poll(run_id, {}, max_bytes=0, heartbeat=False)
        except HostError as exc:  # its connections fail too, and say so; it may come back
            view.step(f"could not ask {member.name} whether {task} runs: {exc.cause}")
            continue
        status = next((t for t in poll.tasks if t.name == task), None)
        if status is None or status.finished:
            return status.outcome() if status is not None else "gone from its host"


def exec_verb(args: argparse.Namespace, env: Env) -> int:
    inventory = _inventory(args.inventory)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("exec needs a command: tfdeploy exec INVENTORY -- CMD ...")
    # One argument is a shell snippet ('nvidia-smi | head'); several are an argv, kept verbatim.
    shell = command[0] if len(command) == 1 else shlex.join(command)
    view = PlainView(env.raw_out)
    with Fleet(inventory.hosts, concurrency=args.concurrency) as fleet:
        results, unreachable = fleet.each_settled(
            lambda m: m.agent.transport.run(["sh", "-c", shell], timeout=None)
        )
    failed = 0
    for host, result in results.items():
        out = (result.stdout + result.stderr).decode(errors="replace").splitlines()
        view.lines(host, out)
        if result.exit_code != 0:
            failed += 1
            view.step(f"{host}: exit code {result.exit_code}")
    if unreachable:
        ran = "the command ran on the other hosts" if results else "the command ran nowhere"
        raise HostsFailed(unreachable, what="exec failed", outcome=ran)
    return ExitStatus.JOB_FAILED if failed else ExitStatus.OK
