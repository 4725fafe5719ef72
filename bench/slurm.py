"""`sudo /opt/tfdeploy/venv/bin/python -m bench.slurm [--reps 3] [--epochs 1]
[--only by-hand|tfdeploy] [--out docs/bench/slurm.md]`

Submit to first training step on an idle Slurm cluster (the lab's: tests/lab/slurm.py, a login
node and two compute nodes), examples/digits/mwms.py on two allocated nodes, side by side:

  by hand      examples/digits/mwms.sbatch, the script a user writes without tfdeploy: `sbatch`
               over SSH on the login node, one `srun` task per node, TF_CONFIG built in the
               script from SLURM_* variables, the code and the output on a shared filesystem;
  tfdeploy     `tfdeploy up` of an inventory with `[slurm]` (login node over SSH, partition,
               two nodes), the same code, interpreter and arguments; tfdeploy pushes the code
               through the login node itself (no shared filesystem assumed).

Both use the lab's venv (/opt/tfdeploy/venv) on the nodes, so neither installs anything. The
arms alternate which goes first from one repetition to the next, so load drifts hit both. Phases,
each from the start of the arm: allocated (squeue shows the job RUNNING; tfdeploy: its line
naming the nodes), running (every task printed its first line), first step (every worker printed
"first step done"). After every arm the bench checks that squeue is empty and no process of the
job is left on any host, and stops on anything left.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import report
from bench.report import tee_to
from bench.tools import BenchError, make_tmp
from tests.lab import Lab, SlurmCluster, start_lab
from tests.lab.model import VENV_PYTHON

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"
SCRIPT = DIGITS / "mwms.sbatch"
TIMEOUT = 600.0
RUNNING = "tfdeploy-env"  # mwms.py's first line (common.print_env_banner)
FIRST = re.compile(r"(worker:\d+): first step done")
# Quieter TensorFlow and no oneDNN notice, for both arms alike.
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
ARMS = {
    "by-hand": "by hand (examples/digits/mwms.sbatch)",
    "tfdeploy": "tfdeploy up ([slurm] inventory)",
}


@dataclass
class Sample:
    """One arm's run: seconds from its start to each phase (absent: not seen)."""

    phases: dict[str, float] = field(default_factory=dict)
    total: float = 0.0  # to the job's end (the arm's command returned, squeue empty)
    steps: list[tuple[float, str]] = field(default_factory=list)  # tfdeploy's own lines


def _log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


# -- by hand ------------------------------------------------------------------------------------


def by_hand(lab: Lab, cluster: SlurmCluster, epochs: int) -> Sample:
    """`sbatch mwms.sbatch` over SSH, as a user at the login node; phases from squeue and the
    job's output file (on the shared folder), polled every 0.1 s."""
    s = Sample()
    out = cluster.shared / "by-hand.out"
    out.unlink(missing_ok=True)
    exports = ",".join(["ALL", f"PYTHON={VENV_PYTHON}", *(f"{k}={v}" for k, v in TF_ENV.items())])
    remote = (
        f"cd {shlex.quote(str(DIGITS))} && sbatch --parsable --export={exports} "
        f"-o {shlex.quote(str(out))} mwms.sbatch --epochs {epochs}"
    )
    began = time.monotonic()
    done = subprocess.run(
        lab.ssh_argv(cluster.login, remote), capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise BenchError(f"sbatch failed: {done.stderr.strip()}")
    job = done.stdout.strip().split(";")[0]
    s.phases["submitted"] = time.monotonic() - began
    deadline = began + TIMEOUT
    while time.monotonic() < deadline:
        now = time.monotonic() - began
        state = cluster.job_state(job)
        if "allocated" not in s.phases and state in ("RUNNING", "COMPLETING", "COMPLETED"):
            s.phases["allocated"] = now
        text = out.read_text(errors="replace") if out.exists() else ""
        if "running" not in s.phases and text.count(RUNNING) >= 2:
            s.phases["running"] = now
        if "first" not in s.phases and len(set(FIRST.findall(text))) >= 2:
            s.phases["first"] = now
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            if state != "COMPLETED":
                raise BenchError(f"job {job} ended {state}:\n{text[-1500:]}")
            break
        time.sleep(0.1)
    else:
        cluster.login_run(f"scancel {job}")
        raise BenchError(f"job {job} did not end within {TIMEOUT:.0f}s")
    s.total = time.monotonic() - began
    if "first" not in s.phases:
        raise BenchError(f"not every worker printed 'first step done':\n{text[-1500:]}")
    return s


# -- tfdeploy -----------------------------------------------------------------------------------


def tfdeploy_available() -> str | None:
    """Why the tfdeploy arm cannot run on this checkout, or None (the hook for issue 49's
    source: it runs once deployer/sources/slurm exists)."""
    if not (ROOT / "deployer" / "sources" / "slurm").is_dir():
        return "deployer/sources/slurm is not on this branch (issue 49's tfdeploy side)"
    return None


def inventory(lab: Lab, cluster: SlurmCluster, path: Path, epochs: int) -> Path:
    """The `[slurm]` inventory of the same job: login node over SSH with the lab's keys."""
    env = "".join(f"{k} = {v!r}\n" for k, v in TF_ENV.items()).replace("'", '"')
    path.write_text(
        f"""[job]
name = "digits"
code = "{DIGITS}"
command = "python3 mwms.py --epochs {epochs}"
python = "{VENV_PYTHON}"

[job.env]
{env}
[ssh]
user = "{lab.user}"
identity = "{lab.key_path}"
known_hosts = "{lab.known_hosts}"
host_keys = "strict"
connect_timeout = 5

[slurm]
login = "{cluster.login.address}"
partition = "debug"
time = "00:15:00"

[[slurm.hosts]]
nodes = 2
tasks = [{{ role = "worker" }}]
"""
    )
    return path


def tfdeploy(lab: Lab, cluster: SlurmCluster, inv: Path, state: Path) -> Sample:
    """`tfdeploy up INV` (attached, plain lines) until it exits; phases from its lines."""
    s = Sample()
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "deployer", "up", str(inv)]
    began = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    timer = threading.Timer(TIMEOUT, proc.kill)
    timer.start()
    lines: list[str] = []
    running: set[str] = set()
    first: set[str] = set()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic() - began
            lines.append(line.rstrip("\n"))
            if not re.match(r"\S+@\S+ \| ", line):  # its own steps (not a task's output)
                s.steps.append((now, line.rstrip()))
            if "allocated" not in s.phases and re.search(r"allocation \d+ runs on ", line):
                s.phases["allocated"] = now
            if RUNNING in line:
                running.add(line.split(RUNNING, 1)[0])
                if len(running) >= 2 and "running" not in s.phases:
                    s.phases["running"] = now
            first.update(FIRST.findall(line))
            if len(first) >= 2 and "first" not in s.phases:
                s.phases["first"] = now
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    s.total = time.monotonic() - began
    if rc != 0 or "first" not in s.phases:
        tail = "\n".join(lines[-30:])
        raise BenchError(f"tfdeploy up exited {rc}, first steps seen {sorted(first)}:\n{tail}")
    return s


# -- the run ------------------------------------------------------------------------------------


def _clean(cluster: SlurmCluster, arm: str) -> None:
    left = cluster.leftovers()
    if left:
        raise BenchError(f"{arm} left jobs or processes behind: {left}")


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.1f} s"
    return f"{med:.1f} s ({min(values):.1f}-{max(values):.1f})"


def table(results: dict[str, list[Sample]], reps: int) -> str:
    rows = [
        "| arm | allocated | tasks running | first step | ÷ by hand (first step) | job ended |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    base = [s.phases["first"] for s in results.get("by-hand", [])]
    for arm, samples in results.items():
        if not samples:
            continue

        def col(key: str, samples: list[Sample] = samples) -> list[float]:
            return [s.phases[key] for s in samples if key in s.phases]

        ratio = "-"
        if base and col("first"):
            ratio = f"{statistics.median(col('first')) / statistics.median(base):.2f}x"
        rows.append(
            f"| {ARMS[arm]} | {_median(col('allocated'))} | {_median(col('running'))} | "
            f"{_median(col('first'))} | {ratio} | {_median([s.total for s in samples])} |"
        )
    note = f"medians of {reps} run(s), (min-max); seconds from the arm's start (sbatch / up)"
    return "\n".join(rows) + f"\n\n{note}"


WHY = """What tfdeploy does in each phase that the script does not (its steps below, stamped):

- to allocated: before `sbatch`, an SSH connection to the login node (host key checked), the
  login node's preflight and `sbatch --test-only` (a request Slurm can never meet is refused
  before anything waits); then the allocation's own body, which holds it and ends it if the
  controller's lease lapses. The script is one `sbatch` over SSH.
- to tasks running: the agent reaches every node as an `srun --overlap` step through the login
  node, checks what preflight checks (Python, TensorFlow, ports, GPUs granted), the network check
  between the nodes, and pushes the code into its content store (no shared filesystem assumed);
  the script's tasks start from the shared filesystem with nothing checked.
- to first step: the same program in both arms (TensorFlow's import, the dataset, MWMS's
  collective setup, the first step's tracing). On this machine's two shared cores, under the
  load below, it is most of both totals and varies by tens of seconds from run to run, more
  than the whole difference: a first-step ratio under 1 here is that noise, not tfdeploy
  being faster. tfdeploy's own cost is the "tasks running" difference, a few fixed seconds
  (SSH and checks on the login node, one step per node, preflight, network check, push); where
  TensorFlow starts in seconds (an idle node) those seconds weigh more in the ratio.
- tfdeploy's later repetitions find the code already in the nodes' content store ("every file
  was already there"), as a second `up` on a cluster does; the script reads the shared
  filesystem every time."""


def explain(results: dict[str, list[Sample]]) -> str:
    """The medians' differences per phase and tfdeploy's steps of its median run."""
    hand, tfd = results.get("by-hand", []), results.get("tfdeploy", [])
    if not hand or not tfd:
        return ""
    lines = [WHY, "", "tfdeploy minus by hand, medians:"]
    for key, label in (
        ("allocated", "allocated"),
        ("running", "tasks running"),
        ("first", "first step"),
    ):
        a = statistics.median(s.phases[key] for s in tfd if key in s.phases)
        b = statistics.median(s.phases[key] for s in hand if key in s.phases)
        lines.append(f"- {label}: {a - b:+.1f} s")
    ordered = sorted(tfd, key=lambda s: s.phases["first"])
    middle = ordered[len(ordered) // 2]
    lines += ["", "tfdeploy's own lines in its median run (seconds since `up` started):", ""]
    lines += [f"    {t:6.1f}  {text}" for t, text in middle.steps]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    arms = [args.only] if args.only else list(ARMS)
    if "tfdeploy" in arms and (why := tfdeploy_available()) is not None:
        _log(f"tfdeploy arm skipped: {why}")
        arms.remove("tfdeploy")
    results: dict[str, list[Sample]] = {arm: [] for arm in arms}
    load_before = report.load()
    tmp = make_tmp()
    lab = start_lab(3, slurm=True)
    try:
        cluster = lab.slurm
        assert cluster is not None
        inv = inventory(lab, cluster, tmp / "slurm.toml", args.epochs)
        for rep in range(args.reps):
            # Alternate which arm goes first, so a load trend does not favour one of them.
            for arm in arms if rep % 2 == 0 else arms[::-1]:
                if arm == "by-hand":
                    sample = by_hand(lab, cluster, args.epochs)
                else:
                    sample = tfdeploy(lab, cluster, inv, tmp / f"state-{rep}")
                _clean(cluster, arm)
                phases = ", ".join(f"{k} {v:.1f}s" for k, v in sample.phases.items())
                _log(f"rep {rep + 1} {arm}: {phases}, ended {sample.total:.1f}s")
                results[arm].append(sample)
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"### mwms.py on 2 Slurm nodes (lab: login node + 2 compute nodes), {args.epochs} epoch")
    print()
    print(table(results, args.reps))
    print()
    print(f"- machine: {report.machine()}")
    print(f"- load averages before / after: {load_before} / {report.load()}")
    why = explain(results)
    if why:
        print()
        print(why)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.slurm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions of each arm (3)")
    p.add_argument("--epochs", type=int, default=1, help="mwms.py's --epochs (1)")
    p.add_argument("--only", choices=sorted(ARMS), help="one arm only")
    p.add_argument("--out", type=Path, help="also write the table to this file (docs/bench/)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print(f"the bench needs root (namespace lab): sudo {sys.executable} -m bench.slurm")
        return 2
    try:
        with tee_to(args.out, "bench.slurm"):
            return run(args)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
