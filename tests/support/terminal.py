"""A small terminal for tests: what a screen of ROWS x COLUMNS shows of what rich wrote.

It knows what rich's Live writes (text, CR, LF, erase line, cursor up/down/column, colours,
cursor show/hide, a window title) and records what a person would have seen: the scrollback,
the screen, and every frame of the live region as it stood when rich erased it to redraw it
(rich erases a frame bottom-up: CR, erase line, then cursor up and erase line per line).

A frame taller than the screen cannot be erased: its cursor-up runs into the top row. That is
counted (`overruns`), so a test of "the live view fits the terminal" can fail.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

from rich.console import Console

TOKEN = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|[\r\n\x07\x08]")


class Screen:
    def __init__(self, rows: int, columns: int) -> None:
        self.rows, self.columns = rows, columns
        self.screen: list[list[str]] = [[] for _ in range(rows)]
        self.history: list[str] = []  # lines scrolled off the top, oldest first
        self.row = self.col = 0
        self.frames: list[list[str]] = []  # live regions as erased, top line first
        self.overruns = 0  # cursor-ups past the top row: a frame taller than the screen
        self._erased: list[str] | None = None  # the frame being erased, bottom line first
        self._after_cr_or_up = False

    # -- what a person sees ------------------------------------------------------------------

    def line(self, row: int) -> str:
        return "".join(self.screen[row]).rstrip()

    def display(self) -> list[str]:
        return [self.line(r) for r in range(self.rows)]

    def text(self) -> list[str]:
        """Scrollback and screen, with the screen's empty bottom lines left out."""
        shown = self.display()
        while shown and not shown[-1]:
            shown.pop()
        return [*self.history, *shown]

    # -- what the program wrote --------------------------------------------------------------

    def feed(self, data: str) -> None:
        at = 0
        for match in TOKEN.finditer(data):
            self._print(data[at : match.start()])
            self._control(match)
            at = match.end()
        self._print(data[at:])

    def _control(self, match: re.Match[str]) -> None:
        token = match.group(0)
        erasing = self._after_cr_or_up
        self._after_cr_or_up = False
        if token == "\r":
            self.col = 0
            self._after_cr_or_up = True
            return
        if token == "\n":  # a tty's onlcr: LF is CR LF
            self._end_frame()
            self.col = 0
            self._down()
            return
        if token in ("\x07", "\x08") or token.startswith("\x1b]"):
            return
        params, command = match.group(1), match.group(2)
        count = int(params) if params.isdigit() else 1
        if command == "K" and params == "2":
            if erasing:
                if self._erased is None:
                    self._erased = []
                self._erased.append(self.line(self.row))
            self.screen[self.row] = []
            self._after_cr_or_up = erasing
            return
        if command == "A":
            if self.row - count < 0:
                self.overruns += 1
            self.row = max(0, self.row - count)
            self._after_cr_or_up = True
            return
        self._end_frame()
        if command == "B":
            self.row = min(self.rows - 1, self.row + count)
        elif command == "G":
            self.col = max(0, count - 1)
        # m (colours), h/l (cursor shown, hidden), others: nothing to draw

    def _print(self, text: str) -> None:
        if not text:
            return
        self._end_frame()
        self._after_cr_or_up = False
        for char in text:
            if self.col >= self.columns:  # autowrap
                self.col = 0
                self._down()
            line = self.screen[self.row]
            line.extend(" " * (self.col - len(line)))
            if self.col < len(line):
                line[self.col] = char
            else:
                line.append(char)
            self.col += 1

    def _down(self) -> None:
        if self.row == self.rows - 1:
            self.history.append(self.line(0))
            self.screen = [*self.screen[1:], []]
        else:
            self.row += 1

    def _end_frame(self) -> None:
        if self._erased is not None:
            self.frames.append(list(reversed(self._erased)))
            self._erased = None


def run_in_pty(
    argv: list[str], rows: int, columns: int, env: dict[str, str], timeout: float
) -> tuple[int, str]:
    """Runs `argv` with a real terminal of `rows` x `columns` as its stdin, stdout and stderr
    (as a person's shell would), and returns its exit status and everything it wrote.

    COLUMNS and LINES are taken out of `env`: the program must find its size on the terminal.
    Killed (and the test failed) after `timeout` seconds.
    """
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                process.kill()
                raise AssertionError(f"{argv} still ran after {timeout} s")
            ready, _, _ = select.select([master], [], [], min(left, 1.0))
            if not ready:
                continue
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        code = process.wait(timeout=30)
    return code, b"".join(chunks).decode("utf-8", "replace")


def terminal(width: int = 100, height: int = 25) -> Console:
    """A console that behaves as a real terminal would (cursor moves, Live redraws)."""
    return Console(
        file=io.StringIO(),
        width=width,
        height=height,
        force_terminal=True,
        _environ={"TERM": "xterm-256color"},
    )


def output(console: Console) -> str:
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def screen(console: Console) -> Screen:
    shown = Screen(console.height, console.width)
    shown.feed(output(console))
    return shown
