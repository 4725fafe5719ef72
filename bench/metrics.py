"""`sudo python -m bench.metrics --hosts 16 --tasks-per-host 4 --out docs/bench/metrics.md`:
what watching each task's metrics and resources costs the controller.

One namespace lab, 64 tasks (16 hosts x 4), each reporting a metrics record every 0.1 s for
`--seconds` (through tfdeploy_metrics when it is on the task's PYTHONPATH; otherwise it only
sleeps). An attached `up` watches the job to its end, and `os.wait4` on it gives the
controller's CPU (user + sys). Two arms, side by side and alternated: **on**, this checkout
(every poll carries the tasks' new metric lines and each running task's CPU/RSS sample, and the
controller folds them into the series, the live table and the local store), and **off**, the
commit before the metrics channel (`--baseline`, a `git archive` of it: no metric lines, no
usage sampling). The ratio is controller CPU per host, on / off (target: <= 1.2x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import report
from bench.scale import REPO, Sample, measure
from tests.lab import start_lab

TASK = """
import sys, time
try:
    from tfdeploy_metrics import report
except ImportError:
    report = None
end = time.time() + float(sys.argv[1])
step = 0
while time.time() < end:
    time.sleep(0.1)
    step += 1
    if report is not None:
        report(step, total_steps=100000, loss=1.0 / step, accuracy=0.5)
"""
TARGET = 1.2


def baseline_tree(commit: str, tmp: Path) -> Path:
    tree = tmp / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--tasks-per-host", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--baseline", default="2fc3837")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with report.tee_to(args.out, "bench.metrics"):
        return run(args)


def run(args: argparse.Namespace) -> int:
    report.compile_tfdeploy()
    before = report.load()
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as name:
        tmp = Path(name)
        trees = {"on": REPO, "off": baseline_tree(args.baseline, tmp)}
        code = tmp / "code"
        code.mkdir()
        (code / "task.py").write_text(TASK)
        lab = start_lab(args.hosts)
        try:
            inventory = lab.write_inventory(
                tmp / "metrics.toml",
                tasks=[[{"role": "worker"}] * args.tasks_per_host] * args.hosts,
                job={
                    "code": str(code),
                    "command": f"python3 task.py {args.seconds}",
                    "name": "metricsbench",
                    "require_tensorflow": False,
                },
            )
            samples: dict[str, list[Sample]] = {"on": [], "off": []}
            for rep in range(args.reps + 1):  # the first round is untimed: agents installed
                for arm, tree in trees.items():
                    env = os.environ | {
                        "TFDEPLOY_STATE_DIR": str(tmp / f"state-{arm}"),
                        "PYTHONPATH": str(tree),
                        "NO_COLOR": "1",
                    }
                    argv = [sys.executable, "-m", "deployer", "up", str(inventory)]
                    which = subprocess.run(
                        [sys.executable, "-c", "import deployer; print(deployer.__file__)"],
                        cwd=tree,
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout.strip()
                    assert which.startswith(str(tree)), f"{arm} arm imports {which}"
                    sample = measure(argv, env=env, cwd=tree)  # -m imports from cwd first
                    print(f"# round {rep} {arm}: wall {sample.wall:.1f} s, CPU {sample.cpu:.2f} s")
                    if rep:
                        samples[arm].append(sample)
        finally:
            lab.stop()
    tasks = args.hosts * args.tasks_per_host
    print()
    print(f"{tasks} tasks on {args.hosts} hosts, each reporting every 0.1 s for {args.seconds:g} s")
    print("under an attached `up` (a poll of every host every 0.25 s).")
    print()
    print("| arm | wall | controller CPU | CPU per host | ratio |")
    print("| --- | --- | --- | --- | --- |")
    med = {arm: statistics.median(s.cpu for s in got) for arm, got in samples.items()}
    for arm, got in samples.items():
        walls = statistics.median(s.wall for s in got)
        cpus = ", ".join(f"{s.cpu:.2f}" for s in got)
        per_host = med[arm] / args.hosts * 1000
        ratio = med[arm] / med["off"]
        print(
            f"| metrics {arm} | {walls:.1f} s | {med[arm]:.2f} s ({cpus}) | {per_host:.1f} ms "
            f"| {ratio:.2f}x |"
        )
    ratio = med["on"] / med["off"]
    print()
    print(
        f"Target: metrics on <= {TARGET}x off per host: {'met' if ratio <= TARGET else 'NOT met'}"
        f" ({ratio:.2f}x)."
    )
    print(f"Machine: {report.machine()}. Load average before/after: {before} / {report.load()}.")
    print(
        f"Off is the commit {args.baseline} (before the metrics channel), run from a git "
        "archive of it; on is this checkout. Medians of the timed rounds after one untimed round."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
