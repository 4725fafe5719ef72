"""The one output filter: whatever a host wrote, as text that is safe to show.

Everything a host sends that reaches a person goes through here: task logs (live view, plain
lines, the archive read back), `exec` output, the texts of replies (deployer/hosts/replies.py)
and the messages and errors the CLI prints. A host is untrusted: its bytes must not drive the
terminal (escape sequences: colours, a title, OSC 52's clipboard write, clearing the screen)
nor hide or reorder what is shown (bidi overrides, zero-width characters, line separators).

Keras progress bars redraw with carriage returns and backspaces; printed as-is they garble a
shared terminal. Each line keeps only its final state, escape sequences and C0/C1 controls are
dropped, and each invisible or reordering character is replaced by MARKER, so a reader sees
that something was there. `RawLines` is the one way around it (`logs --raw`).
"""

from __future__ import annotations

import codecs
import re
from typing import Protocol

# CSI sequences (colours, cursor moves); OSC/DCS/APC/PM/SOS strings (a terminal title, a
# hyperlink, OSC 52's clipboard) up to their BEL or ST terminator, whole; then any other
# two-byte escape. Each also in its one-character C1 form (U+009B CSI, U+009D OSC, U+0090 DCS,
# U+009C ST...), which a UTF-8 terminal (xterm, VTE) obeys as it does the ESC form. In the log
# archive NUL stands for ESC and DEL for the BEL that may end a string (see `defang`).
_ANSI = re.compile(
    r"(?:[\x1b\x00]\[|\x9b)[0-9;?]*[ -/]*[@-~]"
    r"|(?:[\x1b\x00][\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x00\x7f\x9c]*"
    r"(?:\x07|[\x1b\x00]\\|\x7f|\x9c|$)"
    r"|[\x1b\x00][@-_]"
)
# C0 controls but tab (a line has no newline), DEL and the C1 controls U+0080-U+009F.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Characters a terminal shows as nothing, or that reorder what follows: the bidi embeddings,
# overrides and isolates (U+202A-202E, U+2066-2069) and marks (U+200E/200F, U+061C), the
# zero-width characters (U+200B-200D, U+2060, U+FEFF) and the line and paragraph separators
# (U+2028/2029). Each becomes MARKER: dropping them would hide that the text held them.
_INVISIBLE = re.compile("[\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff]")
_UNSAFE = re.compile(f"{_CONTROL.pattern}|{_INVISIBLE.pattern}")
MARKER = "\ufffd"  # the replacement character: visible, and what undecodable bytes become too
MAX_LINE = 4000  # a runaway line without newlines is cut, not buffered forever
# _CONTROL's characters as bytes: in UTF-8 no byte of a longer character is below 0x80, so the
# raw bytes tell whether a chunk has any (bytes.translate runs at memcpy speed; the regex's
# search took a third of `logs` on a 100 MB log).
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F])
# A C1 control in UTF-8 is 0xC2 then 0x80-0x9F, and _INVISIBLE's characters are 0xD8 0x9C,
# 0xEF 0xBB 0xBF or 0xE2 0x80/0x81 then one of a few. Those lead bytes alone are common (°, ±,
# NBSP, dashes, quotes, ellipses), so each search runs only where its lead is; one pattern per
# lead, as re finds a pattern's literal prefix at memchr speed but scans an alternation's
# branches byte by byte (4x slower on a log of dashes and quotes).
_MULTIBYTE_UTF8 = (  # (lead byte, pattern)
    (b"\xc2", re.compile(rb"\xc2[\x80-\x9f]")),
    (b"\xe2", re.compile(rb"\xe2(?:\x80[\x8b-\x8f\xa8-\xae]|\x81[\xa0\xa6-\xa9])")),
    (b"\xd8", re.compile(rb"\xd8\x9c")),
    (b"\xef", re.compile(rb"\xef\xbb\xbf")),
)


def _controls_in(data: bytes) -> bool:
    if len(data.translate(None, _CONTROL_BYTES)) != len(data):
        return True
    return any(lead in data and p.search(data) is not None for lead, p in _MULTIBYTE_UTF8)


# The log archive's form of a host's bytes (`defang`): the same length, so the archive keeps
# the host log's byte offsets, and no byte that drives a terminal that `cat`s the file. ESC
# becomes NUL and every other C0 control but tab, newline, \r and \b (a progress bar's, which
# only move the cursor on its line) DEL: terminals show either as nothing. A C1 control becomes
# NUL and its 7-bit form (U+009B CSI: NUL "["), an invisible character of three bytes U+FFFD,
# U+061C NUL "?". clean() reads NUL as the ESC it stood for and DEL as a string's end: `logs`
# shows an archived line as `up` showed it live.
_C0_SOURCES = bytes([*range(0x00, 0x08), 0x0B, 0x0C, *range(0x0E, 0x20)])
_C0_STAND_INS = bytes.maketrans(
    _C0_SOURCES, bytes(0x00 if b == 0x1B else 0x7F for b in _C0_SOURCES)
)
_C1_UTF8 = re.compile(rb"\xc2([\x80-\x9f])")
_INVISIBLE_UTF8 = re.compile(rb"\xe2(?:\x80[\x8b-\x8f\xa8-\xae]|\x81[\xa0\xa6-\xa9])|\xef\xbb\xbf")


def defang(data: bytes) -> bytes:
    """`data` as the log archive keeps it: as long as it was, nothing in it a terminal obeys."""
    if not _controls_in(data):
        return data
    data = data.translate(_C0_STAND_INS)
    data = _C1_UTF8.sub(lambda m: bytes((0, m[1][0] - 0x40)), data)
    return _INVISIBLE_UTF8.sub(MARKER.encode(), data).replace(b"\xd8\x9c", b"\x00?")


def clean(line: str) -> str:
    """The text a terminal would finally show for one line, invisible characters marked."""
    if line.isprintable():  # most lines: no escape, \r, \b, C0, C1 or format char (C speed)
        return line.rstrip()
    if "\x00" in line:
        line = line.replace("\x00?", MARKER)  # the archive's U+061C (see defang)
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
    return _INVISIBLE.sub(MARKER, _CONTROL.sub("", line)).rstrip()


def clean_text(text: str) -> str:
    """A text of several lines (a message, an error, a reply's field) as it may be printed:
    each line cleaned, the newlines kept."""
    if text.isprintable():
        return text
    return "\n".join(clean(line) for line in text.split("\n"))


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
        if not split and not _controls_in(data) and _UNSAFE.search(partial) is None:
            return [line.rstrip() for line in complete]  # all clean() would do to them
        return [clean(line) for line in complete]

    def flush(self) -> list[str]:
        """The unterminated last line, once the task has ended."""
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [clean(rest)] if rest.strip() else []


class Assembler(Protocol):
    """Bytes in, display lines out: LineAssembler, or RawLines for `--raw`."""

    def feed(self, data: bytes) -> list[str]: ...
    def flush(self) -> list[str]: ...


def lines_of(data: bytes) -> list[str]:
    """All of a finished output (an `exec` command's) as clean display lines."""
    lines = LineAssembler()
    return lines.feed(data) + lines.flush()


class RawLines:
    """LineAssembler's interface without the filter: the lines as the host wrote them (invalid
    UTF-8 replaced), escape sequences and all. Only for `--raw`, which a user asks for."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> list[str]:
        *complete, self._partial = (self._partial + self._decoder.decode(data)).split("\n")
        return complete

    def flush(self) -> list[str]:
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [rest] if rest else []
