"""Runs on a real workdir through the real agent, for the tests of what the agent keeps and
removes there (tests/unit/test_prune.py, test_checkpoint_dir.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.agent import call, ok

A = "host-a"  # the host identity the calls are made as (TFDEPLOY_HOST_ID)


def make_run(
    workdir: Path, run: str, job: str, contents: list[str], host: str = A, **fields: Any
) -> Path:
    files = [[f"f{i}.txt", digest, 0o600] for i, digest in enumerate(contents)]
    fields = {"detached": True, "lease_seconds": None, **fields}
    ok(call(workdir, "materialize", host=host, run_id=run, job=job, files=files, **fields))
    return workdir / "hosts" / host / "runs" / run


def prune(workdir: Path, keep: int, host: str = A, **fields: Any) -> dict[str, Any]:
    return ok(call(workdir, "prune", host=host, keep=keep, **{"grace": 0, **fields}))
