"""The host's GPUs as nvidia-smi reports them, their health, and the compute processes on them
(op `gpus`)."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import hostfacts
import procs
import protocol

QUERY_GPU = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "pci.bus_id",
    "driver_version",
)
QUERY_APPS = "gpu_uuid,pid,process_name,used_memory"
TIMEOUT = 15.0
# What nvidia-smi prints for a field it does not know (exit code 2), and for a GPU it cannot
# reach (exit code 15), in its own words.
NOT_A_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
LOST = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu )?\s*([0-9A-Fa-f:.]+): (.*)"
)
# Values that only say the GPU does not report a field: no problem. Any other bracketed value
# ("[GPU requires reset]", "[Unknown Error]", "[GPU is lost]") is the GPU's own alarm.
NOT_REPORTED = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Insufficient Permissions]")
# A GPU index and a reported amount as nvidia-smi writes them: ASCII decimals of sane length.
DECIMAL = re.compile(r"[0-9]{1,4}")
NUMBER = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,6})?")


def op_gpus(req: dict[str, Any]) -> protocol.GpusReply:
    """`nvidia_smi` is null when the host has none; `error` says why a present one failed."""
    smi = hostfacts.nvidia_smi()
    reply: protocol.GpusReply = {
        "nvidia_smi": smi,
        "error": None,
        "gpus": [],
        "apps": [],
        "lost": [],
    }
    if smi is None:
        return reply
    fields, (rows, lost, error) = _query_gpus(smi)
    if error is None:
        apps, _, error = _query(smi, f"--query-compute-apps={QUERY_APPS}")
    if error is not None:
        reply["error"] = error
        return reply
    gpus = [_gpu(dict(zip(fields, r))) for r in rows if len(r) == len(fields)]
    reply["gpus"] = [g for g in gpus if g is not None]
    reply["lost"] = [{"pci_bus_id": bus, "reason": why} for bus, why in lost]
    run_id = req.get("run_id")
    reply["apps"] = [_app(r, run_id) for r in apps if len(r) >= 4]
    return reply


def _app(row: list[str], run_id: str | None) -> protocol.GpuAppShape:
    pid = _number(row[1])
    run, task = _of_run(pid, run_id) if run_id else (None, None)
    return {
        "gpu_uuid": row[0],
        "pid": pid,
        "process_name": row[2],
        "used_memory": _number(row[3]),
        "run": run,
        "task": task,
    }


def _query_gpus(
    smi: str,
) -> tuple[list[str], tuple[list[list[str]], list[tuple[str, str]], str | None]]:
    """The GPU rows with every health field this driver knows: one it does not is dropped
    (an older driver has no row remapping, say) and the query asked again."""
    fields = list(QUERY_GPU) + list(protocol.GPU_HEALTH_FIELDS)
    while True:
        result = _query(smi, f"--query-gpu={','.join(fields)}")
        unknown = NOT_A_FIELD.search(result[2] or "")
        if unknown is None or unknown.group(1) not in protocol.GPU_HEALTH_FIELDS:
            return fields, result
        fields.remove(unknown.group(1))


def _gpu(row: dict[str, str]) -> protocol.GpuShape | None:
    if not DECIMAL.fullmatch(row["index"]):  # "²" is a digit to str.isdigit, not to int()
        return None
    alarms = [v for v in row.values() if v.startswith("[") and v not in NOT_REPORTED]
    return {
        "index": int(row["index"]),
        "uuid": row["uuid"],
        "name": row["name"],
        "memory_total": _number(row["memory.total"]),
        "memory_used": _number(row["memory.used"]),
        "utilization": _number(row["utilization.gpu"]),
        "pci_bus_id": row["pci.bus_id"],
        "driver_version": row["driver_version"],
        "health": {f: row[f] for f in protocol.GPU_HEALTH_FIELDS if f in row},
        "problem": alarms[0] if alarms else None,
    }


def _query(smi: str, query: str) -> tuple[list[list[str]], list[tuple[str, str]], str | None]:
    """(CSV rows, GPUs it cannot reach, error). A GPU fallen off the bus makes nvidia-smi exit
    15 after the other GPUs' rows: those rows and the lost GPU are the answer, not an error."""
    try:
        done = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], [], f"{smi} {query}: {exc}"
    rows, lost = [], []
    for line in done.stdout.splitlines():
        gone = LOST.match(line.strip())
        if gone:
            lost.append((gone.group(1), gone.group(2).strip()))
        elif "," in line or (line.strip() and done.returncode == 0):
            rows.append([c.strip() for c in line.split(",")])
    if done.returncode != 0 and not lost:
        lines = (done.stdout + done.stderr).strip().splitlines()
        detail = lines[-1] if lines else "no output"
        return [], [], f"{smi} exited with code {done.returncode}: {detail}"
    return [r for r in rows if any(r)], lost, None


def _of_run(pid: int | None, run_id: str) -> tuple[bool | None, str | None]:
    """Whether the process's environment carries TFDEPLOY_RUN_ID=run_id, and then its
    TFDEPLOY_TASK: the environment, not the pid, because the process on the GPU is often not
    the task's own (a shell, a launcher such as torchrun, a DataLoader worker) and may have
    left the task's process group (setsid); children inherit the environment whatever they do.
    (None, None) when this host cannot tell: a pid of another PID namespace (a container) or
    user."""
    if pid is None:
        return None, None
    env = procs.environ(pid)
    if env is None:
        return None, None
    if env.get(protocol.RUN_ID_ENV) != run_id:
        return False, None
    return True, env.get(protocol.TASK_ENV)


def _number(text: str) -> int | None:
    """nvidia-smi writes "[N/A]" or "[Not Supported]" for values some GPUs do not report; a
    value that is no plain decimal ("inf", "1e400", "²") is not reported either, never a crash
    of the whole op (int(float("inf")) raises OverflowError)."""
    if not NUMBER.fullmatch(text):
        return None
    return int(float(text))
