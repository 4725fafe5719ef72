"""`sudo /opt/tfdeploy/venv/bin/python -m bench.placement`: PSS steps/s with and without placement.

ParameterServerStrategy digits (examples/digits/pss.py): chief + 2 workers + 1 ps on ONE lab host,
so four TF processes share this machine's cores. Each layout runs `--epochs E` of 50 steps; the
rate is taken between the first and the last epoch line (TF start-up excluded).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import tee_to
from tests.lab import start_lab

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "digits"
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
ROLES = ("chief", "worker", "worker", "ps")


def layouts(ncpu: int) -> dict[str, list[dict[str, object]]]:
    """Task tables per layout; 'split' deals the host's CPUs round-robin among its tasks."""
    plain = [{"role": r} for r in ROLES]
    split = [{"role": r, "cpus": str(i % ncpu)} for i, r in enumerate(ROLES)]
    return {
        "default (no threads, no cpus)": plain,
        "threads = 1": [{**t, "threads": 1} for t in plain],
        f"cpus split over {ncpu} cores": split,
        "threads = 1 + cpus split": [{**t, "threads": 1} for t in split],
    }


def steps_per_second(lab, tmp: Path, tasks, epochs: int, steps: int) -> float:
    inv = lab.write_inventory(
        tmp / "pss.toml",
        tasks=[tasks],
        job={
            "name": "pss",
            "code": str(EXAMPLES),
            "command": f"{lab.python} pss.py --epochs {epochs} --steps-per-epoch {steps}",
            "role_commands": {"worker": "tfdeploy:server"},
            "env": TF_ENV,
            "stop_grace": 3,
        },
    )
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp / "state")}
    argv = [sys.executable, "-m", "deployer", "up", str(inv)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    seen: dict[int, float] = {}
    for line in proc.stdout:
        m = re.search(r"^chief:0@\S+\s+\| epoch (\d+) loss", line)
        if m:
            seen[int(m.group(1))] = time.monotonic()
    if proc.wait() != 0 or len(seen) < 2:
        raise RuntimeError(
            f"the PSS job failed (exit {proc.returncode}, epochs seen {sorted(seen)})"
        )
    first, last = min(seen), max(seen)
    return (last - first) * steps / (seen[last] - seen[first])


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--out", type=Path, help="also write the table to this file (docs/bench/)")
    args = p.parse_args()
    with tee_to(args.out, "bench.placement"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    ncpu = len(os.sched_getaffinity(0))
    tmp = Path(tempfile.mkdtemp(prefix="tfdeploy-placement-"))
    lab = start_lab(1)
    results: dict[str, list[float]] = {}
    try:
        for rep in range(args.reps):  # interleaved, so drifting machine load hits every layout
            for name, tasks in layouts(ncpu).items():
                rate = steps_per_second(lab, tmp, tasks, args.epochs, args.steps)
                results.setdefault(name, []).append(rate)
                print(f"rep {rep}: {name}: {rate:.1f} steps/s", file=sys.stderr, flush=True)
    finally:
        lab.stop()
    base = statistics.median(results[next(iter(results))])
    print(
        "| layout (chief + 2 workers + ps on one host) | steps/s, median (min-max) | vs default |"
    )
    print("| --- | --- | --- |")
    for name, rates in results.items():
        med = statistics.median(rates)
        print(f"| {name} | {med:.1f} ({min(rates):.1f}-{max(rates):.1f}) | {med / base:.2f}x |")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    runs = f"{args.reps} runs per layout, {args.epochs} epochs x {args.steps} steps"
    print(f"\n{ncpu} CPUs, {runs}; load average {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
