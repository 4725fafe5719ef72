"""`sudo /opt/tfdeploy/venv/bin/python -m bench.warmup [--reps 7] [--out docs/bench/warmup.md]`

A warm `up` on two lab hosts (the code, the checks' facts and the hosts' agents already there
from an earlier `up`): seconds from the command to its task's first line on this terminal, side
by side:

  by hand     two `ssh HOST python3 hello.py` at once, one per host, as a user would type them
              with nothing checked (the floor: an SSH connection and a Python start);
  teardown    `tfdeploy up` of a job with the default policy (no keeper);
  kept        `tfdeploy up` of the same job with on_failure = "restart-job": its run is handed
              to a keeper beside the hosts once its tasks started (a warden on each host, the
              keeper on the first), before the watch shows the first line.

Plain output (a pipe), the task prints one line and ends. The arms take turns within each
repetition. Medians, then (min-max).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import report
from bench.report import tee_to
from bench.tools import BenchError, make_tmp
from tests.lab import Lab, start_lab

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 120.0
HELLO = "print('hello from the task', flush=True)\n"
ARMS = {
    "by-hand": "by hand: two `ssh HOST python3 hello.py` at once",
    "teardown": "tfdeploy up (on_failure = teardown)",
    "kept": "tfdeploy up (restart-job: kept by its keeper)",
}


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def inventory(lab: Lab, tmp: Path, policy: str) -> Path:
    job = {"name": f"warm-{policy}", "code": str(tmp / "code"), "command": "python3 hello.py"}
    job |= {"on_failure": policy, "require_tensorflow": False}
    return lab.write_inventory(tmp / f"{policy}.toml", tasks=[[{"role": "worker"}]] * 2, job=job)


def up_first_line(inv: Path, state: Path) -> float:
    """`tfdeploy up INV` until it exits; seconds to its task's first line."""
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", str(inv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    first = None
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if first is None and "| hello from the task" in line:
            first = time.monotonic() - began
    if proc.wait(timeout=TIMEOUT) != 0 or first is None:
        raise BenchError(f"up {inv.name} exited {proc.returncode}:\n{''.join(lines[-20:])}")
    return first


def by_hand(lab: Lab, tmp: Path) -> float:
    """Two ssh commands at once; seconds until both printed the line."""
    began = time.monotonic()
    command = f"cd /tmp; {lab.python} -c {shlex.quote(HELLO.strip())}"
    procs = [
        subprocess.Popen(lab.ssh_argv(h, command), stdout=subprocess.PIPE, text=True)
        for h in lab.hosts[:2]
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=TIMEOUT)
        if "hello from the task" not in out:
            raise BenchError(f"ssh printed {out!r}")
    return time.monotonic() - began


def _median(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:.2f} s ({min(values):.2f}-{max(values):.2f})"


def run(args: argparse.Namespace) -> int:
    results: dict[str, list[float]] = {arm: [] for arm in ARMS}
    load_before = report.load()
    tmp = make_tmp()
    (tmp / "code").mkdir()
    (tmp / "code" / "hello.py").write_text(HELLO)
    lab = start_lab(2)
    try:
        invs = {"teardown": inventory(lab, tmp, "teardown")}
        invs["kept"] = inventory(lab, tmp, "restart-job")
        for inv in invs.values():  # the cold `up`: what makes the next ones warm
            up_first_line(inv, tmp / "state")
        for rep in range(args.reps):
            order = list(ARMS) if rep % 2 == 0 else list(ARMS)[::-1]
            for arm in order:
                if arm == "by-hand":
                    took = by_hand(lab, tmp)
                else:
                    took = up_first_line(invs[arm], tmp / "state")
                results[arm].append(took)
            _log(f"rep {rep + 1}: " + ", ".join(f"{a} {v[-1]:.2f}s" for a, v in results.items()))
        left = lab.leftovers_of(lab.hosts[:2], settle=30)
        if left:
            raise BenchError(f"left behind: {left}")
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(results["by-hand"])
    print("### a warm `up` on 2 lab hosts: seconds to the task's first line")
    print()
    print("| arm | first line | ÷ by hand |")
    print("| --- | --- | --- |")
    for arm, values in results.items():
        print(f"| {ARMS[arm]} | {_median(values)} | {statistics.median(values) / base:.2f}x |")
    print()
    print(f"medians of {args.reps} run(s), (min-max); plain output into a pipe")
    print()
    print(f"- machine: {report.machine()}")
    print(f"- load averages before / after: {load_before} / {report.load()}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.warmup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--reps", type=int, default=7, help="repetitions of each arm (7)")
    p.add_argument("--out", type=Path, help="also write the table to this file (docs/bench/)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print(f"the bench needs root (namespace lab): sudo {sys.executable} -m bench.warmup")
        return 2
    try:
        with tee_to(args.out, "bench.warmup"):
            return run(args)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
