"""`sudo /opt/tfdeploy/venv/bin/python -m bench.netcheck [--sizes 16,64,128] [--reps 3] [--out F]`

What preflight's network check costs, full and sampled: `tfdeploy check` on one namespace lab of
N hosts (one MWMS worker each, so TF connects every host to every other: N*(N-1) connections),
with `--netcheck full`, `--netcheck sampled` and `--no-netcheck`, in turn, in one run. Prints
medians (min-max) of wall time, what each mode adds to `--no-netcheck`, and the controller's CPU
for the whole `check` (this process: the planning of the probes and the replies' handling).
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
from deployer.config.model import NetcheckMode
from deployer.config.plan import make_plan
from deployer.hosts.fleet import Fleet
from deployer.sources import load_inventory
from deployer.up.deployment import Deployment, UpOptions
from deployer.up.netplan import choose
from deployer.watch.view import PlainView
from tests.lab import start_lab

MODES = (NetcheckMode.FULL, NetcheckMode.SAMPLED, NetcheckMode.OFF)


def check_once(inventory: Path, mode: NetcheckMode) -> tuple[float, float]:
    """One `tfdeploy check` in-process, a fresh fleet (connections included) as the CLI does:
    (wall seconds, controller CPU seconds)."""
    plan = make_plan(load_inventory(inventory))
    began, cpu = time.perf_counter(), time.process_time()
    with Fleet(plan.hosts) as fleet:
        view = PlainView(io.StringIO())
        Deployment(plan, fleet, view, UpOptions(netcheck=mode)).check()
    return time.perf_counter() - began, time.process_time() - cpu


def _cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):.2f} s ({min(samples):.2f}-{max(samples):.2f})"


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.netcheck", description=__doc__)
    p.add_argument("--sizes", default="16,64,128", help="host counts (default 16,64,128)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per cell (3)")
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
        print(
            "| hosts | mode | connections tried | check | --no-netcheck | the check adds "
            "| controller CPU |"
        )
        print("|---|---|---|---|---|---|---|")
        for n in sizes:
            inventory = lab.write_inventory(
                tmp / f"inv{n}.toml",
                tasks=[[{"role": "worker"}]] * n,
                hosts=lab.hosts[:n],
                job={"code": str(tmp / "code"), "name": "netbench"},
            )
            plan = make_plan(load_inventory(inventory))
            check_once(inventory, NetcheckMode.OFF)  # warm-up: installs the agent on every host
            wall: dict[NetcheckMode, list[float]] = {m: [] for m in MODES}
            cpu: dict[NetcheckMode, list[float]] = {m: [] for m in MODES}
            for _ in range(args.reps):
                for mode in MODES:
                    took, used = check_once(inventory, mode)
                    wall[mode].append(took)
                    cpu[mode].append(used)
            off = statistics.median(wall[NetcheckMode.OFF])
            for mode in (NetcheckMode.FULL, NetcheckMode.SAMPLED):
                tried = choose(plan, mode).count
                adds = statistics.median(wall[mode]) - off
                print(
                    f"| {n} | {mode} | {tried:,} of {n * (n - 1):,} | {_cell(wall[mode])} | "
                    f"{_cell(wall[NetcheckMode.OFF])} | {adds:+.2f} s | "
                    f"{statistics.median(cpu[mode]):.2f} s "
                    f"(off: {statistics.median(cpu[NetcheckMode.OFF]):.2f} s) |",
                    flush=True,
                )
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
