"""`sudo /opt/tfdeploy/venv/bin/python -m bench.slurm_logins [--nodes 16] [--max-sessions N]`

How many SSH connections one `tfdeploy up` opens to a Slurm cluster's login node (issue 60): a
lab of one login node and `--nodes` compute nodes (tests/lab/slurm.py), a job of one task per
node that runs a few seconds (`sleep`, no TensorFlow), `reach = "srun"`. Counted on the login
node itself, where nothing but tfdeploy logs in over SSH (the lab runs Slurm's commands with
nsenter):

  opened   sshd's "Accepted publickey" lines during `up` (its log: LogLevel VERBOSE), every
           connection made, whatever it lasted;
  peak     the most ESTABLISHED TCP connections to port 22 inside the login node's network
           namespace at once (`ss`, every 0.1 s);
  refused  sshd's "no more sessions" lines: channels refused by MaxSessions.

`--max-sessions N` runs a second sshd on the login node (port 2222, MaxSessions N, its own
log: tests/support/login_sshd.py) and points the inventory at it: the fall-back to another
connection on a refusal. Measured by hand, not in the suite (a lab of 17 hosts; the suite's
test_slurm_logins.py counts a run on the session's 2 nodes); the counts are in docs/slurm.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.tools import BenchError, make_tmp
from tests.lab import Lab, SlurmCluster, start_lab
from tests.lab.model import VENV_PYTHON
from tests.support.login_sshd import LogSpan, established, lab_log, login_sshd

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 900.0


def _log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def inventory(
    lab: Lab, cluster: SlurmCluster, path: Path, nodes: int, port: int, known_hosts: Path
) -> Path:
    code = path.parent / "code"
    code.mkdir(exist_ok=True)
    path.write_text(
        f"""[job]
name = "logins"
code = "{code}"
command = "sleep 5"
python = "{VENV_PYTHON}"
require_tensorflow = false

[ssh]
user = "{lab.user}"
identity = "{lab.key_path}"
known_hosts = "{known_hosts}"
host_keys = "strict"
connect_timeout = 5
port = {port}

[slurm]
login = "{cluster.login.address}"
partition = "debug"
time = "00:15:00"

[[slurm.hosts]]
nodes = {nodes}
tasks = [{{ role = "worker" }}]
"""
    )
    return path


def measure(lab: Lab, cluster: SlurmCluster, inv: Path, state: Path, log: Path, port: int) -> str:
    span = LogSpan(log)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, established(lab, cluster, port))
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    sampler.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "deployer", "up", str(inv)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=TIMEOUT,
        )
    finally:
        stop.set()
        sampler.join()
    took = time.monotonic() - began
    if done.returncode != 0 or "released allocation" not in done.stdout + done.stderr:
        raise BenchError(f"up exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    seen = span.seen()
    return (
        f"opened {seen.connections}, peak {peak}, refused {seen.refused} "
        f"(up took {took:.0f} s, exit 0)"
    )


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.slurm_logins",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=int, default=16, help="compute nodes (16)")
    p.add_argument("--max-sessions", type=int, help="a second sshd with this MaxSessions")
    args = p.parse_args()
    if os.geteuid() != 0:
        print(f"needs root (namespace lab): sudo {sys.executable} -m bench.slurm_logins")
        return 2
    tmp = make_tmp()
    started = time.monotonic()
    lab = start_lab(args.nodes + 1, slurm=True)
    _log(f"lab of {args.nodes + 1} hosts up in {time.monotonic() - started:.0f} s")
    try:
        cluster = lab.slurm
        assert isinstance(cluster, SlurmCluster)
        with contextlib.ExitStack() as stack:
            port, log, known = 22, lab_log(lab, cluster), lab.known_hosts
            if args.max_sessions is not None:
                alt = stack.enter_context(login_sshd(lab, cluster, args.max_sessions))
                port, log, known = alt.port, alt.log, alt.known_hosts
            inv = inventory(lab, cluster, tmp / "logins.toml", args.nodes, port, known)
            said = measure(lab, cluster, inv, tmp / "state", log, port)
        sessions = args.max_sessions if args.max_sessions is not None else "the lab's (200)"
        print(f"{args.nodes} nodes, login sshd MaxSessions {sessions}: {said}")
        left = cluster.leftovers()
        if left:
            raise BenchError(f"the run left jobs or processes behind: {left}")
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
