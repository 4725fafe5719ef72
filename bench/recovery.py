"""`sudo /opt/tfdeploy/venv/bin/python -m bench.recovery [--reps 3] [--out docs/bench/recovery.md]`

Recovery time of a 3-host MultiWorkerMirroredStrategy job (examples/digits/mwms.py, one worker
per lab host, every epoch checkpointed into the host's /tmp and resumed from) after one worker
is SIGKILLed on its host, from the kill to the first step of the next attempt, side by side:

  keeper    `up --detach` of the job with on_failure = "restart-job": its keeper, on the first
            host, stops the attempt, waits restart_backoff (1 s) and starts every worker again;
            no tfdeploy command runs on this machine meanwhile;
  by hand   the same job with no policy, restarted as a user does: `tfdeploy down RUN`, then
            `tfdeploy up --detach INVENTORY`, typed the moment the worker died (no reaction
            time counted: a person is slower).

Both arms wait until each worker finished epoch 2 (its checkpoint saved) before the kill, and
resume from that checkpoint. First step: the first `first step done` line of the next attempt
(worker:0's log, read on its host). Where the keeper's seconds go is read from its record
(keeper.json): seen (the kill noticed by its poll), stopped and backed off (every task stopped:
MWMS takes the SIGTERM, so stop_grace runs out), running (every worker started again), and
TensorFlow's own start to its first step. After every arm the bench stops the run and checks
that nothing is left on any host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import report
from bench.report import tee_to
from bench.tools import BenchError, make_tmp
from tests.lab import Lab, start_lab
from tests.lab.model import LabHost
from tests.support.faults import pids_of

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"
TIMEOUT = 300.0
HOSTS = 3
EPOCHS = 40  # longer than the bench looks: each run is stopped once it trained again
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
ARMS = {
    "keeper": "its keeper (`up --detach`, restart-job)",
    "by-hand": "by hand (`down`, then `up --detach`)",
}
FIRST = "first step done"


@dataclass
class Sample:
    """One arm's recovery: seconds from the kill to each phase (absent: not known)."""

    phases: dict[str, float] = field(default_factory=dict)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _tfdeploy(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "deployer", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=TIMEOUT,
    )
    if done.returncode != 0:
        raise BenchError(f"tfdeploy {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def inventory(lab: Lab, path: Path, policy: str, tag: str) -> Path:
    job = {
        "name": f"recovery-{policy}",
        "code": str(DIGITS),
        "command": f"python3 mwms.py --epochs {EPOCHS} --checkpoint-dir /tmp/ckpt-{tag}",
        "on_failure": policy,
        "max_restarts": 1,
        "restart_backoff": 1,
        "stop_grace": 2,
        "env": TF_ENV,
    }
    return lab.write_inventory(path, tasks=[[{"role": "worker"}]] * HOSTS, job=job)


def _run_file(lab: Lab, host: LabHost, run_id: str, name: str) -> str:
    found = lab.run(host, ["sh", "-c", f"cat ~/.tfdeploy/hosts/*/runs/{run_id}/{name}"])
    return str(found.stdout)


def _count(lab: Lab, host: LabHost, run_id: str, text: str) -> int:
    return _run_file(lab, host, run_id, "tasks/worker-0/output.log").count(text)


def _wait(what: str, ready: Any, timeout: float = TIMEOUT) -> float:
    """Polls `ready()` every 0.1 s; the time.time() at which it first held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return time.time()
        time.sleep(0.1)
    raise BenchError(f"timed out waiting for {what}")


def _up(state: Path, inv: Path) -> str:
    out = _tfdeploy(state, "up", "--detach", str(inv)).stdout
    found = re.search(r"\(run (\S+)\)$", out, re.MULTILINE)
    if not found:
        raise BenchError(f"no run id in up's output:\n{out}")
    return found.group(1)


def _trained(lab: Lab, run_id: str) -> None:
    h1 = lab.hosts[0]
    _wait("epoch 2", lambda: _count(lab, h1, run_id, "epoch 2 loss") >= 1)


def _kill(lab: Lab) -> float:
    victim = lab.hosts[HOSTS - 1]
    pids = pids_of(lab, victim, "mwms.py")
    if len(pids) != 1:
        raise BenchError(f"expected one mwms.py on {victim.name}, found {pids}")
    lab.run(victim, ["kill", "-KILL", str(pids[0])])
    return time.time()


def keeper_arm(lab: Lab, tmp: Path, rep: int) -> Sample:
    state = tmp / f"keeper-{rep}"
    inv = inventory(lab, tmp / f"keeper-{rep}.toml", "restart-job", f"k{rep}")
    run_id = _up(state, inv)
    h1 = lab.hosts[0]
    _trained(lab, run_id)
    killed = _kill(lab)
    first = _wait("the next attempt's first step", lambda: _count(lab, h1, run_id, FIRST) >= 2)
    events = json.loads(_run_file(lab, h1, run_id, "keeper.json"))["events"]
    restart = next(e for e in events if "restart_job" in e)
    started = next(e for e in events if "started" in e)
    s = Sample()
    s.phases["seen"] = restart["t"] - killed
    s.phases["running"] = s.phases["seen"] + started["after_s"]
    s.phases["first"] = first - killed
    _tfdeploy(state, "down", run_id)
    return s


def by_hand_arm(lab: Lab, tmp: Path, rep: int) -> Sample:
    state = tmp / f"hand-{rep}"
    inv = inventory(lab, tmp / f"hand-{rep}.toml", "teardown", f"h{rep}")
    run_id = _up(state, inv)
    h1 = lab.hosts[0]
    _trained(lab, run_id)
    killed = _kill(lab)
    s = Sample()
    _tfdeploy(state, "down", run_id)
    s.phases["seen"] = 0.0  # the user saw it at once
    s.phases["stopped"] = time.time() - killed
    again = _up(state, inv)
    s.phases["running"] = time.time() - killed
    first = _wait("the new run's first step", lambda: _count(lab, h1, again, FIRST) >= 1)
    s.phases["first"] = first - killed
    resumed = _count(lab, h1, again, "resumed from")
    if not resumed:
        raise BenchError(f"run {again} did not resume from the checkpoint")
    _tfdeploy(state, "down", again)
    return s


def _clean(lab: Lab, arm: str) -> None:
    left = lab.leftovers_of(lab.hosts[:HOSTS], settle=30)
    if left:
        raise BenchError(f"{arm} left processes behind: {left}")


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.1f} s"
    return f"{med:.1f} s ({min(values):.1f}-{max(values):.1f})"


def table(results: dict[str, list[Sample]], reps: int) -> str:
    rows = [
        "| arm | failure seen | tasks running again | first step again | ÷ by hand |",
        "| --- | --- | --- | --- | --- |",
    ]
    base = [s.phases["first"] for s in results.get("by-hand", [])]
    for arm, samples in results.items():

        def col(key: str, samples: list[Sample] = samples) -> list[float]:
            return [s.phases[key] for s in samples if key in s.phases]

        ratio = "-"
        if base and col("first"):
            ratio = f"{statistics.median(col('first')) / statistics.median(base):.2f}x"
        rows.append(
            f"| {ARMS[arm]} | {_median(col('seen'))} | {_median(col('running'))} | "
            f"{_median(col('first'))} | {ratio} |"
        )
    note = f"medians of {reps} run(s), (min-max); seconds from the SIGKILL of worker:2"
    return "\n".join(rows) + f"\n\n{note}"


WHY = """Where the seconds go:

- failure seen: the keeper polls every host's warden once a second; the by-hand arm is given a
  user who notices at once (zero), which no person is.
- to tasks running: the keeper stops the two workers left (MWMS takes the SIGTERM and keeps
  waiting on its dead peer, so each runs out `stop_grace`, 2 s, and is SIGKILLed), waits
  `restart_backoff` (1 s) and starts the three workers again through their wardens, over the
  cluster network, in one round. By hand: `down` (SSH to each host, the same stop and grace),
  then a whole `up`: SSH connections, preflight, the network check, the push (nothing new:
  every file already there), the environment check and the start.
- to first step: the same program in both arms (TensorFlow's import, the dataset, MWMS's
  collective setup, the checkpoint's restore, the first step's tracing): most of the total on
  this machine's two shared cores, and it varies by seconds from run to run."""


def run(args: argparse.Namespace) -> int:
    results: dict[str, list[Sample]] = {arm: [] for arm in ARMS}
    load_before = report.load()
    tmp = make_tmp()
    lab = start_lab(HOSTS)
    try:
        for rep in range(args.reps):
            for arm in list(ARMS) if rep % 2 == 0 else list(ARMS)[::-1]:
                arm_of = keeper_arm if arm == "keeper" else by_hand_arm
                sample = arm_of(lab, tmp, rep)
                _clean(lab, arm)
                phases = ", ".join(f"{k} {v:.1f}s" for k, v in sample.phases.items())
                _log(f"rep {rep + 1} {arm}: {phases}")
                results[arm].append(sample)
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"### mwms.py on {HOSTS} lab hosts: a worker SIGKILLed, to the next first step")
    print()
    print(table(results, args.reps))
    print()
    print(f"- machine: {report.machine()}")
    print(f"- load averages before / after: {load_before} / {report.load()}")
    print()
    print(WHY)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.recovery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions of each arm (3)")
    p.add_argument("--out", type=Path, help="also write the table to this file (docs/bench/)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print(f"the bench needs root (namespace lab): sudo {sys.executable} -m bench.recovery")
        return 2
    try:
        with tee_to(args.out, "bench.recovery"):
            return run(args)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
