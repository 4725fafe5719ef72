"""Turns a task's raw log bytes into clean display lines, whatever progress bars wrote.

Keras progress bars redraw with carriage returns and backspaces; printed as-is they garble a
shared terminal. Each line keeps only its final state, and escape sequences are dropped.
"""

from __future__ import annotations

import codecs
import re

# CSI sequences (colours, cursor moves); OSC/DCS/APC/PM/SOS strings (a terminal title, a
# hyperlink, OSC 52's clipboard) up to their BEL or ST terminator, whole; then any other
# two-byte escape. Each also in its one-character C1 form (U+009B CSI, U+009D OSC, U+0090 DCS,
# U+009C ST...), which a UTF-8 terminal (xterm, VTE) obeys as it does the ESC form.
_ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-9;?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c|$)"
    r"|\x1b[@-_]"
)
# C0 controls but tab (a line has no newline), DEL and the C1 controls U+0080-U+009F.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_LINE = 4000  # a runaway line without newlines is cut, not buffered forever
# _CONTROL's characters as bytes: in UTF-8 no byte of a longer character is below 0x80, so the
# raw bytes tell whether a chunk has any (bytes.translate runs at memcpy speed; the regex's
# search took a third of `logs` on a 100 MB log).
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F])
# A C1 control in UTF-8 is 0xC2 then 0x80-0x9F; 0xC2 alone is common (°, ±, NBSP), so the
# search runs only where one is.
_C1_UTF8 = re.compile(rb"\xc2[\x80-\x9f]")


def _controls_in(data: bytes) -> bool:
    if len(data.translate(None, _CONTROL_BYTES)) != len(data):
        return True
    return b"\xc2" in data and _C1_UTF8.search(data) is not None


def clean(line: str) -> str:
    """The text a terminal would finally show for one line."""
    if line.isprintable():  # most lines: no escape, no \r, \b, C0 or C1 control (C speed)
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
        # A character split across chunks (0xC2 | 0x9D): its first byte is in the decoder, so
        # `data` alone cannot tell; the few such chunks take the full path.
        split = bool(self._decoder.getstate()[0])
        text = partial + self._decoder.decode(data)
        *complete, self._partial = text.split("\n")
        if len(self._partial) > MAX_LINE:
            complete.append(self._partial)
            self._partial = ""
        if not split and not _controls_in(data) and _CONTROL.search(partial) is None:
            return [line.rstrip() for line in complete]  # all clean() would do to them
        return [clean(line) for line in complete]

    def flush(self) -> list[str]:
        """The unterminated last line, once the task has ended."""
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [clean(rest)] if rest.strip() else []
