"""A command's own peak RSS, measured so that the measuring process's size does not count.

Linux keeps a process's high-water RSS across exec: the address space a child had between fork
and exec (a copy of its parent's) is recorded as the exec'd program's `ru_maxrss`. A controller
started straight from a pytest worker that has grown to 290 MB over a full run therefore "peaks"
at 290 MB before it runs a line. So the command is started by a small Python intermediary, whose
own size is what its child inherits, and the intermediary reports its child's rusage.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

# Runs in the intermediary: argv[1] is the address-space limit in bytes, argv[2] the timeout in
# seconds, the rest the command. Writes {"rss_kib", "rc"} as the last line of stderr.
_INTERMEDIARY = """
import json, os, resource, subprocess, sys, threading
limit, timeout, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
def limited():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=limited)
timer = threading.Timer(timeout, proc.kill)
timer.start()
_, status, usage = os.wait4(proc.pid, 0)
timer.cancel()
proc.returncode = os.waitstatus_to_exitcode(status)
sys.stdout.flush()
sys.stderr.write("\\n" + json.dumps({"rss_kib": usage.ru_maxrss, "rc": proc.returncode}) + "\\n")
"""


@dataclass(frozen=True)
class Measured:
    rss_kib: int  # the command's own peak resident set, in KiB
    returncode: int
    output: str  # stdout and stderr together


def measured(
    argv: list[str], env: dict[str, str], *, address_space: int = 4 << 30, timeout: float = 120
) -> Measured:
    """Runs `argv` under an address-space limit (a regression fails the test instead of taking
    the machine) and a kill timer, and returns its own peak RSS, exit status and output."""
    result = subprocess.run(
        [sys.executable, "-c", _INTERMEDIARY, str(address_space), str(timeout), *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout + 30,
    )
    text = result.stdout.decode(errors="replace")
    body, _, last = text.rstrip("\n").rpartition("\n")
    report = json.loads(last)
    return Measured(int(report["rss_kib"]), int(report["rc"]), body)
