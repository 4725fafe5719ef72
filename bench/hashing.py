"""`python -m bench.hashing [--mb 300] [--reps 5] [--out docs/bench/hashing.md]`

One hop of the fan-out as a host runs it: remote/store.py's `receive` stores a content that
arrives on a socket and forwards every piece to the next host's socket, hashing it on the way,
with the hash inline (in the loop) and beside (on remote/hashing.py's thread), alternately.
The sender (sendfile from a file in the page cache) and the sink (recv into one buffer) are
processes of their own and cost little, so the hop has a core to spare, as a host with
several has: that is where `hashing.SPARE_CORES` lets the agent hash beside. Wall time and the
hop's CPU (user + system of this process), medians of `--reps` runs after one untimed run each.
No lab and no root: sockets on loopback, files in a temporary folder.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path

from bench import report
from bench.tools import make_tmp

REMOTE = Path(__file__).resolve().parents[1] / "remote"
sys.path.insert(0, str(REMOTE))  # the agent's modules import each other by their own names
import hashing  # noqa: E402
import store  # noqa: E402

MB = 1 << 20


def _sender(content: Path, port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn, content.open("rb") as f:
        conn.sendfile(f)


def _sink(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        buffer = bytearray(MB)
        while conn.recv_into(buffer):
            pass


def _child(work: object, *args: object) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            work(*args)  # type: ignore[operator]
        finally:
            os._exit(0)
    return pid


def hop(content: Path, digest: str, stored: Path, beside: bool) -> tuple[float, float]:
    """One content through one hop: (wall seconds, CPU seconds of the hop)."""
    hashing.SPARE_CORES = beside  # what the host's core count decides on a real host
    stored.mkdir(exist_ok=True)
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    ports = [s.getsockname()[1] for s in listeners]
    children = [_child(_sender, content, ports[0]), _child(_sink, ports[1])]
    incoming, _ = listeners[0].accept()
    onward, _ = listeners[1].accept()
    before, began = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    with incoming.makefile("rb") as stream:
        store.receive(stored, [[digest, content.stat().st_size]], stream, onward.sendall)
    onward.close()
    wall, after = time.monotonic() - began, resource.getrusage(resource.RUSAGE_SELF)
    for pid in children:
        os.waitpid(pid, 0)
    for s in (incoming, *listeners):
        s.close()
    shutil.rmtree(stored)  # the next run stores it again
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hashing")
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tmp = make_tmp()
    try:
        content = tmp / "content"
        with content.open("wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(MB))
        digest = hashlib.sha256(content.read_bytes()).hexdigest()
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(1 + args.reps):
            for beside in (False, True):
                runs[beside].append(hop(content, digest, tmp / "store", beside))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with report.tee_to(args.out, "bench.hashing"):
        _print(args, runs)
    return 0


def _print(args: argparse.Namespace, runs: dict[bool, list[tuple[float, float]]]) -> None:
    def median(beside: bool, index: int) -> float:
        return statistics.median(run[index] for run in runs[beside][1:])

    print(
        f"One fan-out hop storing and forwarding one {args.mb} MB content on loopback; medians "
        f"of {args.reps} runs after one untimed run; {report.machine()}; load average "
        f"{report.load()}.\n"
    )
    print("| sha256 | wall | MB/s | hop CPU | wall ÷ inline |")
    print("|---|---|---|---|---|")
    for beside, name in ((False, "inline, in the loop"), (True, "beside, on its own thread")):
        wall, cpu = median(beside, 0), median(beside, 1)
        ratio = wall / median(False, 0)
        print(f"| {name} | {wall:.3f} s | {args.mb / wall:.0f} | {cpu:.3f} s | {ratio:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
