"""The `tfdeploy` command line: parses arguments, runs one verb, and renders every error once.

Output to a pipe or file is never wrapped (a TF_CONFIG or a `tfdeploy logs RUN` hint stays one
line for grep and copy); when the pipe's reader goes away (`| head`), tfdeploy exits 141
(128 + SIGPIPE, as a shell reports tools killed by SIGPIPE) without a message, after `up` has
torn down what it started.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import functools
import importlib.metadata
import os
import re
import select
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.text import Text

from deployer.cli.render import plan_json, plan_table, status_json, status_table
from deployer.config.inventory import Inventory, discover_hosts
from deployer.config.plan import make_plan
from deployer.config.sources import ANY_TIME, AT_DOWN, AT_JOB_END
from deployer.core.errors import (
    ExitStatus,
    HostError,
    HostsFailed,
    Terminated,
    TfdeployError,
    UsageError,
)
from deployer.core.secrets import mask_text
from deployer.core.text import plural
from deployer.hosts.agent import escaped_text
from deployer.hosts.fleet import Fleet
from deployer.results.archive import LogArchive, archive_ended, has_archive
from deployer.results.pull import pull
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

UNWRAPPED = 1 << 20  # a console width no line reaches: output to pipes is never wrapped


@dataclass(frozen=True)
class Env:
    """Where the CLI writes; injected so tests run it in-process and read what a user would see."""

    out: Console
    err: Console
    raw_out: TextIO


def _inventory(path: str) -> Inventory:
    """Loads (pure), then discovers the host sources' hosts: the one place the CLI does that I/O."""
    return discover_hosts(load_inventory(path))


def _with_discovered_hosts(target: Target) -> Target:
    return dataclasses.replace(target, inventory=discover_hosts(target.inventory))


def _cmd_plan(args: argparse.Namespace, env: Env) -> int:
    plan = make_plan(discover_hosts(load_inventory(args.inventory), preview=True))
    if args.json:
        env.raw_out.write(plan_json(plan) + "\n")
    else:
        env.out.print(plan_table(plan))
    return ExitStatus.OK


def _cmd_up(args: argparse.Namespace, env: Env) -> int:
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


def _cmd_check(args: argparse.Namespace, env: Env) -> int:
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


def _cmd_down(args: argparse.Namespace, env: Env) -> int:
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


def _cmd_status(args: argparse.Namespace, env: Env) -> int:
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


def _cmd_logs(args: argparse.Namespace, env: Env) -> int:
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


def _cmd_pull(args: argparse.Namespace, env: Env) -> int:
    target = _with_discovered_hosts(resolve(args.run_id, args.inventory))
    if target.run_id is None:
        raise UsageError("pull needs a run id (see `tfdeploy status INVENTORY`)")
    with Fleet(target.inventory.hosts, concurrency=args.concurrency) as fleet:
        result = pull(fleet, target.run_id, args.paths, Path(args.to), tasks=args.task)
    view = PlainView(env.raw_out)
    for refusal in result.refused:
        view.step(f"not pulled: {refusal}")
    view.step(result.summary())
    return ExitStatus.OK


def _cmd_tunnel(args: argparse.Namespace, env: Env) -> int:
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


def _target_args(parser: argparse.ArgumentParser, name: str = "target", what: str = "") -> None:
    parser.add_argument(name, help=what or "an inventory file, or a run id")
    parser.add_argument(
        "-i",
        "--inventory",
        help="inventory whose hosts hold the run (when the run id is not known here)",
    )


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (a usage error otherwise, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    parse.__name__ = "count"  # argparse names the type in its messages
    return parse


def _port(text: str) -> int:
    """An argparse type: a TCP port number (a usage error otherwise, exit 2)."""
    port = _count(1)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1-65535)")
    return port


def _netcheck_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-netcheck",
        action="store_true",
        help="skip trying the TF connections between hosts (or job.netcheck = false)",
    )


def _concurrency_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=_count(1), default=32, help="hosts at once (32)")


TASK_NAME = re.compile(r"[a-z_]+:\d+")


def _task_name(text: str) -> str:
    if not TASK_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected ROLE:INDEX such as worker:1, got {text!r}")
    return text


def _version() -> str:
    try:
        return importlib.metadata.version("tfdeploy")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (not installed)"


@functools.cache  # building it costs ~14 ms (argparse's gettext lookups); parsing reuses it
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdeploy",
        description="Deploy, watch and tear down distributed TensorFlow jobs on many hosts.",
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show Python tracebacks (for debugging tfdeploy)"
    )
    parser.add_argument("--version", action="version", version=f"tfdeploy {_version()}")
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
    _netcheck_arg(up)
    _concurrency_arg(up)
    up.set_defaults(handler=_cmd_up)

    check = verbs.add_parser(
        "check", help="preflight only: every host, every check of up, every TF connection"
    )
    check.add_argument("inventory", help="inventory TOML file")
    _netcheck_arg(check)
    _concurrency_arg(check)
    check.set_defaults(handler=_cmd_check)

    down = verbs.add_parser("down", help="stop a run (or every run of the inventory's job)")
    _target_args(down)
    down.add_argument(
        "--terminate",
        action="store_true",
        help="then terminate the EC2 instances tfdeploy launched for the job ([aws] launch)",
    )
    down.set_defaults(handler=_cmd_down)

    status = verbs.add_parser("status", help="tasks and states of runs, read from the hosts")
    _target_args(status)
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.set_defaults(handler=_cmd_status)

    logs = verbs.add_parser("logs", help="print (or follow) the logs of a run")
    _target_args(logs, "run_id", "a run id (see `tfdeploy status INVENTORY`)")
    logs.add_argument("--task", type=_task_name, help="only this task, e.g. worker:1")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep following until the run ends"
    )
    logs.add_argument(
        "--tail", type=_count(0), help="only the last N lines of each task (0: only new ones)"
    )
    logs.add_argument(
        "--sync",
        action="store_true",
        help="copy what the hosts wrote since into the local archive, then print it",
    )
    logs.set_defaults(handler=_cmd_logs)

    pull_ = verbs.add_parser(
        "pull", help="copy files of a run's tasks home (only what is not here already)"
    )
    _target_args(pull_, "run_id", "a run id (see `tfdeploy status INVENTORY`)")
    pull_.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="globs relative to each task's directory, or absolute",
    )
    pull_.add_argument(
        "--task", action="append", type=_task_name, help="only this task (repeatable), e.g. chief:0"
    )
    pull_.add_argument(
        "--to",
        default="tfdeploy-runs",
        help="into DIR/RUN_ID/ROLE-INDEX/ (default: ./tfdeploy-runs)",
    )
    _concurrency_arg(pull_)
    pull_.set_defaults(handler=_cmd_pull)

    tunnel = verbs.add_parser(
        "tunnel", help="forward a local port to a port on a task's host, over SSH"
    )
    _target_args(tunnel, "run_id", "a run id (see `tfdeploy status INVENTORY`)")
    tunnel.add_argument("remote_port", type=_port, metavar="REMOTE_PORT")
    tunnel.add_argument("local_port", type=_port, nargs="?", metavar="LOCAL_PORT")
    tunnel.add_argument("--task", type=_task_name, help="the task whose host (default: chief:0)")
    tunnel.set_defaults(handler=_cmd_tunnel)

    exec_ = verbs.add_parser("exec", help="run a shell command on every host, output prefixed")
    exec_.add_argument("inventory", help="inventory TOML file")
    exec_.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    _concurrency_arg(exec_)
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
        if args.traceback:  # for debugging; the exit status stays the error's own
            env.err.print(Text(traceback.format_exc().rstrip()))
        env.err.print(Text.assemble(("error: ", "bold red"), exc.message))
        if exc.hint:
            env.err.print(Text.assemble(("hint: ", "yellow"), exc.hint))
        return exc.exit_status
    except KeyboardInterrupt as exc:
        env.err.print("interrupted", style="yellow")
        return 128 + int(getattr(exc, "signum", 2))
    except BrokenPipeError:
        if _reader_gone(env.raw_out):  # `| head`: the reader has what it wanted
            return ExitStatus.BROKEN_PIPE
        return _internal_error(args, env)
    except Exception:
        return _internal_error(args, env)


def _internal_error(args: argparse.Namespace, env: Env) -> int:
    """An unexpected failure is a tfdeploy bug: say so, keep the detail short."""
    if args.traceback:
        raise  # called from an except block: re-raises the exception it handles
    last = traceback.format_exc().strip().splitlines()[-1]
    env.err.print(Text.assemble(("internal error: ", "bold red"), last))
    env.err.print(Text("hint: run again with --traceback and report it"))
    return ExitStatus.JOB_FAILED


def _reader_gone(out: TextIO) -> bool:
    """Whether `out` is a pipe (or terminal) whose other end has closed: a BrokenPipeError from
    anything else (a local agent's stdin) is a real failure, not a reader that had enough."""
    try:
        fd = out.fileno()
    except (OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


class _Console(Console):
    """A rich Console whose broken pipe reaches run() like any other write's, instead of
    rich's own exit(1) from deep inside a print (which would skip `up`'s teardown)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # what teardown still prints goes nowhere
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def console_for(file: TextIO) -> Console:
    """rich's layout at the terminal's width; for a pipe or file, lines that never wrap."""
    console = _Console(file=file)
    if console.is_terminal:
        return console
    return _Console(file=file, soft_wrap=True, width=UNWRAPPED)


def main(argv: Sequence[str] | None = None) -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_terminated)  # teardown as with Ctrl-C, exit 128 + signum
    env = Env(out=console_for(sys.stdout), err=console_for(sys.stderr), raw_out=sys.stdout)
    try:
        code = run(list(sys.argv[1:] if argv is None else argv), env)
        # Flushed here, not at exit: a reader gone before a small output's only write would
        # otherwise fail the interpreter's final flush (exit 120, "Exception ignored ...").
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # stdout's or stderr's reader went away
        code = ExitStatus.BROKEN_PIPE
    if code == ExitStatus.BROKEN_PIPE:
        # What is still buffered for the closed pipe would fail again at exit, with a message.
        null = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(null, stream.fileno())
    sys.exit(int(code))
