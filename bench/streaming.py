"""Scenario 6: 8 tasks print numbered, timestamped lines; `up` shows them all, piped or on a tty.

`python -m bench.streaming [--seconds 10]` runs this scenario alone (plain vs terminal, paced and
flat out) on its own 8-host lab; `python -m bench` runs it as part of the whole bench.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import pty
import re
import selectors
import statistics
import struct
import subprocess
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.tools import BenchError, Tfdeploy
from tests.lab import LabHost

PACED = 10_000  # lines per second per task for the latency run (80k/s in all)
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
TERMINAL_SIZE = (40, 120)  # rows, columns of the pseudo-terminal


@dataclass
class StreamResult:
    lines: int
    seconds: float
    median_ms: float
    p99_ms: float
    peak_rss_mb: float
    complete: bool
    detail: str
    cpu_s: float = 0.0  # the controller's user + system CPU for the whole `up`
    written_mb: float = 0.0  # what `up` wrote to its stdout (the pipe or the terminal)

    @property
    def rate(self) -> float:
        return self.lines / self.seconds if self.seconds else 0.0


def _spawn(argv: list[str], env: dict[str, str], terminal: bool) -> tuple[subprocess.Popen, int]:
    """Starts `up` with stdout on a pipe, or on a pseudo-terminal as a person's shell gives it.

    The terminal is raw (no \\n -> \\r\\n) so lines parse alike; rich still sees a tty and draws
    its live view, cursor moves and all.
    """
    if not terminal:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        return proc, proc.stdout.fileno()
    master, slave = pty.openpty()
    tty.setraw(slave)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *TERMINAL_SIZE, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("LINES", "COLUMNS")}  # the tty's size wins
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    return proc, master


def _chunks(fd: int) -> Iterator[bytes]:
    """What `up` writes, as it comes, until it closes its end (EIO on a pty's master)."""
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    while True:
        sel.select(1.0)
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            continue
        except OSError as exc:
            if exc.errno == errno.EIO:
                return
            raise
        if not chunk:
            return
        yield chunk


def _log_line(raw: bytes, terminal: bool) -> tuple[str, bytes] | None:
    """(label, text) of a prefixed log line; None for steps and the live view's table."""
    if terminal:  # colours and cursor moves go; a line starts after the last carriage return
        raw = ANSI.sub(b"", raw).rpartition(b"\r")[2]
    label, sep, text = raw.partition(b" | ")
    if not sep or b" " in label.strip():
        return None
    return label.strip().decode(), text


def stream(
    tool: Tfdeploy,
    hosts: list[LabHost],
    tree: Path,
    seconds: float,
    rate: float = 0,
    *,
    terminal: bool = False,
) -> StreamResult:
    """`rate` lines per second per task, or 0: as fast as each task can print."""
    command = f"exec {tool.ctx.lab.python} spam.py {seconds} {rate:g}"
    inv = tool.inventory(hosts, tree, command=command)
    argv = [sys.executable, "-m", "deployer", "up", str(inv)]
    proc, fd = _spawn(argv, tool.env, terminal)
    seen: dict[str, int] = {}  # label -> next expected number
    done: dict[str, int] = {}
    latencies: list[int] = []
    errors: list[str] = []
    first = last = 0.0
    count = written = 0
    pending = b""
    for chunk in _chunks(fd):
        now = time.time_ns()
        written += len(chunk)
        data = pending + chunk
        cut = data.rfind(b"\n") + 1
        pending = data[cut:]
        sample = 0
        for raw in data[:cut].split(b"\n")[:-1]:
            parsed = _log_line(raw, terminal)
            if parsed is None:
                continue
            key, text = parsed
            if text.startswith(b"DONE "):
                done[key] = int(text[5:])
                continue
            seq, _, stamp = text.partition(b" ")
            expected = seen.get(key, 0)
            if int(seq) != expected and len(errors) < 5:
                errors.append(f"{key}: got line {int(seq)}, expected {expected}")
            seen[key] = int(seq) + 1
            count += 1
            sample += 1
            if sample % 7 == 0:  # every 7th line: the bench must not starve the controller
                latencies.append(now - int(stamp))
        if count and not first:
            first = time.monotonic()
        last = time.monotonic()
    if terminal:
        os.close(fd)
    _, status, usage = os.wait4(proc.pid, 0)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise BenchError(f"streaming up failed: {stderr[-800:]}")
    complete = (
        not errors and len(done) == len(hosts) and all(seen.get(k) == n for k, n in done.items())
    )
    detail = "; ".join(errors) or (
        "" if complete else f"printed {sum(done.values())}, shown {count}"
    )
    latencies.sort()
    return StreamResult(
        lines=count,
        seconds=last - first,
        median_ms=statistics.median(latencies) / 1e6 if latencies else 0.0,
        p99_ms=latencies[int(len(latencies) * 0.99)] / 1e6 if latencies else 0.0,
        peak_rss_mb=usage.ru_maxrss / 1024,
        complete=complete,
        detail=detail,
        cpu_s=usage.ru_utime + usage.ru_stime,
        written_mb=written / 1e6,
    )


def terminal_row(plain: StreamResult, term: StreamResult, seconds: float) -> list[str]:
    """The terminal case against plain mode for the same paced output: CPU per line, target 2x.

    Per line: a paced task that falls behind prints a few lines fewer before its time is up.
    """
    per_line = lambda r: r.cpu_s / r.lines if r.lines else float("inf")  # noqa: E731
    ratio = per_line(term) / per_line(plain) if plain.cpu_s else float("inf")
    complete = term.complete and plain.complete
    cell = (
        f"CPU {term.cpu_s:.1f} s on a terminal vs {plain.cpu_s:.1f} s piped "
        f"({ratio:.2f}x per line); {term.written_mb:.1f} MB vs {plain.written_mb:.1f} MB "
        f"written; {term.lines:,} lines, latency median {term.median_ms:,.0f} ms "
        f"(piped {plain.median_ms:,.0f} ms)"
        + ("" if complete else f"; LOST: {term.detail or plain.detail}")
    )
    return [
        f"log streaming to a terminal: 8 tasks x {PACED:,} lines/s for {seconds:g} s (live view)",
        "8",
        cell,
        "<= 2x the CPU of plain mode",
        "yes" if ratio <= 2 and complete else "**no**",
    ]


def main() -> int:
    """This scenario alone: plain and terminal, paced then flat out, on a fresh 8-host lab."""
    from bench import workload
    from bench.tools import Ctx, make_tmp
    from tests.lab import start_lab

    p = argparse.ArgumentParser(prog="python -m bench.streaming", description=__doc__)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("the bench needs root (namespace lab): sudo ... python -m bench.streaming")
        return 2
    tmp = make_tmp()
    tree = workload.small_tree(tmp / "code5")
    lab = start_lab(8)
    tool = Tfdeploy(Ctx(lab, tmp))
    results: dict[tuple[str, bool], StreamResult] = {}
    try:
        for name, rate in (("paced", PACED), ("flat", 0)):
            for terminal in (False, True):
                results[name, terminal] = stream(
                    tool, lab.hosts, tree, args.seconds, rate, terminal=terminal
                )
                tool.reset(lab.hosts, keep_files=True)
    finally:
        lab.stop()
    for (name, terminal), r in results.items():
        print(
            f"{name:5} {'terminal' if terminal else 'plain':8} {r.lines:>9,} lines "
            f"{r.rate:>9,.0f} lines/s  CPU {r.cpu_s:5.1f} s  written {r.written_mb:6.1f} MB  "
            f"latency median {r.median_ms:,.0f} ms p99 {r.p99_ms:,.0f} ms  "
            f"RSS {r.peak_rss_mb:.0f} MB  {'complete' if r.complete else 'LOST ' + r.detail}"
        )
    print(" | ".join(terminal_row(results["paced", False], results["paced", True], args.seconds)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
