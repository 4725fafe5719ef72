"""The `tfdeploy` command line: parses arguments, runs one verb, and renders every error once."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.text import Text

from deployer import firewall
from deployer.errors import ExitStatus, Terminated, TfdeployError, UsageError
from deployer.fleet import Fleet
from deployer.inventory import Inventory, load_inventory
from deployer.lifecycle import Deployment, UpOptions
from deployer.plan import make_plan
from deployer.render import plan_json, plan_table, status_json, status_table
from deployer.runs import Target, find_runs, follow_logs, resolve, stop_runs
from deployer.view import PlainView, make_view


@dataclass(frozen=True)
class Env:
    """Where the CLI writes; injected so tests run it in-process and read what a user would see."""

    out: Console
    err: Console
    raw_out: TextIO


def _inventory(path: str) -> Inventory:
    """Loads (pure), then discovers [aws] hosts: the one place the CLI does that I/O."""
    inventory = load_inventory(path)
    if inventory.aws is None:
        return inventory
    from deployer.aws import resolve_hosts  # boto3 only for inventories that use [aws]

    return resolve_hosts(inventory)


def _with_aws_hosts(target: Target) -> Target:
    if target.inventory.aws is None:
        return target
    from deployer.aws import resolve_hosts

    return dataclasses.replace(target, inventory=resolve_hosts(target.inventory))


def _cmd_plan(args: argparse.Namespace, env: Env) -> int:
    plan = make_plan(_inventory(args.inventory))
    if args.json:
        env.raw_out.write(plan_json(plan) + "\n")
    else:
        env.out.print(plan_table(plan))
    return ExitStatus.OK


def _cmd_up(args: argparse.Namespace, env: Env) -> int:
    plan = make_plan(_inventory(args.inventory))
    options = UpOptions(detach=args.detach)
    with Fleet(plan.hosts, concurrency=args.concurrency) as fleet:
        view = make_view(env.out, env.raw_out)
        return Deployment(plan, fleet, view, options).run()


def _cmd_down(args: argparse.Namespace, env: Env) -> int:
    target = _with_aws_hosts(resolve(args.target, args.inventory))
    with Fleet(target.inventory.hosts) as fleet:
        found = find_runs(fleet, target)
        stopped = stop_runs(fleet, found, grace=target.inventory.job.stop_grace)
        if target.inventory.job.firewall:  # after the stop: ports stay closed until tasks are gone
            for r in found:
                for failure in firewall.remove(fleet, [fleet.member(r.host)], r.run_id):
                    env.err.print(Text(f"could not remove the firewall rules on {failure.message}"))
    if not stopped:
        env.out.print(Text("nothing to stop: no running task of that run or job on its hosts"))
    for r in stopped:
        env.out.print(Text(f"stopped run {r.run_id} on {r.host}"))
    return ExitStatus.OK


def _cmd_status(args: argparse.Namespace, env: Env) -> int:
    target = _with_aws_hosts(resolve(args.target, args.inventory))
    with Fleet(target.inventory.hosts) as fleet:
        runs = find_runs(fleet, target)
    if args.json:
        env.raw_out.write(status_json(runs) + "\n")
    elif not runs:
        env.out.print(Text("no runs found on the hosts"))
    else:
        env.out.print(status_table(runs))
    return ExitStatus.OK


def _cmd_logs(args: argparse.Namespace, env: Env) -> int:
    target = _with_aws_hosts(resolve(args.run_id, args.inventory))
    if target.run_id is None:
        raise UsageError("logs needs a run id (see `tfdeploy status INVENTORY`)")
    view = PlainView(env.raw_out)
    with Fleet(target.inventory.hosts) as fleet:
        found = follow_logs(
            fleet,
            target.run_id,
            lambda label, line: view.lines(label, [line]),
            task=args.task,
            tail=args.tail,
            follow=args.follow,
        )
    if not found:
        what = f"task {args.task} of run" if args.task else "run"
        raise UsageError(f"no host has {what} {target.run_id}")
    return ExitStatus.OK


def _cmd_exec(args: argparse.Namespace, env: Env) -> int:
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
        results = fleet.each(
            lambda m: m.agent.transport.run(["sh", "-c", shell], timeout=None),
            what="exec failed",
        )
    failed = 0
    for host, result in results.items():
        out = (result.stdout + result.stderr).decode(errors="replace").splitlines()
        view.lines(host, out)
        if result.exit_code != 0:
            failed += 1
            view.step(f"{host}: exit code {result.exit_code}")
    return ExitStatus.JOB_FAILED if failed else ExitStatus.OK


def _target_args(parser: argparse.ArgumentParser, name: str = "target") -> None:
    parser.add_argument(name, help="an inventory file, or a run id")
    parser.add_argument(
        "-i",
        "--inventory",
        help="inventory whose hosts hold the run (when the run id is not known here)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdeploy",
        description="Deploy, watch and tear down distributed TensorFlow jobs on many hosts.",
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show Python tracebacks (for debugging tfdeploy)"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    plan = verbs.add_parser("plan", help="show every task, its address, GPUs and TF_CONFIG")
    plan.add_argument("inventory", help="inventory TOML file")
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    plan.set_defaults(handler=_cmd_plan)

    up = verbs.add_parser(
        "up", help="preflight, push, start and watch the job; tear down at the end"
    )
    up.add_argument("inventory", help="inventory TOML file")
    up.add_argument("--detach", action="store_true", help="return once every task runs")
    up.add_argument("--concurrency", type=int, default=32, help="hosts handled at once (32)")
    up.set_defaults(handler=_cmd_up)

    down = verbs.add_parser("down", help="stop a run (or every run of the inventory's job)")
    _target_args(down)
    down.set_defaults(handler=_cmd_down)

    status = verbs.add_parser("status", help="tasks and states of runs, read from the hosts")
    _target_args(status)
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.set_defaults(handler=_cmd_status)

    logs = verbs.add_parser("logs", help="print (or follow) the logs of a run")
    _target_args(logs, "run_id")
    logs.add_argument("--task", help="only this task, e.g. worker:1")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep following until the run ends"
    )
    logs.add_argument("--tail", type=int, help="only the last N lines of each task")
    logs.set_defaults(handler=_cmd_logs)

    exec_ = verbs.add_parser("exec", help="run a shell command on every host, output prefixed")
    exec_.add_argument("inventory", help="inventory TOML file")
    exec_.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    exec_.add_argument("--concurrency", type=int, default=32, help="hosts handled at once (32)")
    exec_.set_defaults(handler=_cmd_exec)
    return parser


Handler = Callable[[argparse.Namespace, Env], int]


def run(argv: Sequence[str], env: Env) -> int:
    """Runs one command; the only place where exceptions become messages and exit codes."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its usage message
        return ExitStatus.OK if exc.code == 0 else ExitStatus.USAGE
    handler: Handler = args.handler
    try:
        return handler(args, env)
    except TfdeployError as exc:
        if args.traceback:
            raise
        env.err.print(Text.assemble(("error: ", "bold red"), exc.message))
        if exc.hint:
            env.err.print(Text.assemble(("hint: ", "yellow"), exc.hint))
        return exc.exit_status
    except KeyboardInterrupt as exc:
        env.err.print("interrupted", style="yellow")
        return 128 + int(getattr(exc, "signum", 2))
    except Exception:  # an unexpected failure is a tfdeploy bug: say so, keep the detail short
        if args.traceback:
            raise
        last = traceback.format_exc().strip().splitlines()[-1]
        env.err.print(Text.assemble(("internal error: ", "bold red"), last))
        env.err.print(Text("hint: run again with --traceback and report it"))
        return ExitStatus.JOB_FAILED


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def main(argv: Sequence[str] | None = None) -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_terminated)  # teardown as with Ctrl-C, exit 128 + signum
    env = Env(out=Console(), err=Console(stderr=True), raw_out=sys.stdout)
    code = run(list(sys.argv[1:] if argv is None else argv), env)
    sys.exit(int(code))
