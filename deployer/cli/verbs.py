"""One function per verb: each calls the `deployer.api` function a notebook would, and prints.

Errors are raised, never printed here: main.run renders each one once. The API's names are
looked up at a verb's first use (deployer.api resolves them lazily), so a command loads only
the machinery its verb needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from rich.text import Text

from deployer import api
from deployer.api import reportpage, runlist
from deployer.api.render import (
    plan_document,
    plan_table,
    source_table,
    status_json,
    status_table,
)
from deployer.cli.console import Env
from deployer.core.errors import ExitStatus, HostsFailed, NothingMatched, UsageError
from deployer.core.lines import clean_text, lines_of


def plan_verb(args: argparse.Namespace, env: Env) -> int:
    plan = api.plan(args.inventory)
    for warning in plan.warnings:  # stderr: a --json document on stdout stays whole
        env.err.print(Text.assemble(("warning: ", "yellow"), warning))
    planned = api.environments(plan)  # `requirements`: what this machine knows without a host
    if args.json:
        document = plan_document(plan)
        document["environments"] = [dataclasses.asdict(e) for e in planned]
        env.raw_out.write(json.dumps(document, indent=2) + "\n")
    else:
        env.out.print(plan_table(plan))
        for e in planned:
            env.out.print(Text(e.line()))
    return ExitStatus.OK


def up_verb(args: argparse.Namespace, env: Env) -> int:
    api.up(
        args.inventory,
        detach=args.detach,
        netcheck=_netcheck(args),
        refresh_env=args.refresh_env,
        concurrency=args.concurrency,
        view=api.terminal_view(env.out, env.raw_out),
        say=functools.partial(_say, env),
        resume=args.resume,
        warn=lambda line: env.err.print(Text(f"tfdeploy: {clean_text(line)}")),
    )
    return ExitStatus.OK


def _netcheck(args: argparse.Namespace) -> bool | str | None:
    """--no-netcheck, else --netcheck MODE, else None: the inventory's job.netcheck decides."""
    if args.no_netcheck:
        return False
    return str(args.netcheck) if args.netcheck else None


def _say(env: Env, line: str) -> None:
    env.out.print(Text(clean_text(line)))


def check_verb(args: argparse.Namespace, env: Env) -> int:
    api.check(
        args.inventory,
        netcheck=_netcheck(args),
        refresh_env=args.refresh_env,
        concurrency=args.concurrency,
        view=api.terminal_view(env.out, env.raw_out),
    )
    return ExitStatus.OK


def down_verb(args: argparse.Namespace, env: Env) -> int:
    api.down(
        args.target,
        inventory=args.inventory,
        terminate=args.terminate,
        artifacts=not args.no_artifacts,
        artifacts_timeout=args.artifacts_timeout,
        say=functools.partial(_say, env),
        warn=lambda line: env.err.print(Text(clean_text(line))),
        progress=functools.partial(_say, env),
    )
    return ExitStatus.OK


def status_verb(args: argparse.Namespace, env: Env) -> int:
    """Tasks and states from the hosts. A host that cannot be asked still leaves the others'
    answers printed (a JSON document marks it `unreachable`), then exits 3 naming it."""
    found = api.status(args.target, inventory=args.inventory)
    runs = found.runs
    for table in found.sources if not args.json else ():
        env.out.print(source_table(table))
    if args.json:
        env.raw_out.write(status_json(runs, found.failures, found.costs) + "\n")
    elif runs:
        # A pipe or file gets every task of every run, ended or not (scripts read them); a
        # terminal folds to its height and an ended run to one line, unless --all or a run named.
        fit = env.out.is_terminal and not args.all
        brief = fit and found.run_id is None
        height = env.out.height if fit else None
        env.out.print(status_table(runs, height, brief_ended=brief, costs=found.costs))
    for run_id in found.artifacts_waiting if not args.json else ():
        env.err.print(
            Text(
                f"run {run_id} has ended; its job.artifacts are not pulled yet: "
                f"`tfdeploy down {run_id}` pulls them"
            ),
            style="yellow",
        )
    if found.failures:
        shown = "the other hosts' answers are shown" if runs or args.json else None
        raise HostsFailed(found.failures, what="listing runs failed", outcome=shown)
    if found.run_id is not None and not runs:
        raise found.missing()
    if not runs and not args.json:
        env.out.print(Text(found.nothing_found))
    return ExitStatus.OK


def runs_verb(args: argparse.Namespace, env: Env) -> int:
    """Every run this machine keeps a record of, newest first (api/runlist.py)."""
    states: dict[str, list[Any]] = {}
    if args.inventory:  # before the local runs are read: what it finds ended is recorded
        for run in api.status(args.inventory).runs:
            states.setdefault(run.run_id, []).extend(run.tasks)
    found = runlist.local_runs()
    if args.inventory:
        found = runlist.with_hosts(found, states)
    found = [
        r
        for r in found
        if (args.job is None or r.job == args.job)
        and (args.state is None or r.outcome == args.state)
    ]
    if args.json:
        env.raw_out.write(json.dumps({"runs": [r.to_json() for r in found]}, indent=2) + "\n")
    elif found:
        env.out.print(runlist.runs_table(found))
    else:
        env.out.print(Text("no runs recorded on this machine match"))
    return ExitStatus.OK


def report_verb(args: argparse.Namespace, env: Env) -> int:
    """The run's HTML page; its path is the last line printed."""
    out = Path(args.output) if args.output else None
    path = reportpage.write_report(args.run_id, out)
    env.raw_out.write(f"{path.resolve()}\n")
    return ExitStatus.OK


def attach_verb(args: argparse.Namespace, env: Env) -> int:
    """Exit 0 when the run succeeded, the job's failure otherwise; Ctrl-C leaves the run."""
    from deployer.api.attaching import attach_run  # the watch machinery: for this verb only

    attach_run(
        args.run_id,
        api.terminal_view(env.out, env.raw_out),
        inventory=args.inventory,
        say=lambda note: env.err.print(Text(clean_text(note)), style="yellow"),
    )
    return ExitStatus.OK


def logs_verb(args: argparse.Namespace, env: Env) -> int:
    if args.sync and args.follow:
        raise UsageError("--sync copies what the hosts have and prints it; it does not follow")
    api.read_logs(
        args.run_id,
        api.PlainView(env.raw_out).lines,
        inventory=args.inventory,
        task=args.task,
        tail=args.tail,
        follow=args.follow,
        sync=args.sync,
        say=lambda note: env.err.print(Text(clean_text(note)), style="yellow"),
        raw=args.raw,
        ended=lambda line: api.PlainView(env.raw_out).step(line),
    )
    return ExitStatus.OK


def pull_verb(args: argparse.Namespace, env: Env) -> int:
    result = api.pull(
        args.run_id,
        args.paths,
        args.to,
        inventory=args.inventory,
        tasks=args.task,
        concurrency=args.concurrency,
        say=lambda note: env.err.print(Text(clean_text(note)), style="yellow"),
    )
    view = api.PlainView(env.raw_out)
    for refusal in result.refused:
        view.step(f"not pulled: {refusal}")
    if not result.files and not result.not_kept and not result.unread:
        raise NothingMatched(result.nothing_matched(), hint=NOTHING_MATCHED_HINT)
    view.step(result.summary())
    return ExitStatus.INCOMPLETE if result.not_kept or result.unread else ExitStatus.OK


NOTHING_MATCHED_HINT = (
    "a relative pattern names files below the task's directory on its host (the run's code "
    "directory, where the task ran: `ckpt/**`, not the path on this machine); an absolute one "
    "names the host's own files"
)


def profile_verb(args: argparse.Namespace, env: Env) -> int:
    result = api.profile(
        args.run_id,
        inventory=args.inventory,
        seconds=args.seconds,
        tasks=args.task,
        to=args.to,
        concurrency=args.concurrency,
        say=lambda note: env.err.print(Text(clean_text(note)), style="yellow"),
    )
    view = api.PlainView(env.raw_out)
    for line in result.lines():
        view.step(line)
    return ExitStatus.INCOMPLETE if result.missed or result.failures else ExitStatus.OK


def tensorboard_verb(args: argparse.Namespace, env: Env) -> int:
    view = api.PlainView(env.raw_out)
    say = lambda note: env.err.print(Text(clean_text(note)), style="yellow")  # noqa: E731
    with api.tensorboard(
        args.run_id, inventory=args.inventory, port=args.port, to=args.to, say=say
    ) as board:
        view.step(
            f"TensorBoard at {board.url} over {board.folder}/ (the run's events, pulled while it "
            "runs, and its profiles); Ctrl-C stops it"
        )
        try:
            board.serve(view.step)
        except KeyboardInterrupt:
            return ExitStatus.OK
    return ExitStatus.OK


def tunnel_verb(args: argparse.Namespace, env: Env) -> int:
    view = api.PlainView(env.raw_out)
    with api.tunnel(
        args.run_id,
        args.remote_port,
        task=args.task,
        local_port=args.local_port or 0,
        inventory=args.inventory,
    ) as forward:
        view.step(
            f"{forward.url} -> {forward.task}@{forward.host} port {forward.remote_port} (its "
            "loopback, over SSH); Ctrl-C ends the tunnel, and so does the end of the task"
        )
        try:
            ended = forward.wait(view.step)
        except KeyboardInterrupt:
            return ExitStatus.OK
        what = f"{forward.task} of run {forward.run_id}"
        view.step(f"{what} has ended ({ended}): the tunnel is closed")
        return ExitStatus.OK


def prune_verb(args: argparse.Namespace, env: Env) -> int:
    from deployer.api.prune import DEFAULT_GRACE_S, parse_age, parse_grace, prune, summary

    if args.local == (args.inventory is not None):
        raise UsageError(
            "prune takes an inventory (its hosts) or --local (this machine's caches)",
            hint="tfdeploy prune INVENTORY, or tfdeploy prune --local",
        )
    if args.local:
        from deployer.api.prune_local import prune_local

        prune_local(
            keep=args.keep,
            older_than=parse_age(args.older_than) if args.older_than else None,
            dry_run=args.dry_run,
            grace=parse_grace(args.grace) if args.grace else DEFAULT_GRACE_S,
            say=functools.partial(_say, env),
        )
        return ExitStatus.OK
    result = prune(
        args.inventory,
        keep=args.keep,
        older_than=parse_age(args.older_than) if args.older_than else None,
        dry_run=args.dry_run,
        grace=parse_grace(args.grace) if args.grace else DEFAULT_GRACE_S,
        concurrency=args.concurrency,
        say=functools.partial(_say, env),
    )
    if len(result.hosts) > 1:
        _say(env, summary(result))
    return ExitStatus.OK


def exec_verb(args: argparse.Namespace, env: Env) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("exec needs a command: tfdeploy exec INVENTORY -- CMD ...")
    # One argument is a shell snippet ('nvidia-smi | head'); several are an argv, kept verbatim.
    ran = api.execute(
        args.inventory, command[0] if len(command) == 1 else command, concurrency=args.concurrency
    )
    view = api.PlainView(env.raw_out)
    failed = 0
    for host, result in ran.results.items():
        if args.raw:  # the bytes as the host wrote them, unprefixed: asked for, never the default
            _write_bytes(env, result.stdout + result.stderr)
        else:  # a host is untrusted: its output is text for the terminal, never control
            view.lines(host, lines_of(result.stdout + result.stderr))
        if result.exit_code != 0:
            failed += 1
            said = f"{host}: exit code {result.exit_code}"
            if args.raw:  # stdout holds only the hosts' bytes
                env.err.print(Text(f"tfdeploy: {said}"))
            else:
                view.step(said)
    if ran.unreachable:
        said = "the command ran on the other hosts" if ran.results else "the command ran nowhere"
        raise HostsFailed(ran.unreachable, what="exec failed", outcome=said)
    return ExitStatus.JOB_FAILED if failed else ExitStatus.OK


def _write_bytes(env: Env, data: bytes) -> None:
    """`data` to stdout unchanged (a text stream without a buffer, as a test's, gets it decoded)."""
    env.raw_out.flush()
    buffer = getattr(env.raw_out, "buffer", None)
    if buffer is None:
        env.raw_out.write(data.decode(errors="replace"))
    else:
        buffer.write(data)
        buffer.flush()
