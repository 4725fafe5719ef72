"""stdout and stderr that cannot stop a teardown: what they cannot take is dropped, once said.

`up`'s output is a view of the job, not the job. A terminal that goes away (a window closed, an
SSH session to this machine dropped, a tmux pane killed) fails every write with EIO; a stdout
on a full disk (`>/dev/full`, a log file) fails with ENOSPC; a closed stdout (`>&-`) has no
stream at all. None of these may end a job or skip the stop of what it started, so a failed
write marks the stream gone: /dev/null takes its file descriptor (every later write, from any
thread or from the interpreter's exit, goes nowhere), and stderr says it once. A pipe whose
reader left (`| head`) is the one exception: BrokenPipeError still reaches the CLI, which tears
down and exits 141, as documented there.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable
from typing import TextIO, cast


class GuardedStream(io.TextIOBase):
    """A text stream over `inner` whose write failures (other than a broken pipe) are dropped:
    the first one calls `on_gone(why)` and points the descriptor at /dev/null."""

    def __init__(self, inner: TextIO, on_gone: Callable[[str], None]) -> None:
        super().__init__()
        self.inner = inner
        self._on_gone = on_gone
        self.gone = False

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only in io's C base too
        return getattr(self.inner, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return not self.gone and self._safely(self.inner.isatty, False)

    def fileno(self) -> int:
        return self.inner.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.gone:
            self._guard(lambda: self.inner.write(text))
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            self._guard(self.inner.flush)

    def _guard(self, call: Callable[[], object]) -> None:
        try:
            call()
        except BrokenPipeError:
            raise  # the reader had enough (`| head`): the CLI's own case
        except (OSError, ValueError) as exc:  # EIO, ENOSPC, EBADF; ValueError: a closed file
            self._go(exc)

    def _go(self, exc: Exception) -> None:
        self.gone = True
        where = _target(self.inner)
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.inner.fileno())
            os.close(null)
            self.inner.flush()  # what it still buffered now goes nowhere, not at exit
        self._on_gone(f"{where}: {getattr(exc, 'strerror', None) or exc}")

    @staticmethod
    def _safely(call: Callable[[], bool], default: bool) -> bool:
        try:
            return call()
        except (OSError, ValueError):
            return default


def _target(stream: TextIO) -> str:
    """'stdout (/dev/full)': the stream, and the file behind it where the system says."""
    name = {1: "stdout", 2: "stderr"}.get(_fd(stream), getattr(stream, "name", "output"))
    with contextlib.suppress(OSError):
        return f"{name} ({os.readlink(f'/proc/self/fd/{_fd(stream)}')})"
    return str(name)


def _fd(stream: TextIO) -> int:
    try:
        return stream.fileno()
    except (OSError, ValueError):
        return -1


def _hold(fd: int) -> None:
    """Descriptor `fd`, left closed by the shell (`>&-`), opened on /dev/null: no file or
    socket opened later can take its number and become this process's stdout by chance."""
    try:
        os.fstat(fd)
    except OSError:
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: `fd` when 0-2 are shut
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


def _stream(current: TextIO | None, fd: int) -> TextIO:
    if current is not None:
        return current
    return open(fd, "w", encoding="utf-8", errors="replace", closefd=False)


def guard_std_streams() -> None:
    """sys.stdout and sys.stderr as GuardedStreams; a closed one is reopened on /dev/null first
    (tfdeploy then runs as with `>/dev/null`). stdout gone is said once, on stderr."""
    for fd in (0, 1, 2):
        _hold(fd)
    if sys.stdin is None:
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    err = GuardedStream(_stream(sys.stderr, 2), lambda why: None)

    def stdout_gone(why: str) -> None:
        with contextlib.suppress(BrokenPipeError):
            err.write(f"tfdeploy: warning: cannot write to {why}; its output is dropped, ")
            err.write("the work goes on\n")
            err.flush()

    sys.stdout = cast(TextIO, GuardedStream(_stream(sys.stdout, 1), stdout_gone))
    sys.stderr = cast(TextIO, err)
