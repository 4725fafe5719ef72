"""The TensorFlow-shaped stand-in task, for the lab tests whose subject is tfdeploy (its keeper,
restarts, resumes, checkpoint folders, allocations), not TensorFlow: a TensorFlow process would
cost seconds and half a gigabyte to check nothing TensorFlow does (issue 61).

Like a TF task it reads TF_CONFIG and binds its own port there (what the network check and a
peer expect), saves its progress after every step and resumes from it, writes one metrics
record a step to TFDEPLOY_METRICS, and ends as told. `write(code_dir)` puts it beside a job's
code; the job's command is `PYTHON standin.py STEPS [--fail-at STEP] [--fail-task KIND:INDEX]`.

Where it saves: TFDEPLOY_CHECKPOINT_DIR when the job names one ([job] checkpoint_dir), else
`ckpt/` in its working directory, the run's code folder on its host (`step_on`). What it prints,
as the tests read it:

    checkpoints in DIR
    worker 1 attempt 0 starting at step 0      (or: worker 1 attempt 1 resumed from step 12)
    step 13                                    (each step)
    worker 1 done at step 40

Shaped like the TensorFlow jobs whose checks the tests keep (issue 61):

- `--peers`: before its first step a task dials every other task of TF_CONFIG's cluster (retrying
  until it answers, as MWMS's collectives and a PSS chief's first RPC do) and prints
  `worker 0 reached chief:0 worker:1`: the hosts' network carried the cluster both ways;
- a `ps` task serves its port until it is stopped (`ps 0 serving`), as `server.join()` does;
  `--ps-exit STEP` makes it exit 3 there instead (a crashed ps);
- `--freeze-at STEP` (with `--fail-task`, attempt 0): the task stops there, blocked on a read
  from a peer that never answers (`worker 1 waiting on a peer`), as a hung collective does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.lab import Lab

NAME = "standin.py"

PROGRAM = r"""
import argparse, json, os, socket, sys, threading, time
parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--interval", type=float, default=0.2)
parser.add_argument("--fail-at", type=int, default=-1, help="exit 3 there, on attempt 0 only")
parser.add_argument("--freeze-at", type=int, default=-1, help="block there, on attempt 0 only")
parser.add_argument("--fail-task", default="worker:1")
parser.add_argument("--peers", action="store_true", help="dial every other task first")
parser.add_argument("--ps-exit", type=int, default=-1, help="a ps exits 3 after this many steps")
args = parser.parse_args()
cfg = json.loads(os.environ["TF_CONFIG"])
kind, index = cfg["task"]["type"], cfg["task"]["index"]
me = kind + ":" + str(index)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(cfg["cluster"][kind][index].rsplit(":", 1)[1])))
server.listen()


def answer():  # every dial gets this task's name, as a TF server answers its peers
    while True:
        conn, _ = server.accept()
        conn.sendall(me.encode() + b"\n")
        conn.close()


threading.Thread(target=answer, daemon=True).start()
attempt = os.environ["TFDEPLOY_ATTEMPT"]
if args.peers:
    reached = []
    for peer_kind, addresses in sorted(cfg["cluster"].items()):
        for i, address in enumerate(addresses):
            if (peer_kind, i) == (kind, index):
                continue
            host, port = address.rsplit(":", 1)
            while True:
                try:
                    with socket.create_connection((host, int(port)), timeout=5) as c:
                        reached.append(c.makefile().readline().strip())
                        break
                except OSError:
                    time.sleep(0.2)
    print(kind, index, "reached", " ".join(reached), flush=True)
if kind == "ps":
    print(kind, index, "serving", flush=True)
    for step in range(10**9):
        if step == args.ps_exit:
            print(kind, index, "crashing", flush=True)
            sys.exit(3)
        time.sleep(args.interval)
folder = os.environ.get("TFDEPLOY_CHECKPOINT_DIR") or "ckpt"
os.makedirs(folder, exist_ok=True)
ckpt = os.path.join(folder, kind + "-" + str(index))
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print("checkpoints in", os.path.abspath(folder), flush=True)
said = "resumed from step" if step else "starting at step"
print(kind, index, "attempt", attempt, said, step, flush=True)
chosen = attempt == "0" and args.fail_task == me
while step < args.steps:
    if chosen and step == args.fail_at:
        print(kind, index, "failing at step", step, flush=True)
        sys.exit(3)
    if chosen and step == args.freeze_at:
        print(kind, index, "waiting on a peer", flush=True)
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        socket.create_connection(silent.getsockname()).recv(1)  # nobody ever writes
    time.sleep(args.interval)
    step += 1
    with open(ckpt + ".part", "w") as f:
        f.write(str(step))
    os.replace(ckpt + ".part", ckpt)
    print("step", step, flush=True)
    with open(os.environ["TFDEPLOY_METRICS"], "a") as metrics:  # one record a step, as TF's
        metrics.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\n")
print(kind, index, "done at step", step, flush=True)
"""


def write(code: Path) -> str:
    """The stand-in beside a job's code (made if missing); its file name, for the command."""
    code.mkdir(parents=True, exist_ok=True)
    (code / NAME).write_text(PROGRAM)
    return NAME


def step_on(lab: Lab, host: Any, run_id: str, task: str, folder: str = "") -> int:
    """A task's saved step on its host (0 before its first save): in its run's `ckpt/`, or in
    `folder` (a job's checkpoint_dir as the host resolved it, a glob is fine)."""
    where = folder or f"~/.tfdeploy/hosts/*/runs/{run_id}/code/ckpt"
    path = f"{where}/{task.replace(':', '-')}"
    said = lab.run(host, ["sh", "-c", f"cat {path} 2>/dev/null || echo 0"]).stdout.split()
    return int(said[-1]) if said else 0
