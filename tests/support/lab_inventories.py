"""An inventory writer bound to one lab: what the `lab_inventory` fixtures hand out, for test
modules with labs of their own (container hosts) as well."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.lab import Lab, LabError, LabHost
from tests.lab.inventory import _table


def inventory_writer(lab: Lab, tmp_path: Path, default_user: str) -> Callable[..., Path]:
    """`write(tasks, code=, job=, ssh=, hosts=, user=, per_host=)`: an inventory in `tmp_path`."""

    def write(
        tasks: list[list[dict[str, Any]]],
        *,
        code: str | Path | None = None,
        job: dict[str, Any] | None = None,
        ssh: dict[str, Any] | None = None,
        hosts: list[LabHost] | None = None,
        name: str = "inventory.toml",
        user: str | None = None,
        per_host: dict[str, dict[str, Any]] | None = None,
    ) -> Path:
        job_table = {"code": str(code or tmp_path)} | (job or {})
        return lab.write_inventory(
            tmp_path / name,
            tasks=tasks,
            job=job_table,
            ssh=ssh,
            hosts=hosts,
            user=user or default_user,
            per_host=per_host,
        )

    return write


def login_ssh(lab: Lab, user: str | None = None) -> dict[str, Any]:
    """An inventory's `[ssh]` table for the lab's hosts: its keys, its known_hosts, strict."""
    return {
        "user": user or lab.user,
        "identity": str(lab.key_path),
        "known_hosts": str(lab.known_hosts),
        "host_keys": "strict",
        "connect_timeout": 5,
    }


def write_slurm_inventory(
    lab: Lab, path: str | Path, *, job: dict[str, Any], user: str | None = None
) -> Path:
    """A `[slurm]` inventory for a lab started with its Slurm cluster (`tests.lab up N --slurm`):
    the login node (h1) reached over SSH with the lab's keys, every compute node allocated as
    one group of workers in partition `debug` (docs/slurm.md, "Practise on the lab")."""
    slurm = getattr(lab, "slurm", None)
    if slurm is None:
        raise LabError("a [slurm] inventory needs a lab started with its Slurm cluster")
    document = {
        "job": {"python": lab.python, "workdir": "~/.tfdeploy", "port": 2222, **job},
        "ssh": login_ssh(lab, user),
        "slurm": {
            "login": slurm.login.address,
            "partition": "debug",
            "time": "00:30:00",
            "hosts": [{"nodes": len(slurm.nodes), "tasks": [{"role": "worker"}]}],
        },
    }
    lines = [line for key, table in document.items() for line in [*_table(f"[{key}]", table), ""]]
    out = Path(path)
    out.write_text("\n".join(lines))
    return out
