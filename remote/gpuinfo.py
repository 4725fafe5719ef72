"""The host's GPUs as nvidia-smi reports them, and the compute processes on them (op `gpus`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import protocol

# Non-interactive SSH commands get sshd's PATH, not a login shell's: Debian's ~/.profile adds
# these two only for logins, so a user's own nvidia-smi (or a wrapper) there is looked up too.
EXTRA_DIRS = ("~/bin", "~/.local/bin")
QUERY_GPU = "index,uuid,name,memory.total,memory.used,utilization.gpu"
QUERY_APPS = "gpu_uuid,pid,used_memory"
TIMEOUT = 15.0


def find_nvidia_smi() -> str | None:
    found = shutil.which("nvidia-smi")
    if found:
        return found
    for directory in EXTRA_DIRS:
        path = os.path.join(os.path.expanduser(directory), "nvidia-smi")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def op_gpus(req: dict[str, Any]) -> protocol.GpusReply:
    """`nvidia_smi` is null when the host has none; `error` says why a present one failed."""
    smi = find_nvidia_smi()
    reply: dict[str, Any] = {"nvidia_smi": smi, "error": None, "gpus": [], "apps": []}
    if smi is None:
        return reply
    rows, error = _query(smi, f"--query-gpu={QUERY_GPU}")
    if error is None:
        apps, error = _query(smi, f"--query-compute-apps={QUERY_APPS}")
    if error is not None:
        reply["error"] = error
        return reply
    reply["gpus"] = [
        {
            "index": int(r[0]),
            "uuid": r[1],
            "name": r[2],
            "memory_total": _number(r[3]),
            "memory_used": _number(r[4]),
            "utilization": _number(r[5]),
        }
        for r in rows
        if len(r) >= 6 and r[0].isdigit()
    ]
    reply["apps"] = [
        {"gpu_uuid": r[0], "pid": _number(r[1]), "used_memory": _number(r[2])}
        for r in apps
        if len(r) >= 3
    ]
    return reply


def _query(smi: str, query: str) -> tuple[list[list[str]], str | None]:
    try:
        done = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"{smi} {query}: {exc}"
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        detail = lines[-1] if lines else "no output"
        return [], f"{smi} exited with code {done.returncode}: {detail}"
    rows = [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines()]
    return [r for r in rows if any(r)], None


def _number(text: str) -> int | None:
    """nvidia-smi writes "[N/A]" or "[Not Supported]" for values some GPUs do not report."""
    try:
        return int(float(text))
    except ValueError:
        return None
