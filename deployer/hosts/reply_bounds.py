"""What a number or a text of a host's reply may be, by the field's name.

The edge (deployer/hosts/replies.py) checks every field's JSON type against its op's shape in
remote/protocol.py; a type says nothing of range. A timestamp of 1e20 overflowed
`time.localtime` in `status`, a negative size was printed as bytes freed, and a hello whose glibc
was "2.999999999" made the controller list a billion platform tags. So a field name that the
reply shapes use for a number with a meaning (a size, a time, a port) or for a version gets its
bound here, and the edge applies it to every field of that name in every reply, list items
included. A field without one still gets its type's own bound: numbers finite and within 64 bits,
texts at most MAX_TEXT characters (then cleaned for the terminal). One table, so a field added
to a shape tomorrow is bounded by its type the day it is added, and by its meaning once named here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_INT = 2**63 - 1  # any integer a host sends fits 64 bits (sizes, pids, offsets)
MAX_NUMBER = 1e18  # any other number: finite, and no larger than a 64-bit count
MAX_TEXT = 65536  # characters of one text field (a path is under 4096, a line of output too)
# The newest time a host may report: year 3000. time.localtime overflows past year 9999.
LATEST_TIME = 32503680000.0
# The glibc minors a host may claim: the controller lists one platform tag per minor from 2_17.
MAX_GLIBC_MINOR = 100


@dataclass(frozen=True)
class Range:
    """A number's bounds, both included."""

    low: float
    high: float
    what: str  # for the error: "a size", "a time"

    def problem(self, number: float) -> str | None:
        if isinstance(number, float) and not math.isfinite(number):
            return f"is {number}, not a finite number"
        if not self.low <= number <= self.high:
            return f"is {number!r:.30}, not {self.what}"
        return None


@dataclass(frozen=True)
class Version:
    """A version text: its pattern, and how large its numbered parts (groups) may be."""

    pattern: re.Pattern[str]
    what: str
    highest: int | None = None  # of the pattern's first group; None: what the pattern allows

    def problem(self, said: str) -> str | None:
        match = self.pattern.fullmatch(said)
        if match is None:
            return f"is {said!r:.60}, not {self.what}"
        if self.highest is not None and int(match.group(1)) > self.highest:
            return f"is {said!r:.60}, not {self.what}: {match.group(1)} is over {self.highest}"
        return None


ANY_INT = Range(-MAX_INT, MAX_INT, "a 64-bit integer")
ANY_NUMBER = Range(-MAX_NUMBER, MAX_NUMBER, "a number within ±1e18")
COUNT = Range(0, MAX_INT, "a count or size (0 or more)")
AMOUNT = Range(0, MAX_NUMBER, "an amount (0 or more)")
TIME = Range(0, LATEST_TIME, "a time (Unix seconds, before year 3000)")
PORT = Range(0, 65535, "a port (0 to 65535)")
STATUS = Range(-(2**31), 2**31 - 1, "an exit status (32 bits)")
SIGNAL = Range(0, 255, "a signal number (0 to 255)")
PERCENT = Range(0, 100, "a percentage (0 to 100)")
GPU_INDEX = Range(0, 4095, "a GPU index (0 to 4095)")

# CPython's sys.version's first word: "3.11.7", "3.13.0rc1", "3.12.0+".
PYTHON = Version(
    re.compile(r"[0-9]{1,2}\.[0-9]{1,3}(?:\.[0-9]{1,4})?(?:(?:a|b|rc)[0-9]{1,4})?\+?"),
    "a Python version (3.11.7)",
)
# confstr(CS_GNU_LIBC_VERSION)'s version: "2.36"; every manylinux tag is 2_N.
GLIBC = Version(
    re.compile(r"2\.([0-9]{1,3})(?:[.+~-][0-9A-Za-z.+~-]{0,30})?"),
    "a glibc version (2.N)",
    MAX_GLIBC_MINOR,
)
# A package version as its dist-info says it (PEP 440): "2.21.0", "2.17.0.dev20240101".
PACKAGE = Version(
    re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,12}){0,5}(?:[0-9A-Za-z.+!_-]{0,64})"),
    "a package version (2.21.0)",
)
# os.uname().machine: x86_64, aarch64, ppc64le; it becomes a wheel platform tag.
MACHINE = Version(re.compile(r"[A-Za-z0-9_]{1,32}"), "a machine name (x86_64)")

NUMBERS: dict[str, Range] = {
    "created": TIME,
    "started": TIME,
    "ended": TIME,
    "hosts_at": TIME,
    "disk_free": COUNT,
    "log_bytes": COUNT,
    "restarts": COUNT,
    "attempt": COUNT,
    "released": COUNT,
    "removed": COUNT,
    "contents": COUNT,
    "bytes": COUNT,
    "size": COUNT,
    "raw": COUNT,
    "offset": COUNT,
    "files": COUNT,
    "pid": COUNT,
    "pgid": COUNT,
    "listening": COUNT,  # the hello's stand-ins' pid; a poll's listening ports
    "busy_ports": PORT,
    "exit_code": STATUS,
    "code": STATUS,
    "signal": SIGNAL,
    "index": GPU_INDEX,
    "memory_total": AMOUNT,
    "memory_used": AMOUNT,
    "used_memory": AMOUNT,
    "utilization": PERCENT,
    "seconds": AMOUNT,
    "started_after": AMOUNT,
    "minutes": AMOUNT,
}

VERSIONS: dict[str, Version] = {
    "python": PYTHON,
    "glibc": GLIBC,
    "tensorflow": PACKAGE,
    "machine": MACHINE,
}


def number_problem(name: str, number: float) -> str | None:
    """Why `number`, a reply's field `name`, is out of its bounds, or None."""
    default = ANY_INT if isinstance(number, int) else ANY_NUMBER
    return NUMBERS.get(name, default).problem(number)


def text_problem(name: str, said: str) -> str | None:
    """Why `said`, a reply's text field `name`, is not what that field holds, or None."""
    if len(said) > MAX_TEXT:
        return f"is {len(said)} characters long, more than {MAX_TEXT}"
    version = VERSIONS.get(name)
    return version.problem(said) if version is not None else None
