"""The `tfdeploy` command line: parses arguments, runs one verb, and renders every error once."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.text import Text

from deployer.errors import ExitStatus, TfdeployError
from deployer.inventory import load_inventory
from deployer.plan import make_plan
from deployer.render import plan_json, plan_table


@dataclass(frozen=True)
class Env:
    """Where the CLI writes; injected so tests run it in-process and read what a user would see."""

    out: Console
    err: Console
    raw_out: TextIO


def _cmd_plan(args: argparse.Namespace, env: Env) -> int:
    plan = make_plan(load_inventory(args.inventory))
    if args.json:
        env.raw_out.write(plan_json(plan) + "\n")
    else:
        env.out.print(plan_table(plan))
    return ExitStatus.OK


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
    except KeyboardInterrupt:
        env.err.print("interrupted", style="yellow")
        return ExitStatus.INTERRUPTED
    except Exception:  # an unexpected failure is a tfdeploy bug: say so, keep the detail short
        if args.traceback:
            raise
        last = traceback.format_exc().strip().splitlines()[-1]
        env.err.print(Text.assemble(("internal error: ", "bold red"), last))
        env.err.print(Text("hint: run again with --traceback and report it"))
        return ExitStatus.JOB_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    env = Env(out=Console(), err=Console(stderr=True), raw_out=sys.stdout)
    code = run(list(sys.argv[1:] if argv is None else argv), env)
    sys.exit(int(code))
