"""Where the CLI writes: the injected environment, and consoles that never wrap piped output.

Output to a pipe or file is never wrapped (a TF_CONFIG or a `tfdeploy logs RUN` hint stays one
line for grep and copy).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console

UNWRAPPED = 1 << 20  # a console width no line reaches: output to pipes is never wrapped


@dataclass(frozen=True)
class Env:
    """Where the CLI writes; injected so tests run it in-process and read what a user would see."""

    out: Console
    err: Console
    raw_out: TextIO


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
