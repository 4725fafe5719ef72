"""The README's local demo (`tfdeploy up inventories/local.toml`) from Python: a two-worker
MultiWorkerMirroredStrategy job on this machine, through tfdeploy's Python API (docs/api.md).

    python examples/api_local.py                    # start detached, wait, read logs, pull, down
    python examples/api_local.py --attached         # one call that blocks until the job ends
    python examples/api_local.py --epochs 1 --port 23000 --workdir /tmp/tfd --to /tmp/runs

It builds the inventory as a dict (the shape of inventories/local.toml) and runs the tasks with
this script's own interpreter, which must have TensorFlow (`pip install -e '.[examples]'`).
Exit status 0 when the job succeeded and nothing of it runs any more.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from deployer.api import PlainView, Result, TfdeployError, up

HERE = Path(__file__).resolve().parent


def inventory(*, epochs: int, port: int, python: str, workdir: str | None) -> dict[str, Any]:
    """inventories/local.toml as a dict; `code` is relative to `base` (this folder)."""
    job: dict[str, Any] = {
        "name": "digits-api",
        "code": "digits",
        "command": f"{python} mwms.py --epochs {epochs}",
        "python": python,
        "port": port,
        "env": {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"},
        "start_timeout": 60,
        "stop_grace": 5,
    }
    if workdir:
        job["workdir"] = workdir
    host = {
        "name": "local",
        "address": "127.0.0.1",
        "transport": "local",
        "tasks": [{"role": "worker", "count": 2}],
    }
    return {"job": job, "hosts": [host]}


def detached(spec: dict[str, Any], to: str, verbose: bool) -> Result:
    """A pipeline's shape: start, then look at the run through its handle."""
    view = PlainView(sys.stdout) if verbose else None  # None: the API prints nothing
    run = up(spec, base=HERE, detach=True, view=view)
    print(f"started {run.id}")
    for task in run.status():
        print(f"  {task.label}: {task.state} (pid {task.pid})")
    try:
        result = run.wait(timeout=600)
        for line in run.logs(task="worker:0", tail=2):
            print(f"  {line.label} | {line.text}")
        pulled = run.pull(["ckpt/**"], to)
        print(f"  {pulled.summary()}")
        return result
    finally:
        stopped = run.down()  # the job has ended: nothing should be left to stop
        print(f"down: stopped something on {', '.join(stopped)}" if stopped else "down: clean")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--port", type=int, default=22220, help="first TF port (two are used)")
    parser.add_argument("--python", default=sys.executable, help="the tasks' interpreter")
    parser.add_argument("--workdir", help="the host's tfdeploy folder (default ~/.tfdeploy)")
    parser.add_argument("--to", default="tfdeploy-runs", help="where pulled files land")
    parser.add_argument("--attached", action="store_true", help="one blocking up() call")
    parser.add_argument("--verbose", action="store_true", help="print tfdeploy's events too")
    args = parser.parse_args(argv)
    spec = inventory(epochs=args.epochs, port=args.port, python=args.python, workdir=args.workdir)
    try:
        if args.attached:
            result = up(spec, base=HERE, view=PlainView(sys.stdout) if args.verbose else None)
        else:
            result = detached(spec, args.to, args.verbose)
    except TfdeployError as exc:  # typed: JobFailed, HostsFailed, InventoryError, ...
        print(f"failed: {exc.message} (run {exc.run_id})", file=sys.stderr)
        return int(exc.exit_status)
    ended = ", ".join(f"{t.label} {t.outcome}" for t in result.tasks)
    print(f"run {result.run_id} {'succeeded' if result.succeeded else 'failed'}: {ended}")
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
