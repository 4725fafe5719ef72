"""Turns a task's raw log bytes into clean display lines, whatever progress bars wrote.

Keras progress bars redraw with carriage returns and backspaces; printed as-is they garble a
shared terminal. Each line keeps only its final state, and escape sequences are dropped.
"""

from __future__ import annotations

import codecs
import re

# CSI sequences (colours, cursor moves); OSC/DCS/APC/PM/SOS strings (a terminal title, a
# hyperlink) up to their BEL or ST terminator, whole; then any other two-byte escape.
_ANSI = re.compile(
    r"\x1b\[[0-9;?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\|$)"
    r"|\x1b[@-_]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
MAX_LINE = 4000  # a runaway line without newlines is cut, not buffered forever
# _CONTROL's characters as bytes: in UTF-8 no byte of a longer character is below 0x80, so the
# raw bytes tell whether a chunk has any (bytes.translate runs at memcpy speed; the regex's
# search took a third of `logs` on a 100 MB log).
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F])


def _controls_in(data: bytes) -> bool:
    return len(data.translate(None, _CONTROL_BYTES)) != len(data)


def clean(line: str) -> str:
    """The text a terminal would finally show for one line."""
    if line.isprintable():  # most lines: no escape, no \r or \b, no control (C-speed check)
        return line.rstrip()
    line = _ANSI.sub("", line)
    if "\r" in line:
        parts = [p for p in line.split("\r") if p]
        line = parts[-1] if parts else ""
    if "\b" in line:
        out: list[str] = []
        for ch in line:
            if ch == "\b":
                if out:
                    out.pop()
            else:
                out.append(ch)
        line = "".join(out)
    return _CONTROL.sub("", line).rstrip()


class LineAssembler:
    """Feeds bytes in any chunking; yields each complete line once (UTF-8 split safely)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> list[str]:
        partial = self._partial  # the start of the first line, from an earlier chunk
        text = partial + self._decoder.decode(data)
        *complete, self._partial = text.split("\n")
        if len(self._partial) > MAX_LINE:
            complete.append(self._partial)
            self._partial = ""
        if not _controls_in(data) and _CONTROL.search(partial) is None:
            return [line.rstrip() for line in complete]  # all clean() would do to them
        return [clean(line) for line in complete]

    def flush(self) -> list[str]:
        """The unterminated last line, once the task has ended."""
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [clean(rest)] if rest.strip() else []
