"""The argument parser: verbs, their options, and the argument types that make mistakes exit 2."""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from deployer.cli import verbs


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


MAX_TAIL = 10**9  # lines: more than any log holds (the archive keeps at most 128 MiB a task)


def _tail(text: str) -> int:
    """An argparse type for --tail: 0 or more lines; a number beyond any log means all of it
    (capped, so no deque or window size ever overflows)."""
    return min(_count(0)(text), MAX_TAIL)


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
    parser.add_argument(
        "--netcheck",
        choices=["auto", "full", "sampled"],  # the API's netcheck= words (docs/api.md)
        help="which TF connections to try: every one (full), a sample (sampled), or auto: every "
        "one up to 32 hosts (or job.netcheck)",
    )


def _refresh_env_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--refresh-env",
        action="store_true",
        help="resolve the job's environment (requirements) afresh instead of from the cache",
    )


def _concurrency_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=_count(1), default=32, help="hosts at once (32)")


def _raw_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--raw",
        action="store_true",
        help=f"{what}: escape sequences and control characters included (by default they are "
        "dropped and invisible characters marked: a host's output never drives your terminal)",
    )


TASK_NAME = re.compile(r"[a-z_]+:\d+")


def _task_name(text: str) -> str:
    if not TASK_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected ROLE:INDEX such as worker:1, got {text!r}")
    return text


# pyproject's [project] name: on PyPI `tfdeploy` is an unrelated project, whose version a
# machine that has it installed would report as ours.
DISTRIBUTION = "tfdeploy-cluster"


def _version() -> str:
    import importlib.metadata  # here: its imports and lookup were ~15 ms of every command

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (not installed)"


class _Version(argparse.Action):
    """argparse's "version" action, with the version looked up only when --version is given."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(f"tfdeploy {_version()}")  # on stdout, as argparse's own action prints it
        parser.exit()


@functools.cache  # building it costs ~14 ms (argparse's gettext lookups); parsing reuses it
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdeploy",
        description="Deploy, watch and tear down distributed TensorFlow jobs on many hosts.",
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show Python tracebacks (for debugging tfdeploy)"
    )
    parser.add_argument("--version", action=_Version, help="show tfdeploy's version and exit")
    subparsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    plan = subparsers.add_parser("plan", help="show every task, its address, GPUs and TF_CONFIG")
    plan.add_argument("inventory", help="inventory TOML file")
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    plan.set_defaults(handler=verbs.plan_verb)

    up = subparsers.add_parser(
        "up", help="preflight, push, start and watch the job; tear down at the end"
    )
    up.add_argument("inventory", help="inventory TOML file")
    up.add_argument("--detach", action="store_true", help="return once every task runs")
    up.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue that run, which ended early, under its own id: every task starts again "
        "in its folder of the run with the next TFDEPLOY_ATTEMPT",
    )
    _netcheck_arg(up)
    _refresh_env_arg(up)
    _concurrency_arg(up)
    up.set_defaults(handler=verbs.up_verb)

    check = subparsers.add_parser(
        "check", help="preflight only: every host, every check of up, every TF connection"
    )
    check.add_argument("inventory", help="inventory TOML file")
    _netcheck_arg(check)
    _refresh_env_arg(check)
    _concurrency_arg(check)
    check.set_defaults(handler=verbs.check_verb)

    down = subparsers.add_parser("down", help="stop a run (or every run of the inventory's job)")
    _target_args(down)
    down.add_argument(
        "--terminate",
        action="store_true",
        help="then terminate the EC2 instances tfdeploy launched for the job ([aws] launch)",
    )
    down.add_argument(
        "--no-artifacts",
        action="store_true",
        help="do not pull a detached run's job.artifacts after stopping it",
    )
    down.add_argument(
        "--artifacts-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="cut that pull after SECONDS, keeping what arrived (default: 600)",
    )
    down.set_defaults(handler=verbs.down_verb)

    status = subparsers.add_parser("status", help="tasks and states of runs, read from the hosts")
    _target_args(status)
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.add_argument(
        "--all",
        action="store_true",
        help="one row per task however many there are, ended runs' tasks too (by default a "
        "terminal's table is folded to fit the screen: counts, the tasks worth a look, and a "
        "line for the rest; and a run that has ended is one line)",
    )
    status.set_defaults(handler=verbs.status_verb)

    runs = subparsers.add_parser(
        "runs", help="every run this machine started or saw, newest first, with its outcome"
    )
    runs.add_argument("--json", action="store_true", help="print one JSON document")
    runs.add_argument("--job", help="only runs of this job")
    runs.add_argument(
        "--state",
        choices=("succeeded", "failed", "stopped", "running", "unknown"),
        help="only runs in this state",
    )
    runs.add_argument(
        "-i", "--inventory", help="also ask this inventory's hosts how its runs stand now"
    )
    runs.set_defaults(handler=verbs.runs_verb)

    report = subparsers.add_parser(
        "report", help="write a run's self-contained HTML report (facts, curves, timeline)"
    )
    report.add_argument("run_id", help="a run id (`tfdeploy runs` lists them)")
    report.add_argument(
        "-o", "--output", help="where to write the page (default: beside the run's archive)"
    )
    report.set_defaults(handler=verbs.report_verb)

    attach = subparsers.add_parser(
        "attach", help="the live view of a running run, until it ends (leaving it leaves the run)"
    )
    _target_args(
        attach,
        "run_id",
        "a run id, or an inventory file: its job's newest run on the hosts, said on stderr",
    )
    attach.set_defaults(handler=verbs.attach_verb)

    logs = subparsers.add_parser("logs", help="print (or follow) the logs of a run")
    _target_args(
        logs,
        "run_id",
        "a run id, or an inventory file: its job's newest run on the hosts, said on stderr",
    )
    logs.add_argument("--task", type=_task_name, help="only this task, e.g. worker:1")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep following until the run ends"
    )
    logs.add_argument(
        "--tail", type=_tail, help="only the last N lines of each task (0: only new ones)"
    )
    logs.add_argument(
        "--sync",
        action="store_true",
        help="copy what the hosts wrote since into the local archive, then print it",
    )
    _raw_arg(logs, "the lines as the tasks wrote them")
    logs.set_defaults(handler=verbs.logs_verb)

    pull_ = subparsers.add_parser(
        "pull", help="copy files of a run's tasks home (only what is not here already)"
    )
    _target_args(
        pull_,
        "run_id",
        "a run id, or an inventory file: its job's newest run on the hosts, said on stderr",
    )
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
        help="into DIR/RUN_ID/ROLE-INDEX/, absolute paths into ROLE-INDEX.abs/ "
        "(default: ./tfdeploy-runs)",
    )
    _concurrency_arg(pull_)
    pull_.set_defaults(handler=verbs.pull_verb)

    profile = subparsers.add_parser(
        "profile",
        help="trace every TensorFlow task of a running run at once and bring the traces home",
    )
    _target_args(
        profile,
        "run_id",
        "a run id, or an inventory file: its job's newest run on the hosts, said on stderr",
    )
    profile.add_argument(
        "--seconds", type=float, default=3.0, help="how long each trace lasts (default: 3)"
    )
    profile.add_argument(
        "--task",
        action="append",
        type=_task_name,
        help="only this task (repeatable), e.g. worker:0",
    )
    profile.add_argument(
        "--to",
        default="tfdeploy-runs",
        help="into DIR/RUN_ID/profile/STAMP/ROLE-INDEX/ (default: ./tfdeploy-runs)",
    )
    _concurrency_arg(profile)
    profile.set_defaults(handler=verbs.profile_verb)

    board = subparsers.add_parser(
        "tensorboard",
        help="a TensorBoard here over what a run wrote: its events (pulled as it runs), profiles",
    )
    _target_args(
        board,
        "run_id",
        "a run id, or an inventory file: its job's newest run on the hosts, said on stderr",
    )
    board.add_argument(
        "--port", type=int, default=6006, help="its port on 127.0.0.1 (default: 6006; 0: any free)"
    )
    board.add_argument(
        "--to",
        default="tfdeploy-runs",
        help="the run's folder is DIR/RUN_ID/, as for pull and profile (default: ./tfdeploy-runs)",
    )
    board.set_defaults(handler=verbs.tensorboard_verb)

    tunnel = subparsers.add_parser(
        "tunnel", help="forward a local port to a port on a task's host, over SSH"
    )
    _target_args(tunnel, "run_id", "a run id (see `tfdeploy status INVENTORY`)")
    tunnel.add_argument("remote_port", type=_port, metavar="REMOTE_PORT")
    tunnel.add_argument("local_port", type=_port, nargs="?", metavar="LOCAL_PORT")
    tunnel.add_argument(
        "--task", type=_task_name, help="the task whose host (default: chief:0, else worker:0)"
    )
    tunnel.set_defaults(handler=verbs.tunnel_verb)

    prune = subparsers.add_parser(
        "prune", help="free the hosts of old runs, and of the contents and environments no run uses"
    )
    prune.add_argument("inventory", nargs="?", help="inventory TOML file (not with --local)")
    prune.add_argument(
        "--local",
        action="store_true",
        help="free this machine's caches instead (resolved environments, saved images) of what "
        "no recent run uses",
    )
    prune.add_argument(
        "--keep", type=_count(0), default=3, help="runs of each job kept on each host (3)"
    )
    prune.add_argument(
        "--older-than",
        metavar="DATE|AGE",
        help="only runs created before a date (2025-03-01) or an age ago (30m, 12h, 7d, 2w)",
    )
    prune.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    prune.add_argument(
        "--grace",
        metavar="AGE",
        help="what changed more recently stays: contents stored or linked, environments used "
        "(an up may be starting with them); 0 when no up runs on these hosts (default: 1h)",
    )
    _concurrency_arg(prune)
    prune.set_defaults(handler=verbs.prune_verb)

    exec_ = subparsers.add_parser("exec", help="run a shell command on every host, output prefixed")
    exec_.add_argument("inventory", help="inventory TOML file")
    _raw_arg(exec_, "each host's output as it wrote it, unprefixed")
    exec_.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    _concurrency_arg(exec_)
    exec_.set_defaults(handler=verbs.exec_verb)
    return parser
