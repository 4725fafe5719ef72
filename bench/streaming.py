"""Scenario 6: 8 tasks print numbered, timestamped lines flat out for 10 s; `up` shows them all."""

from __future__ import annotations

import os
import selectors
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.tools import BenchError, Tfdeploy
from tests.lab import LabHost


@dataclass
class StreamResult:
    lines: int
    seconds: float
    median_ms: float
    p99_ms: float
    peak_rss_mb: float
    complete: bool
    detail: str

    @property
    def rate(self) -> float:
        return self.lines / self.seconds if self.seconds else 0.0


def stream(
    tool: Tfdeploy, hosts: list[LabHost], tree: Path, seconds: float, rate: float = 0
) -> StreamResult:
    """`rate` lines per second per task, or 0: as fast as each task can print."""
    command = f"exec {tool.ctx.lab.python} spam.py {seconds} {rate:g}"
    inv = tool.inventory(hosts, tree, command=command)
    argv = [sys.executable, "-m", "deployer", "up", str(inv)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=tool.env)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    seen: dict[str, int] = {}  # label -> next expected number
    done: dict[str, int] = {}
    latencies: list[int] = []
    errors: list[str] = []
    first = last = 0.0
    count = 0
    pending = b""
    while True:
        sel.select(1.0)
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            continue
        if not chunk:
            break
        now = time.time_ns()
        data = pending + chunk
        cut = data.rfind(b"\n") + 1
        pending = data[cut:]
        sample = 0
        for raw in data[:cut].split(b"\n")[:-1]:
            label, sep, text = raw.partition(b" | ")
            if not sep:
                continue  # a tfdeploy step line
            if text.startswith(b"DONE "):
                done[label.decode()] = int(text[5:])
                continue
            seq, _, stamp = text.partition(b" ")
            key = label.decode()
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
    )
