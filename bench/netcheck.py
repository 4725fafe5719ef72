"""`sudo /opt/tfdeploy/venv/bin/python -m bench.netcheck [--sizes 8,32] [--reps 5] [--out F]`

What preflight's network check costs: `tfdeploy check` on one namespace lab of N hosts (one MWMS
worker each, so every host connects to every other: N*(N-1) connections), with the check and
with `--no-netcheck`, alternating, in one run. Prints medians (min-max) and the difference.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench.report import tee_to
from bench.tools import make_tmp
from deployer.config.plan import make_plan
from deployer.hosts.fleet import Fleet
from deployer.sources import load_inventory
from deployer.up.deployment import Deployment, UpOptions
from deployer.watch.view import PlainView
from tests.lab import start_lab


def check_seconds(inventory: Path, netcheck: bool) -> float:
    """One `tfdeploy check` in-process: a fresh fleet (connections included), as the CLI does."""
    plan = make_plan(load_inventory(inventory))
    began = time.perf_counter()
    with Fleet(plan.hosts) as fleet:
        view = PlainView(io.StringIO())
        Deployment(plan, fleet, view, UpOptions(netcheck=netcheck)).check()
    return time.perf_counter() - began


def _cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):.2f} s ({min(samples):.2f}-{max(samples):.2f})"


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.netcheck", description=__doc__)
    p.add_argument("--sizes", default="8,32", help="host counts (default 8,32)")
    p.add_argument("--reps", type=int, default=5, help="repetitions per cell (5)")
    p.add_argument("--out", type=Path, help="also write the table to this file (docs/bench/)")
    args = p.parse_args()
    with tee_to(args.out, "bench.netcheck"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    sizes = [int(n) for n in args.sizes.split(",")]
    lab = start_lab(max(sizes))
    tmp = make_tmp()
    try:
        (tmp / "code").mkdir(exist_ok=True)
        (tmp / "code" / "train.py").write_text("print('hi')\n")
        print("| hosts | connections | check | --no-netcheck | the network check costs |")
        print("|---|---|---|---|---|")
        for n in sizes:
            inventory = lab.write_inventory(
                tmp / f"inv{n}.toml",
                tasks=[[{"role": "worker"}]] * n,
                hosts=lab.hosts[:n],
                job={"code": str(tmp / "code"), "name": "netbench"},
            )
            check_seconds(inventory, True)  # warm-up: installs the agent on every host
            on: list[float] = []
            off: list[float] = []
            for _ in range(args.reps):
                on.append(check_seconds(inventory, True))
                off.append(check_seconds(inventory, False))
            cost = statistics.median(on) - statistics.median(off)
            print(f"| {n} | {n * (n - 1)} | {_cell(on)} | {_cell(off)} | {cost:+.2f} s |")
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
