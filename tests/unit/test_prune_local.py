"""`tfdeploy prune --local`: this machine's cache of resolved environments freed by the hosts'
rules (deployer/api/prune_local.py): the entry no recent run uses goes, the used one stays.

The cache is filled by real pip resolving from a folder made here (two environments), the runs
by run records as `up` writes them, and the prune runs as the CLI, in a process of its own.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from deployer.envs import uses
from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import cache_root, resolve
from deployer.envs.spec import from_lines
from deployer.results.state import RunRecord, save
from tests.support.lab_cli import tfdeploy
from tests.support.wheels import make_wheel

pytestmark = pytest.mark.slow

X86 = HostPlatform.of("3.11.2", "x86_64", "2.36")


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "index"
    make_wheel(folder, "tinypkg", "1.0", files={"tinypkg.bin": os.urandom(200_000)})
    make_wheel(folder, "tinyextra", "1.0")
    for name, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(folder),
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
        "TFDEPLOY_STATE_DIR": str(tmp_path / "state"),
    }.items():
        monkeypatch.setenv(name, value)
    return tmp_path / "state"


def _run(run_id: str, created: float) -> None:
    save(RunRecord(run_id, "/inv.toml", "job", created, detached=False))


def test_prune_local_removes_the_environment_no_recent_run_uses_and_keeps_the_used_one(
    tmp_path: Path, state: Path
) -> None:
    old = resolve(from_lines(["tinypkg==1.0"], base=tmp_path), X86)
    used = resolve(from_lines(["tinyextra==1.0"], base=tmp_path), X86)
    now = time.time()
    _run("job-old", now - 7200)  # the older run of the job used `old` ...
    _run("job-new", now - 60)  # ... the newest one `used`
    uses.record([old.path], "job-old")
    uses.record([used.path], "job-new")
    dry = tfdeploy("prune", "--local", "--keep", "1", "--grace", "0", "--dry-run", state=state)
    assert dry.returncode == 0, dry.stderr
    said = re.search(
        r"this machine: would free 1 environment and 0 images, ([\d.]+) KiB;", dry.stdout
    )
    assert said is not None and 195 <= float(said.group(1)) < 200, dry.stdout  # in human units
    assert old.path.is_dir() and used.path.is_dir()
    done = tfdeploy("prune", "--local", "--keep", "1", "--grace", "0", state=state)
    assert done.returncode == 0, done.stderr
    assert "this machine: freed 1 environment and 0 images" in done.stdout, done.stdout
    assert "kept 1 entry that recent runs use" in done.stdout, done.stdout
    assert not old.path.exists() and used.path.is_dir(), list(cache_root().iterdir())
    # Keeping two runs of the job, both entries would have stayed: the rule is the runs'.
    entries = [p.name for p in cache_root().iterdir() if p.is_dir() and p.name != ".wheels"]
    assert entries == [used.path.name]  # .wheels: the store the entries' wheels link into


def test_prune_takes_an_inventory_or_local_not_both_nor_neither(state: Path) -> None:
    neither = tfdeploy("prune", state=state)
    assert neither.returncode == 2 and "--local" in neither.stderr + neither.stdout, neither
    both = tfdeploy("prune", "inv.toml", "--local", state=state)
    assert both.returncode == 2 and "Traceback" not in both.stderr, both
