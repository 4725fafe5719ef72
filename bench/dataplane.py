"""`sudo /opt/tfdeploy/venv/bin/python -m bench.dataplane [--reps 3] [--big-mb 1024]
[--out docs/bench/dataplane.md]`

Bulk bytes against the OpenSSH tools, side by side in one run on the same lab hosts (uncapped
but for one cell):

  push 1 host     30 files of 10 MB: `rsync -a` over ssh  vs  `tfdeploy up --detach`
  push 4 hosts    the same tree: 4 parallel rsync         vs  `tfdeploy up --detach` (fan-out)
  pull 2 hosts    the 300 MB each host holds: 2 parallel `scp -r`  vs  `tfdeploy pull`
  ... links capped  the same with each host's link shaped to HOST_LINK both ways: the hosts
                  hold the same tree (replicas' checkpoints), which scp copies from each and
                  tfdeploy fetches once, shared out between them
  artifacts       the same 300 MB from each of 2 hosts: 2 parallel scp vs the pull `up` runs
                  when its tasks exit (wall and CPU from its "job succeeded" line to its
                  "artifacts:" line; its peak RSS is not separated from the rest of `up`'s)
  logs --sync     a detached task's log of LOG_MB MB of training-like lines: scp of the file vs
                  `tfdeploy logs RUN --sync --tail 0` into an empty local archive (the bytes
                  alone), and vs the same without --tail 0 (then every line printed to a pipe)
  1 GB, 1 host    one file of --big-mb MB: rsync vs `up --detach`, then scp vs `pull`
  1 kB, 1 host    one small file the same ways: what a command costs around its bytes

Every tfdeploy push starts from hosts without a workdir (all bytes travel); every pull into an
empty folder; every cell runs once untimed before its timed runs; every timed run, tool and
tfdeploy alike, starts with this machine's page cache written back and dropped (`settle`).
Times are wall clock; CPU is
user + system of this machine's processes of the command (rsync/scp and their ssh, or tfdeploy);
peak RSS is tfdeploy's own. Machine CPU is what every core spent busy meanwhile (/proc/stat),
the lab's sshd, agents and relays included: they share this machine's cores, so that over the
core count is the least wall time the cell could take here, whatever the tool (a real fleet
gives each host its own). Copies are checked by sha256 after each run. The table goes to stdout
and, with --out, to that file, which the docs include as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import report
from bench.fanout import RSYNC_DEST, Bench, check_copies, on_all
from bench.tools import BenchError, make_tmp, run, settle
from tests.lab import Lab, LabHost, start_lab

MB = 1_000_000
# Every cell runs once untimed first, tool and tfdeploy alike. In five trials of five 1 GB
# pulls each, the first pull after the lab started spent ~1.9 s of system time, the others
# ~0.5-1.0 s (sync before each made no difference): a cold start, not the steady state.
WARMUP = 1
LOG_MB = 100  # the log catch-up cell: the archive keeps all of it (up to 128 MiB a task)
HOST_LINK = "400mbit"  # the replicas cell: what each host may send (tbf on its side of the lab)


@dataclass
class Run:
    seconds: float
    cpu: float
    rss_mb: float
    machine_cpu: float = 0.0  # CPU seconds of every process here (the lab's hosts included)


def make_files(root: Path, count: int, size_mb: int, seed: int) -> dict[str, str]:
    """`count` files of `size_mb` MB of incompressible bytes; {relative path: sha256}."""
    sums = {}
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        rel = f"data/f{seed}-{i}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with path.open("wb") as f:
            for _ in range(size_mb):
                block = os.urandom(MB)
                digest.update(block)
                f.write(block)
        sums[rel] = digest.hexdigest()
    return sums


# Runs a command and reports the peak RSS of the processes it waited for (tfdeploy and, with
# the local transport, its agents): ru_maxrss of children is a high-water mark, so each command
# gets a parent of its own and the checks between commands cannot raise it.
_PEAK = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stdout.write(r.stdout + r.stderr)\n"
    "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(r.returncode)\n"
)


def tfdeploy(env: dict[str, str], *args: str) -> tuple[str, float]:
    """`tfdeploy ARGS` (this checkout's); its output and its peak RSS in MB."""
    argv = [sys.executable, "-c", _PEAK, sys.executable, "-m", "deployer", *args]
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ | env, timeout=3600)
    out, _, peak = done.stdout.rpartition("PEAK ")
    if done.returncode != 0:
        raise BenchError(f"tfdeploy {args[0]} failed (exit {done.returncode}):\n{out[-1500:]}")
    return out, int(peak.split()[0]) / 1024


def training_log(mb: int) -> bytes:
    """`mb` MB of lines such as a training loop prints (~60 bytes each)."""
    lines, size, i = [], 0, 0
    while size < mb * MB:
        line = f"step {i:08d} - loss: {(i % 9973) / 9973:.4f} - accuracy: {(i % 997) / 997:.4f}\n"
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines).encode()


def wait_until_true(check: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError("the task's log never reached its size")
        time.sleep(0.2)


def _usage() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def machine_busy() -> float:
    """CPU seconds this machine has spent busy since boot, all cores (/proc/stat): the lab's
    hosts share these cores, so a cell's busy time over the core count bounds its wall time
    from below, whatever the tool."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], object]) -> Run:
    """Wall and CPU of `fn`'s child processes; the peak RSS `fn` returns (tfdeploy's), if any."""
    settle()
    cpu0, _ = _usage()
    busy0 = machine_busy()
    began = time.monotonic()
    peak = fn()
    seconds = time.monotonic() - began
    busy = machine_busy() - busy0
    cpu1, _ = _usage()
    return Run(seconds, cpu1 - cpu0, peak if isinstance(peak, float) else 0.0, busy)


class Cells:
    """The measurements; each runs against a lab and a tree made by `main`."""

    def __init__(self, lab: Lab, tmp: Path, tree: Path, sums: dict[str, str]) -> None:
        self.lab, self.tmp, self.tree, self.sums = lab, tmp, tree, sums
        self.bench = Bench(lab, tmp, tree, sums)

    def rsync(self, hosts: list[LabHost]) -> Run:
        on_all(self.lab, hosts, f"rm -rf {RSYNC_DEST}")
        run = timed(lambda: self.bench._rsync(hosts))
        check_copies(self.lab, hosts, RSYNC_DEST, self.sums)
        on_all(self.lab, hosts, f"rm -rf {RSYNC_DEST}")
        return run

    def push(self, hosts: list[LabHost]) -> Run:
        return self._push(hosts, down=True)[0]

    def _push(self, hosts: list[LabHost], *, down: bool) -> tuple[Run, str, Path]:
        self.bench._reset_tfdeploy(hosts)
        inventory = self.bench._inventory("tfdeploy", hosts)
        said: list[str] = []

        def up() -> float:
            out, peak = tfdeploy(self.bench.env, "up", "--detach", str(inventory))
            said.append(out)
            return peak

        run = timed(up)
        out = "".join(said)
        m = re.search(r"run (\S+) is running detached", out)
        if not m:
            raise BenchError(f"no run id in tfdeploy up's output:\n{out[-1500:]}")
        code = f"/root/.tfdeploy/hosts/*/runs/{m.group(1)}/code"
        check_copies(self.lab, hosts, code, self.sums)
        if down:
            self.bench._cli("down", str(inventory))
            self.bench._reset_tfdeploy(hosts)
        return run, m.group(1), inventory

    def scp_from(self, hosts: list[LabHost], code: str) -> Run:
        dest = self.tmp / "scp"
        shutil.rmtree(dest, ignore_errors=True)

        def copy() -> None:
            procs = []
            for h in hosts:
                (dest / h.name).mkdir(parents=True)
                ssh = ["scp", "-q", "-r", "-F", str(self.lab.ssh_config)]
                procs.append(subprocess.Popen([*ssh, f"{h.name}:{code}/data", str(dest / h.name)]))
            if any(p.wait() != 0 for p in procs):
                raise BenchError("scp failed")

        run = timed(copy)
        self._check_local(dest, hosts)
        return run

    def pull(self, run_id: str, inventory: Path, hosts: list[LabHost]) -> Run:
        dest = self.tmp / "pulled"
        shutil.rmtree(dest, ignore_errors=True)
        argv = ["pull", run_id, "-i", str(inventory), "data/**", "--to", str(dest)]
        run = timed(lambda: tfdeploy(self.bench.env, *argv)[1])
        for h, task in zip(hosts, range(len(hosts)), strict=True):
            self._check_tree(dest / run_id / f"worker-{task}", h)
        return run

    def artifacts(self, hosts: list[LabHost]) -> Run:
        """`up` of a task that exits at once with job.artifacts = the 300 MB it was pushed:
        wall and controller CPU from its "job succeeded" line to its "artifacts:" line."""
        self.bench._reset_tfdeploy(hosts)
        dest = self.tmp / "artifacts"
        shutil.rmtree(dest, ignore_errors=True)
        job = {
            "code": str(self.tree),
            "name": "artbench",
            "command": "python3 -c pass",
            "require_tensorflow": False,
            "artifacts": ["data/**"],
            "artifacts_to": str(dest),
        }
        tasks = [[{"role": "worker"}]] * len(hosts)
        inventory = self.lab.write_inventory(
            self.tmp / "artifacts.toml", tasks=tasks, hosts=hosts, job=job
        )
        settle()
        marks = _marked_lines(
            [sys.executable, "-m", "deployer", "up", str(inventory)],
            self.bench.env,
            ("job succeeded", "artifacts: pulled"),
        )
        (t0, cpu0, busy0), (t1, cpu1, busy1) = marks
        [run_dir] = dest.iterdir()
        for h, task in zip(hosts, range(len(hosts)), strict=True):
            self._check_tree(run_dir / f"worker-{task}", h)
        self.bench._reset_tfdeploy(hosts)
        return Run(t1 - t0, cpu1 - cpu0, 0.0, busy1 - busy0)

    def log_catchup(self, host: LabHost, reps: int, *extra: str) -> tuple[list[Run], list[Run]]:
        """A detached run whose task printed LOG_MB of training-like lines and exited: `scp` of
        its log file against `tfdeploy logs RUN --sync EXTRA` (every byte into an empty local
        archive; printed to a pipe unless `--tail 0`). The archive keeps up to 128 MiB a task:
        LOG_MB stays below."""
        tree = self.tmp / "logtree"
        tree.mkdir(exist_ok=True)
        log = training_log(LOG_MB)
        (tree / "log.txt").write_bytes(log)
        job = {"code": str(tree), "name": "logbench", "command": "cat log.txt"}
        job["require_tensorflow"] = False
        inventory = self.lab.write_inventory(
            self.tmp / "logs.toml", tasks=[[{"role": "worker"}]], hosts=[host], job=job
        )
        self.bench._reset_tfdeploy([host])
        out, _ = tfdeploy(self.bench.env, "up", "--detach", str(inventory))
        m = re.search(r"run (\S+) is running detached", out)
        if not m:
            raise BenchError(f"no run id in tfdeploy up's output:\n{out[-1500:]}")
        run_id, remote = m.group(1), f"/root/.tfdeploy/hosts/*/runs/{m.group(1)}/tasks/worker-0"
        size = f"stat -c %s {remote}/output.log"
        wait_until_true(lambda: self.lab.run(host, size).stdout.strip() == str(len(log)))
        state = Path(self.bench.env["TFDEPLOY_STATE_DIR"])
        copy = self.tmp / "log.scp"
        scp = ["scp", "-q", "-F", str(self.lab.ssh_config), f"{host.name}:{remote}/output.log"]
        argv = ("logs", run_id, "-i", str(inventory), "--sync", *extra)
        base, ours = [], []
        for _ in range(WARMUP + reps):
            base.append(timed(lambda: run([*scp, str(copy)])))
            if copy.read_bytes() != log:
                raise BenchError("scp's copy of the log differs from it")
            shutil.rmtree(state / "runs" / run_id, ignore_errors=True)  # every byte travels
            ours.append(timed(lambda: tfdeploy(self.bench.env, *argv)[1]))
            archived = state / "runs" / run_id / "worker-0.log"
            older = archived.with_suffix(".log.1")
            kept = (older.read_bytes() if older.exists() else b"") + archived.read_bytes()
            if kept != log:
                raise BenchError("the local archive differs from the task's log")
        self.bench._cli("down", str(inventory))
        self.bench._reset_tfdeploy([host])
        return base, ours

    def _check_local(self, dest: Path, hosts: list[LabHost]) -> None:
        for h in hosts:
            self._check_tree(dest / h.name, h)

    def _check_tree(self, root: Path, host: LabHost) -> None:
        for rel, want in self.sums.items():
            got = hashlib.sha256((root / rel).read_bytes()).hexdigest()
            if got != want:
                raise BenchError(f"{root / rel} ({host.name}) differs from the original")


def _marked_lines(
    argv: list[str], env: dict[str, str], marks: tuple[str, ...]
) -> list[tuple[float, float, float]]:
    """Runs argv; for each of `marks`, when the first output line holding it came, the
    process's CPU seconds (user + system, from /proc) and the machine's busy seconds then."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ | env
    )
    assert proc.stdout is not None
    tick = os.sysconf("SC_CLK_TCK")
    seen: list[tuple[float, float, float]] = []
    out = []
    for line in proc.stdout:
        out.append(line)
        if len(seen) < len(marks) and marks[len(seen)] in line:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick
            seen.append((time.monotonic(), cpu, machine_busy()))
    if proc.wait() != 0 or len(seen) < len(marks):
        raise BenchError(f"{argv[3:]} failed (exit {proc.returncode}):\n{''.join(out)[-1500:]}")
    return seen


FIXED_HEADER = (
    "| work | OpenSSH tool | tfdeploy | time ÷ tool | tool CPU | tfdeploy CPU |\n"
    "|---|---|---|---|---|---|"
)


def _fixed_cost(cells: Cells, tree: Path, hosts: list[LabHost], reps: int) -> list[str]:
    """Push and pull of one 1 kB file: the cost of the command, not of its bytes."""
    tree.mkdir(parents=True)
    data = os.urandom(1000)
    (tree / "data").mkdir()
    (tree / "data" / "small.bin").write_bytes(data)
    cells.tree, cells.sums = tree, {"data/small.bin": hashlib.sha256(data).hexdigest()}
    cells.bench.tree = tree
    push_base, push_ours, pull_base, pull_ours = [], [], [], []
    for _ in range(WARMUP + reps):
        push_base.append(cells.rsync(hosts))
        run, run_id, inventory = cells._push(hosts, down=False)
        push_ours.append(run)
        code = f"/root/.tfdeploy/hosts/*/runs/{run_id}/code"
        pull_base.append(cells.scp_from(hosts, code))
        pull_ours.append(cells.pull(run_id, inventory, hosts))
        cells.bench._cli("down", str(inventory))
        cells.bench._reset_tfdeploy(hosts)
    return [
        _fixed_row("push one 1 kB file to 1 host", "rsync", push_base, push_ours),
        _fixed_row("pull one 1 kB file from 1 host", "scp", pull_base, pull_ours),
    ]


def _fixed_row(work: str, tool: str, base: list[Run], ours: list[Run]) -> str:
    base, ours = base[WARMUP:], ours[WARMUP:]
    t_base = statistics.median(r.seconds for r in base)
    t_ours = statistics.median(r.seconds for r in ours)
    c_base = statistics.median(r.cpu for r in base)
    c_ours = statistics.median(r.cpu for r in ours)
    return (
        f"| {work} | {tool} {t_base:.2f} s | tfdeploy {t_ours:.2f} s | {_ratio(t_ours, t_base)} "
        f"| {c_base:.2f} s | {c_ours:.2f} s |"
    )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _row(work: str, tool: str, base: list[Run], ours: list[Run], mb: float) -> str:
    base, ours = base[WARMUP:], ours[WARMUP:]
    t_base = statistics.median(r.seconds for r in base)
    t_ours = statistics.median(r.seconds for r in ours)
    c_base = statistics.median(r.cpu for r in base) / mb * 1000
    c_ours = statistics.median(r.cpu for r in ours) / mb * 1000
    peak = max(r.rss_mb for r in ours)
    rss = f"{peak:.0f} MB" if peak else "not separated"
    return (
        f"| {work} | {tool} {t_base:.2f} s | tfdeploy {t_ours:.2f} s | {_ratio(t_ours, t_base)} "
        f"| {c_base:.2f} | {c_ours:.2f} | {_ratio(c_ours, c_base)} | {rss} "
        f"| {_busy(base)} | {_busy(ours)} |"
    )


def _busy(runs: list[Run]) -> str:
    """The whole machine's busy CPU seconds (median), and the wall time they allow at best."""
    if not all(r.machine_cpu for r in runs):
        return "not separated"
    busy = statistics.median(r.machine_cpu for r in runs)
    return f"{busy:.2f} s (≥ {busy / CORES:.2f} s)"


HEADER = (
    "| work | OpenSSH tool | tfdeploy | time ÷ tool | tool CPU ms/MB | tfdeploy CPU ms/MB "
    "| CPU ÷ tool | tfdeploy peak RSS | machine CPU, tool (wall floor) "
    "| machine CPU, tfdeploy (wall floor) |\n|---|---|---|---|---|---|---|---|---|---|"
)
CORES = os.cpu_count() or 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dataplane")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--big-mb", type=int, default=1024)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    load_before = report.load()
    report.compile_tfdeploy()
    lab = start_lab(4)
    tmp = make_tmp()
    try:
        tree = tmp / "tree"
        sums = make_files(tree, 30, 10, seed=1)
        cells = Cells(lab, tmp, tree, sums)
        hosts1, hosts2, hosts4 = lab.hosts[:1], lab.hosts[:2], lab.hosts[:4]
        rows = []
        results: dict[str, tuple[list[Run], list[Run]]] = {}
        for name, hosts in (("push 300 MB to 1 host", hosts1), ("push 300 MB to 4 hosts", hosts4)):
            base, ours = [], []
            for _ in range(WARMUP + args.reps):
                base.append(cells.rsync(hosts))
                ours.append(cells.push(hosts))
            results[name] = (base, ours)
            rows.append(_row(name, "rsync", base, ours, 300 * len(hosts)))
        _, run_id, inventory = cells._push(hosts2, down=False)
        code = f"/root/.tfdeploy/hosts/*/runs/{run_id}/code"
        base, ours = [], []
        for _ in range(WARMUP + args.reps):
            base.append(cells.scp_from(hosts2, code))
            ours.append(cells.pull(run_id, inventory, hosts2))
        rows.append(_row("pull 300 MB from each of 2 hosts", "scp", base, ours, 600))
        # The same tree on both hosts (replicas' checkpoints), each host's own link the limit,
        # as from a cloud fleet: what travels from each host is what counts.
        base, ours = [], []
        for h in hosts2:
            lab.cap_bandwidth(h, HOST_LINK)
        try:
            for _ in range(WARMUP + args.reps):
                base.append(cells.scp_from(hosts2, code))
                ours.append(cells.pull(run_id, inventory, hosts2))
        finally:
            for h in hosts2:
                lab.uncap_bandwidth(h)
        work = f"pull 300 MB from each of 2 hosts, each host's link at {HOST_LINK}"
        rows.append(_row(work, "scp", base, ours, 600))
        cells.bench._cli("down", str(inventory))
        base, ours = [], []
        for _ in range(WARMUP + args.reps):
            _, run_id, inventory = cells._push(hosts2, down=False)
            base.append(cells.scp_from(hosts2, f"/root/.tfdeploy/hosts/*/runs/{run_id}/code"))
            cells.bench._cli("down", str(inventory))
            ours.append(cells.artifacts(hosts2))
        rows.append(_row("artifacts: 300 MB from each of 2 hosts", "scp", base, ours, 600))
        for extra, what in ((("--tail", "0"), "into the local archive"), ((), "then printed")):
            base, ours = cells.log_catchup(hosts1[0], args.reps, *extra)
            command = " ".join(("logs --sync", *extra))
            work = f"`{command}`: a {LOG_MB} MB log from 1 host, {what}"
            rows.append(_row(work, "scp", base, ours, LOG_MB))
        shutil.rmtree(tree)
        fixed = _fixed_cost(cells, tmp / "tree", hosts1, args.reps)
        shutil.rmtree(tmp / "tree")
        big = tmp / "tree"
        cells.sums = make_files(big, 1, args.big_mb, seed=2)
        pushes: tuple[list[Run], list[Run]] = ([], [])
        pulls: tuple[list[Run], list[Run]] = ([], [])
        # As many reps as the other cells: one alone, cold, measured a 1 GB pull at 1.76x scp.
        for _ in range(WARMUP + args.reps):
            pushes[0].append(cells.rsync(hosts1))
            run, run_id, inventory = cells._push(hosts1, down=False)
            pushes[1].append(run)
            code = f"/root/.tfdeploy/hosts/*/runs/{run_id}/code"
            pulls[0].append(cells.scp_from(hosts1, code))
            pulls[1].append(cells.pull(run_id, inventory, hosts1))
            cells.bench._cli("down", str(inventory))
        one_file = f"one {args.big_mb} MB file"
        rows.append(_row(f"push {one_file} to 1 host", "rsync", *pushes, args.big_mb))
        rows.append(_row(f"pull {one_file} from 1 host", "scp", *pulls, args.big_mb))
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    minutes = (time.monotonic() - started) / 60
    text = "\n".join(
        [
            f"Measured by `python -m bench.dataplane --reps {args.reps} --big-mb {args.big_mb}` "
            f"({minutes:.1f} min; {report.machine()}); "
            f"medians of {args.reps} runs after one untimed run; {report.BYTECODE_NOTE}; "
            f"load average before/after: {load_before} / {report.load()}.",
            "",
            HEADER,
            *rows,
            "",
            "What one command costs around its bytes: the same cells with one file of 1 kB "
            "(medians; CPU in seconds, not per MB).",
            "",
            FIXED_HEADER,
            *fixed,
            "",
        ]
    )
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
