"""`sudo /opt/tfdeploy/venv/bin/python -m bench.fanout [--sizes 4,16,32] [--uncapped-sizes 1,8,32]
[--mb 50] [--reps 1] [--rate 100mbit] [--variants star-rsync,tfdeploy-star,tfdeploy-fanout]`

Fan-out push against the star: a code tree of --mb files of 1 MB (random, incompressible) goes
from this machine to N lab hosts that have none of it, by
  star-rsync       N parallel `rsync -a` over ssh, each into a fresh directory;
  tfdeploy-star    `tfdeploy up --detach` with `fanout = false` in [job], then `tfdeploy down`;
  tfdeploy-fanout  the same with `fanout = true`;
  tfdeploy         the same with no `fanout` key (tfdeploy's default).
Every tfdeploy run starts with no workdir (~/.tfdeploy: store and agent) on any host, so every
byte travels. Variants take turns within each repetition. Times are the wall clock of the command
(`up --detach` whole: preflight, push, start); uplink bytes are what this machine sent into the
lab meanwhile (tx_bytes of the lab's bridge: frames, SSH included; host-to-host copies are not in
it). After each run every host's copy is checked file by file (sha256) against the local tree.

Two scenarios: the uplink capped at --rate (tbf on the bridge: shapes only this machine -> lab,
checked by measurement before the runs) for --sizes, and uncapped for --uncapped-sizes. Prints
one markdown table per scenario: medians, with (min-max) when --reps > 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench import report
from bench.__main__ import _fmt_bytes
from bench.report import tee_to
from bench.tools import BenchError, make_tmp, wait_gone
from tests.lab import Lab, LabHost, start_lab

VARIANTS = {  # name: (column label, the [job] fanout key; None: not written)
    "star-rsync": ("star rsync", None),
    "tfdeploy": ("tfdeploy (no fanout key)", None),
    "tfdeploy-star": ("tfdeploy star", False),
    "tfdeploy-fanout": ("tfdeploy fan-out", True),
}
DEFAULT_VARIANTS = "star-rsync,tfdeploy-star,tfdeploy-fanout"
RSYNC_DEST = "/root/bench-fanout"
WORKDIR = "/root/.tfdeploy"  # the lab inventory's ~/.tfdeploy, logged in as root
TAG = "fanoutbench"  # in the task's command line: what a reset kills
COMMAND = f"python3 -c 'import time; time.sleep(3600)' {TAG}"
TIMEOUT = 3600.0


@dataclass
class Sample:
    seconds: float
    uplink: int  # bytes this machine sent into the lab during the command
    cpu: float = 0.0  # user + system seconds of the command's processes on this machine
    phases: tuple[float, float, float] | None = None  # tfdeploy up: preflight, push, start


# -- the code tree -------------------------------------------------------------------------------


def make_tree(root: Path, mb: int) -> dict[str, str]:
    """`mb` files of 1 MB of random bytes, 10 to a directory; returns {relative path: sha256}."""
    rnd = random.Random(mb)
    sums = {}
    for i in range(mb):
        rel = f"data{i // 10}/blob{i}.bin"
        data = rnd.randbytes(1_000_000)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        sums[rel] = hashlib.sha256(data).hexdigest()
    return sums


def remote_sums(lab: Lab, host: LabHost, directory: str) -> dict[str, str]:
    """{relative path: sha256} of every file under `directory` on the host (a glob is fine)."""
    script = f"cd {directory} && find . -type f -print0 | xargs -0 -r sha256sum"
    done = lab.run(host, script, timeout=300)
    if done.returncode != 0:
        raise BenchError(f"{host.name}: hashing {directory} failed: {done.stderr.strip()[-300:]}")
    sums = {}
    for line in done.stdout.splitlines():
        digest, rel = line.split(maxsplit=1)
        sums[rel.removeprefix("./")] = digest
    return sums


def check_copies(lab: Lab, hosts: list[LabHost], directory: str, want: dict[str, str]) -> None:
    """Every host holds exactly the tree: same files, same contents."""

    def one(h: LabHost) -> str | None:
        got = remote_sums(lab, h, directory)
        if got == want:
            return None
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        return f"{h.name}: {len(missing)} missing, {len(wrong)} differ, {len(extra)} extra " + (
            f"(e.g. {(missing + wrong + extra)[0]})"
        )

    bad = [b for b in parallel(one, hosts) if b]
    if bad:
        raise BenchError("copies differ from the local tree:\n" + "\n".join(bad))


def parallel(fn: Callable[[LabHost], object], hosts: list[LabHost]) -> list:
    with ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
        return list(pool.map(fn, hosts))


def on_all(lab: Lab, hosts: list[LabHost], command: str) -> None:
    """Untimed housekeeping inside every host (nsenter, no SSH)."""

    def one(h: LabHost) -> None:
        done = lab.run(h, command, timeout=120)
        if done.returncode != 0:
            raise BenchError(f"{h.name}: {command!r} failed: {done.stderr.strip()[-300:]}")

    parallel(one, hosts)


# -- the variants --------------------------------------------------------------------------------


class Bench:
    def __init__(self, lab: Lab, tmp: Path, tree: Path, sums: dict[str, str]) -> None:
        self.lab = lab
        self.tmp = tmp
        self.tree = tree
        self.sums = sums
        self.env = {"TFDEPLOY_STATE_DIR": str(tmp / "tfdeploy-state")}

    def run(self, variant: str, hosts: list[LabHost]) -> Sample:
        """One untimed reset, the timed push, then (untimed) the integrity check and cleanup."""
        if variant == "star-rsync":
            on_all(self.lab, hosts, f"rm -rf {RSYNC_DEST}")
            sample = self._timed(lambda: self._rsync(hosts))
            check_copies(self.lab, hosts, RSYNC_DEST, self.sums)
            on_all(self.lab, hosts, f"rm -rf {RSYNC_DEST}")
            return sample
        self._reset_tfdeploy(hosts)
        inventory = self._inventory(variant, hosts)
        lines: list[tuple[float, str]] = []
        sample = self._timed(lambda: lines.extend(self._up(inventory)))
        sample.phases = _phases(lines, sample.seconds)
        out = "".join(line for _, line in lines)
        m = re.search(r"run (\S+) is running detached", out)
        if not m:
            raise BenchError(f"no run id in the output of tfdeploy up:\n{out[-1500:]}")
        check_copies(self.lab, hosts, f"{WORKDIR}/hosts/*/runs/{m.group(1)}/code", self.sums)
        self._cli("down", str(inventory))
        self._reset_tfdeploy(hosts)
        return sample

    def _timed(self, fn: Callable[[], object]) -> Sample:
        before = self.lab.uplink_bytes()
        cpu = _children_cpu()
        began = time.monotonic()
        fn()
        seconds = time.monotonic() - began
        return Sample(seconds, self.lab.uplink_bytes() - before, _children_cpu() - cpu)

    def _rsync(self, hosts: list[LabHost]) -> None:
        ssh = f"ssh -F {self.lab.ssh_config}"
        procs = [
            subprocess.Popen(
                ["rsync", "-a", "-e", ssh, f"{self.tree}/", f"{h.name}:{RSYNC_DEST}/"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for h in hosts
        ]
        try:
            failed = []
            for h, p in zip(hosts, procs, strict=True):
                _, err = p.communicate(timeout=TIMEOUT)
                if p.returncode != 0:
                    failed.append(f"{h.name} (exit {p.returncode}): {err.strip()[-300:]}")
            if failed:
                raise BenchError("rsync failed on " + "; ".join(failed))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()

    def _reset_tfdeploy(self, hosts: list[LabHost]) -> None:
        pattern = f"{TAG}$"
        on_all(self.lab, hosts, f"pkill -9 -f '{pattern}'; {wait_gone(pattern)}; rm -rf {WORKDIR}")

    def _inventory(self, variant: str, hosts: list[LabHost]) -> Path:
        job: dict[str, object] = {
            "code": str(self.tree),
            "name": "fanbench",
            "command": COMMAND,
            "require_tensorflow": False,
        }
        fanout = VARIANTS[variant][1]
        if fanout is not None:
            job["fanout"] = fanout
        return self.lab.write_inventory(
            self.tmp / f"{variant}-{len(hosts)}.toml",
            tasks=[[{"role": "worker"}]] * len(hosts),
            hosts=hosts,
            job=job,
        )

    def _up(self, inventory: Path) -> list[tuple[float, str]]:
        """`tfdeploy up --detach`; each line of its output with when it came (tfdeploy flushes
        every step), for the phases."""
        argv = [sys.executable, "-m", "deployer", "up", "--detach", str(inventory)]
        began = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ | self.env,
        )
        timer = threading.Timer(TIMEOUT, proc.kill)
        timer.start()
        lines = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append((time.monotonic() - began, line))
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            tail = "".join(line for _, line in lines)[-1500:]
            raise BenchError(f"tfdeploy up failed (exit {proc.returncode}):\n{tail}")
        return lines

    def _cli(self, *args: str) -> str:
        argv = [sys.executable, "-m", "deployer", *args]
        done = subprocess.run(
            argv, capture_output=True, text=True, env=os.environ | self.env, timeout=TIMEOUT
        )
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-1500:]
            raise BenchError(f"tfdeploy {args[0]} failed (exit {done.returncode}):\n{tail}")
        return done.stdout + done.stderr


def _children_cpu() -> float:
    """CPU seconds of this process's ended children (rsync, ssh, tfdeploy: each is waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _phases(lines: list[tuple[float, str]], total: float) -> tuple[float, float, float] | None:
    """Preflight (until "preflight ok"), push (until "starting ..."), start (the rest)."""
    ok = next((t for t, line in lines if line.startswith("tfdeploy: preflight ok")), None)
    start = next((t for t, line in lines if line.startswith("tfdeploy: starting ")), None)
    if ok is None or start is None:
        return None
    return ok, start - ok, total - start


# -- checking the cap ----------------------------------------------------------------------------

_RECEIVE = """import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1)
s.settimeout(60)
c, _ = s.accept()
n, first = 0, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    first = first or time.monotonic()
    n += len(b)
print(n, time.monotonic() - first)
"""
_SEND = """import socket, sys, time
deadline = time.monotonic() + 20
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.02)
buf = bytes(1 << 20)
for _ in range(int(sys.argv[3])):
    c.sendall(buf)
c.close()
"""
_PORT = "5099"
PROBE_MB = 25


def throughput(lab: Lab, dst: LabHost, src: LabHost | None, mb: int) -> float:
    """Bytes per second of one TCP stream into `dst`, from `src` or (None) from this machine."""
    result: list[subprocess.CompletedProcess[str]] = []
    receiver = threading.Thread(
        target=lambda: result.append(lab.run(dst, ["python3", "-c", _RECEIVE, _PORT], timeout=120))
    )
    receiver.start()
    send = [sys.executable, "-c", _SEND, dst.address, _PORT, str(mb)]
    if src is None:
        done = subprocess.run(send, capture_output=True, text=True, timeout=120)
    else:
        done = lab.run(src, ["python3", *send[1:]], timeout=120)
    receiver.join()
    got = result[0] if result else None
    if done.returncode != 0 or got is None or got.returncode != 0:
        err = done.stderr + (got.stderr if got else "")
        raise BenchError(f"throughput probe failed: {err.strip()[-500:]}")
    n, seconds = got.stdout.split()
    return int(n) / float(seconds)


def _rate_bytes(rate: str) -> float | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def check_cap(lab: Lab, rate: str, mb: int = PROBE_MB) -> str:
    """Measures that the cap holds for this machine -> a host and not between hosts."""
    up = throughput(lab, lab.hosts[0], None, mb)
    side = throughput(lab, lab.hosts[0], lab.hosts[1], mb) if len(lab.hosts) > 1 else None
    text = f"this machine -> h1 {up / 1e6:.1f} MB/s"
    text += f", h2 -> h1 {side / 1e6:.0f} MB/s" if side is not None else ""
    nominal = _rate_bytes(rate)
    if nominal is not None:
        if up > 1.3 * nominal:
            raise BenchError(f"the uplink cap ({rate}) does not hold: {text}")
        # Lab hosts talk to each other at several hundred MB/s: for caps up to 1 gbit, a
        # host-to-host stream under twice the cap means the cap reaches it.
        if side is not None and nominal <= 125e6 and side < 2 * nominal:
            raise BenchError(f"the uplink cap ({rate}) slows host-to-host traffic too: {text}")
    return text


# -- the report ----------------------------------------------------------------------------------


def _median(samples: list[Sample]) -> float:
    return statistics.median(s.seconds for s in samples)


def _cell_time(samples: list[Sample]) -> str:
    if not samples:
        return "-"
    ts = [s.seconds for s in samples]
    spread = f" ({min(ts):.2f}-{max(ts):.2f})" if len(ts) > 1 else ""
    return f"{statistics.median(ts):.2f} s{spread}"


def _cell_ratio(a: list[Sample], b: list[Sample]) -> str:
    """Two decimals, three below 0.1: a target such as 0.08x must not read as met at 0.084."""
    if not (a and b):
        return "-"
    ratio = _median(a) / _median(b)
    return f"{ratio:.3f}x" if ratio < 0.1 else f"{ratio:.2f}x"


def _cell_uplink(samples: list[Sample], tree_bytes: int) -> str:
    if not samples:
        return "-"
    up = statistics.median(s.uplink for s in samples)
    return f"{_fmt_bytes(up)} ({up / tree_bytes:.2f}x)"


def _fmt_phases(samples: list[Sample]) -> str:
    """Medians as " (preflight 2.10 + push 15.30 + start 0.80 s)"; "" without phases."""
    known = [s.phases for s in samples if s.phases]
    if not known:
        return ""
    pre, push, start = (statistics.median(p[i] for p in known) for i in range(3))
    return f" (preflight {pre:.2f} + push {push:.2f} + start {start:.2f} s)"


def phase_table(
    res: dict[tuple[str, int], list[Sample]], sizes: list[int], variants: list[str]
) -> str:
    """Per variant: tfdeploy's phases (when its output shows them) and the controller's CPU."""
    rows = [["hosts", *(VARIANTS[v][0] for v in variants)], ["---"] * (len(variants) + 1)]
    for n in sizes:
        cells = []
        for v in variants:
            if not res[v, n]:
                cells.append("-")
                continue
            cpu = f"CPU {statistics.median(s.cpu for s in res[v, n]):.1f} s"
            phases = _fmt_phases(res[v, n]).strip(" ()")
            cells.append(f"{phases}; {cpu}" if phases else cpu)
        rows.append([str(n), *cells])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def table(
    res: dict[tuple[str, int], list[Sample]], sizes: list[int], variants: list[str], tree: int
) -> str:
    labels = {v: VARIANTS[v][0] for v in variants}
    tf = [v for v in variants if v != "star-rsync"]
    ratios: list[tuple[str, str, str]] = []  # (header, numerator, denominator)
    if "star-rsync" in variants:
        ratios += [(f"{labels[v].removeprefix('tfdeploy ')} / rsync", v, "star-rsync") for v in tf]
    if "tfdeploy-fanout" in variants and "tfdeploy-star" in variants:
        ratios.append(("fan-out / tfdeploy star", "tfdeploy-fanout", "tfdeploy-star"))
    head = ["hosts", *labels.values(), *(r[0] for r in ratios)]
    head += [f"uplink bytes: {labels[v]} (÷ tree bytes)" for v in variants]
    rows = [head, ["---"] * len(head)]
    for n in sizes:
        rows.append(
            [
                str(n),
                *(_cell_time(res[v, n]) for v in variants),
                *(_cell_ratio(res[a, n], res[b, n]) for _, a, b in ratios),
                *(_cell_uplink(res[v, n], tree) for v in variants),
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


# -- main ----------------------------------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", default="4,16,32", help="host counts, uplink capped (4,16,32)")
    p.add_argument("--uncapped-sizes", default="1,8,32", help="host counts, uncapped (1,8,32)")
    p.add_argument("--mb", type=int, default=50, help="tree size: files of 1 MB (50)")
    p.add_argument("--reps", type=int, default=1, help="repetitions per cell (1)")
    p.add_argument("--rate", default="100mbit", help="the capped uplink, as tc says it (100mbit)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"({DEFAULT_VARIANTS})")
    p.add_argument("--out", type=Path, help="also write the tables to this file (docs/bench/)")
    args = p.parse_args()
    with tee_to(args.out, "bench.fanout"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print(f"the bench needs root (namespace lab): sudo {sys.executable} -m bench.fanout")
        return 2
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    scenarios = [
        (f"uplink capped at {args.rate}", args.rate, _sizes(args.sizes)),
        ("uncapped", None, _sizes(args.uncapped_sizes)),
    ]
    scenarios = [s for s in scenarios if s[2]]
    started = time.monotonic()
    load_before = report.load()
    tmp = make_tmp()
    lab: Lab | None = None
    res: dict[tuple[str, str, int], list[Sample]] = defaultdict(list)
    failed: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    cap_check = ""
    try:
        tree = tmp / "code"
        sums = make_tree(tree, args.mb)
        tree_bytes = args.mb * 1_000_000
        lab = start_lab(max(n for s in scenarios for n in s[2]))
        bench = Bench(lab, tmp, tree, sums)
        for title, rate, sizes in scenarios:
            if rate:
                lab.cap_uplink(rate)
                cap_check = check_cap(lab, rate)
                _log(started, f"cap {rate}: {cap_check}")
            else:
                lab.uncap_uplink()
            for n in sizes:
                hosts = lab.hosts[:n]
                for rep in range(args.reps):
                    for v in variants:
                        try:
                            s = bench.run(v, hosts)
                        except BenchError as exc:  # a result too: shown in the table
                            failed[title, v, n].append(_cause(str(exc)))
                            _log(started, f"{title}, N={n}, rep {rep + 1}: {v} FAILED: {exc}")
                            continue
                        res[title, v, n].append(s)
                        _log(
                            started,
                            f"{title}, N={n}, rep {rep + 1}: {v} {s.seconds:.2f} s, "
                            f"uplink {_fmt_bytes(s.uplink)}, CPU {s.cpu:.1f} s" + _fmt_phases([s]),
                        )
    finally:
        if lab is not None:
            try:
                lab.uncap_uplink()
            finally:
                lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    for title, rate, sizes in scenarios:
        print(f"\n### {args.mb} MB in {args.mb} files of 1 MB to N empty hosts, {title}\n")
        cells = {(v, n): res[title, v, n] for v in variants for n in sizes}
        print(table(defaultdict(list, cells), sizes, variants, tree_bytes))
        for (where_, v, n), causes in sorted(failed.items()):
            if where_ == title:
                print(
                    f"\n{VARIANTS[v][0]}, N={n}: {len(causes)} run(s) failed: {'; '.join(causes)}"
                )
        where = phase_table(defaultdict(list, cells), sizes, variants)
        print(
            "\nWhere the time goes: tfdeploy up --detach by phase (preflight + push + start), "
            "and the CPU seconds (user + system) of the command's processes on this machine "
            f"(rsync and ssh; tfdeploy and its paramiko connections):\n\n{where}"
        )
        if rate:
            print(
                f"\nCap checked before the runs ({PROBE_MB} MB, one TCP stream each): {cap_check}."
            )
    print(
        f"\nMachine: {report.machine()}. "
        f"Load average before/after: {load_before} / {report.load()}. "
        f"Bench wall time {elapsed / 60:.1f} min; {args.reps} repetition(s) per cell"
        + (", median (min-max)." if args.reps > 1 else ".")
    )
    return 0


def _cause(text: str) -> str:
    """The line of a failure report that says why (tfdeploy's `error:` and its host lines)."""
    lines = [line.strip() for line in text.splitlines()]
    said = [line for line in lines if line.startswith(("error:", "h"))]
    return " ".join(said[:2]) or (lines[0] if lines else "?")


def _log(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:5.0f} s] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted: the lab is stopped", file=sys.stderr)
        sys.exit(130)
