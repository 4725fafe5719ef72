"""The `tfdeploy` command line: parses arguments, runs one verb, and renders every error once.

Output to a pipe or file is never wrapped (a TF_CONFIG or a `tfdeploy logs RUN` hint stays one
line for grep and copy); when the pipe's reader goes away (`| head`), tfdeploy exits 141
(128 + SIGPIPE, as a shell reports tools killed by SIGPIPE) without a message, after `up` has
torn down what it started. Any other output failure (a terminal gone, a full disk, `>&-`)
drops the output and lets the work go on (streams.py).
"""

from __future__ import annotations

import argparse
import gc
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TextIO

from rich.text import Text

from deployer.cli.console import Env, console_for
from deployer.cli.parser import build_parser
from deployer.cli.streams import guard_std_streams
from deployer.core.errors import (
    ExitStatus,
    Terminated,
    TfdeployError,
)
from deployer.core.lines import clean_text


def run(argv: Sequence[str], env: Env) -> int:
    """Runs one command; the only place where exceptions become messages and exit codes."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its usage message
        return ExitStatus.OK if exc.code == 0 else ExitStatus.USAGE
    handler: Callable[[argparse.Namespace, Env], int] = args.handler
    try:
        return handler(args, env)
    except TfdeployError as exc:
        if args.traceback:  # for debugging; the exit status stays the error's own
            env.err.print(Text(traceback.format_exc().rstrip()))
        # A message may quote what a host said: the output filter makes it text, never control.
        env.err.print(Text.assemble(("error: ", "bold red"), clean_text(exc.message)))
        # One `hint:` per line (per host, HostsFailed).
        for hint in clean_text(exc.hint or "").splitlines():
            env.err.print(Text.assemble(("hint: ", "yellow"), hint))
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
    env.err.print(Text.assemble(("internal error: ", "bold red"), clean_text(last)))
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


def _fewer_collections() -> None:
    """The cyclic garbage collector, run less often in this process (not in a program using
    the API). Every SSH round allocates thousands of short-lived containers, so the default
    threshold of 700 ran a collection every few hosts, and the longer a fleet the larger each
    full one: ~0.3 ms of controller CPU per host for `up` at 128 hosts (gc.callbacks timed).
    What the imports made is frozen out of every collection; cycles are still freed."""
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


def main(argv: Sequence[str] | None = None) -> int:
    _fewer_collections()
    guard_std_streams()  # a terminal gone, a full disk or `>&-` never stops a teardown
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
