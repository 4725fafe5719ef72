"""An inventory writer bound to one lab: what the `lab_inventory` fixtures hand out, for test
modules with labs of their own (container hosts) as well."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.lab import Lab, LabHost


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
