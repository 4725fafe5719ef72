"""One function per verb: each loads what it needs, calls the layers below, and prints.

Errors are raised, never printed here: main.run renders each one once.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shlex
import signal
import time
from pathlib import Path

from rich.text import Text

from deployer.cli.console import Env
from deployer.cli.render import plan_json, plan_table, status_json, status_table
from deployer.config.inventory import Inventory, discover_hosts
from deployer.config.plan import make_plan
from deployer.config.sources import ANY_TIME, AT_DOWN, AT_JOB_END
from deployer.core.errors import (
    ExitStatus,
    HostError,
    HostsFailed,
    Interrupted,
    TfdeployError,
    UsageError,
)
from deployer.core.secrets import mask_text
from deployer.core.text import plural
from deployer.hosts.agent import escaped_text
from deployer.hosts.fleet import Fleet
from deployer.results.archive import LogArchive, archive_ended, has_archive
from deployer.results.pull import KEPT, pull, resume_command
from deployer.results.runs import (
    Target,
    archived_lines,
    find_runs,
    find_runs_settled,
    follow_logs,
    resolve,
    stop_runs,
    sync_archive,
    task_host,
)
from deployer.results.state import RUN_ID as STATE_RUN_ID
from deployer.results.tunnel import Tunnel
from deployer.sources import load_inventory
from deployer.up import firewall
from deployer.up.deployment import Deployment, UpOptions
from deployer.watch.view import PlainView, make_view


def _inventory(path: str) -> Inventory:
    """Loads (pure), then discovers the host sources' hosts: the one place the CLI does that I/O."""
    return discover_hosts(load_inventory(path))


def _with_discovered_hosts(target: Target) -> Target:
    return dataclasses.replace(target, inventory=discover_hosts(target.inventory))


def plan_verb(args: argparse.Namespace, env: Env) -> int:
    plan = make_plan(discover_hosts(load_inventory(args.inventory), preview=True))
    if args.json:
        env.raw_out.write(plan_json(plan) + "\n")
    else:
        env.out.print(plan_table(plan))
    return ExitStatus.OK


def up_verb(args: argparse.Namespace, env: Env) -> int:
    loaded = load_inventory(args.inventory)
    plan = make_plan(discover_hosts(loaded, provision=functools.partial(_say, env)))
    options = UpOptions(detach=args.detach, netcheck=not args.no_netcheck)
    try:
        with Fleet(plan.hosts, concurrency=args.concurrency) as fleet:
            view = make_view(env.out, env.raw_out)
            return Deployment(plan, fleet, view, options).run()
    finally:
        if not args.detach:
            try:
                _terminate(loaded, env, when=AT_JOB_END)
            except TfdeployError as exc:  # reported; the job's own outcome stays the exit status
                env.err.print(Text(f"tfdeploy: terminate_after = job-end failed: {exc}"))


def _say(env: Env, line: str) -> None:
    env.out.print(Text(line))


def _terminate(inventory: Inventory, env: Env, *, when: tuple[str, ...]) -> None:
    """Ends the machines the inventory's sources created whose end is due at `when`; never one
    they only discovered."""
    for source in inventory.sources:
        source.terminate(when, functools.partial(_say, env))


def check_verb(args: argparse.Namespace, env: Env) -> int:
    inventory = discover_hosts(load_inventory(args.inventory), preview=True)
    missing = sum(t.to_launch for t in inventory.tables)
    if missing:
        raise UsageError(
            f"{plural(missing, 'instance')} of the fleet {'is' if missing == 1 else 'are'} not "
            "launched yet: check needs every host running",
            hint=f"`tfdeploy up {args.inventory}` launches them (`plan` shows what it would)",
        )
    plan = make_plan(inventory)
    options = UpOptions(netcheck=not args.no_netcheck)
    with Fleet(plan.hosts, concurrency=args.concurrency) as fleet:
        view = make_view(env.out, env.raw_out)
        return Deployment(plan, fleet, view, options).check()


def down_verb(args: argparse.Namespace, env: Env) -> int:
    resolved = resolve(args.target, args.inventory)
    target = _with_discovered_hosts(resolved)
    job = target.inventory.job
    with Fleet(target.inventory.hosts) as fleet:
        found, unreachable = find_runs_settled(fleet, target)
        # A named run is stopped even with every task finished: its escaped processes may not be.
        stopped, failed = stop_runs(
            fleet, found, grace=job.stop_grace, finished_too=target.run_id is not None
        )
        if job.firewall:  # after the stop: ports stay closed until tasks are gone
            for r in found:
                for failure in firewall.remove(fleet, [fleet.member(r.host)], r.run_id):
                    env.err.print(Text(f"could not remove the firewall rules on {failure.message}"))
    shown = [s for s in stopped if s.anything]
    hide = functools.partial(mask_text, env=_maskable_env(target.inventory), extra=job.secret_env)
    for s in shown:
        env.out.print(Text(f"stopped run {s.run.run_id} on {s.run.host}"))
        if s.escaped:
            env.out.print(Text(f"{s.run.host}: {escaped_text(s.escaped, hide)}"))
    # An unreachable host is no reason to keep paying for it: terminating ends its tasks too.
    _terminate(resolved.inventory, env, when=ANY_TIME if args.terminate else AT_DOWN)
    if unreachable or failed:
        done = "the run was stopped on the other hosts" if shown else "nothing was stopped"
        raise HostsFailed([*unreachable, *failed], what="stopping failed", outcome=done)
    if target.run_id is not None and not found:
        raise _unknown_run(target.run_id)
    if not shown:
        env.out.print(Text("nothing to stop: no running task of that run or job on its hosts"))
    return ExitStatus.OK


def _maskable_env(inventory: Inventory) -> dict[str, str]:
    """Every value a task of this inventory may carry in its command line, to mask secrets."""
    values = dict(inventory.job.env)
    for host in inventory.hosts:
        for spec in host.tasks:
            values.update(spec.env)
    values.update({n: os.environ[n] for n in inventory.job.forward_env if n in os.environ})
    return values


def _unknown_run(run_id: str, task: str | None = None) -> UsageError:
    what = f"task {task} of run" if task else "run"
    return UsageError(
        f"no host has {what} {run_id}",
        hint="`tfdeploy status INVENTORY` lists the runs on the inventory's hosts",
    )


def status_verb(args: argparse.Namespace, env: Env) -> int:
    target = _with_discovered_hosts(resolve(args.target, args.inventory))
    with Fleet(target.inventory.hosts) as fleet:
        runs = find_runs(fleet, target)
    if target.run_id is not None and not runs:
        raise _unknown_run(target.run_id)
    if args.json:
        env.raw_out.write(status_json(runs) + "\n")
    elif not runs:
        env.out.print(Text("no runs found on the hosts"))
    else:
        env.out.print(status_table(runs))
    return ExitStatus.OK


def logs_verb(args: argparse.Namespace, env: Env) -> int:
    if args.sync and args.follow:
        raise UsageError("--sync copies what the hosts have and prints it; it does not follow")
    view = PlainView(env.raw_out)

    def archived(note: str | None = None) -> int:
        lines = archived_lines(args.run_id, args.task, args.tail)
        if not lines and args.task:
            raise _unknown_run(args.run_id, args.task)
        if note:
            env.err.print(Text(note), style="yellow")
        for label, line in lines:
            view.lines(label, [line])
        return ExitStatus.OK

    if STATE_RUN_ID.match(args.run_id) and not args.sync and archive_ended(args.run_id):
        return archived()  # `up` saw it end: all of it is here, the hosts may be gone
    target = _with_discovered_hosts(resolve(args.run_id, args.inventory))
    if target.run_id is None:
        raise UsageError("logs needs a run id (see `tfdeploy status INVENTORY`)")
    with Fleet(target.inventory.hosts) as fleet:
        if args.sync:
            if not sync_archive(fleet, target.run_id, LogArchive(target.run_id)):
                raise _unknown_run(target.run_id, args.task)
            return archived()
        try:
            found = follow_logs(
                fleet,
                target.run_id,
                lambda label, line: view.lines(label, [line]),
                task=args.task,
                tail=args.tail,
                follow=args.follow,
            )
        except (HostError, HostsFailed) as exc:
            if not has_archive(target.run_id):
                raise
            return archived(f"{exc.message.splitlines()[0]}; from the local archive instead:")
    if not found:
        raise _unknown_run(target.run_id, args.task)
    return ExitStatus.OK


def pull_verb(args: argparse.Namespace, env: Env) -> int:
    target = _with_discovered_hosts(resolve(args.run_id, args.inventory))
    if target.run_id is None:
        raise UsageError("pull needs a run id (see `tfdeploy status INVENTORY`)")
    with Fleet(target.inventory.hosts, concurrency=args.concurrency) as fleet:
        try:
            result = pull(fleet, target.run_id, args.paths, Path(args.to), tasks=args.task)
        except KeyboardInterrupt as exc:
            signum = int(getattr(exc, "signum", signal.SIGINT))
            again = resume_command(
                target.run_id, args.paths, args.to, tasks=args.task, inventory=args.inventory
            )
            raise Interrupted(f"pull interrupted; {KEPT}", hint=again, signum=signum) from None
    view = PlainView(env.raw_out)
    for refusal in result.refused:
        view.step(f"not pulled: {refusal}")
    view.step(result.summary())
    return ExitStatus.OK


def tunnel_verb(args: argparse.Namespace, env: Env) -> int:
    target = _with_discovered_hosts(resolve(args.run_id, args.inventory))
    if target.run_id is None:
        raise UsageError("tunnel needs a run id (see `tfdeploy status INVENTORY`)")
    with Fleet(target.inventory.hosts) as fleet:
        host, task = task_host(find_runs(fleet, target), args.task)
        transport = fleet.member(host).agent.transport
        with Tunnel(transport, args.remote_port, args.local_port or 0) as tunnel:
            view = PlainView(env.raw_out)
            view.step(
                f"{tunnel.url} -> {task}@{host} port {args.remote_port} (its loopback, over SSH); "
                "Ctrl-C ends the tunnel"
            )
            reported = 0
            try:
                while True:
                    time.sleep(0.5)
                    for error in tunnel.errors[reported:]:
                        view.step(f"a connection failed: {error}")
                    reported = len(tunnel.errors)
            except KeyboardInterrupt:
                return ExitStatus.OK


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
