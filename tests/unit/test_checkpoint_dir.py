"""[job] checkpoint_dir through the real agent on a real workdir: the folder every attempt and
every later run of a job finds (TFDEPLOY_CHECKPOINT_DIR), made before the task starts, kept
by `prune` while the job has a run on the host and removed with its last one; a folder the
user named by its absolute path is theirs, never removed."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import call, ok, wait_for
from tests.support.agent_runs import A, make_run, prune

pytestmark = pytest.mark.timeout(60)

# Prints the folder it was given and leaves a checkpoint in it.
TASK = 'echo "dir=$TFDEPLOY_CHECKPOINT_DIR"; echo 7 > "$TFDEPLOY_CHECKPOINT_DIR/step"'


def _start(workdir: Path, run: str, checkpoint_dir: str) -> None:
    task = {"name": "worker:0", "command": TASK, "env": {}, "checkpoint_dir": checkpoint_dir}
    ok(call(workdir, "start", host=A, run_id=run, tasks=[task], grace=1))


def _said_dir(workdir: Path, run: str) -> str:
    log = workdir / "hosts" / A / "runs" / run / "tasks" / "worker-0" / "output.log"
    said: Any = wait_for(lambda: log.is_file() and "dir=" in log.read_text() and log.read_text())
    line = next(x for x in str(said).splitlines() if x.startswith("dir="))
    return line.removeprefix("dir=")


def _ended(workdir: Path, run: str) -> None:
    exits = workdir / "hosts" / A / "runs" / run / "tasks" / "worker-0" / "exit.json"
    wait_for(exits.is_file)


def test_every_run_of_a_job_finds_its_folder_and_prune_removes_it_with_the_last_run(
    workdir: Path,
) -> None:
    own = workdir / "hosts" / A / "jobs" / "demo" / "ckpt"
    for run in ("demo-1", "demo-2"):
        make_run(workdir, run, "demo", [])
        _start(workdir, run, "ckpt")
        assert _said_dir(workdir, run) == str(own)
        _ended(workdir, run)
    assert (own / "step").read_text() == "7\n"
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    assert prune(workdir, keep=1)["checkpoints"] == []  # demo-2 is left: the job's folder stays
    assert own.is_dir()
    dry = prune(workdir, keep=0, dry_run=True)
    assert dry["checkpoints"] == ["demo"] and own.is_dir()
    reply = prune(workdir, keep=0)
    assert reply["checkpoints"] == ["demo"] and reply["bytes"] >= 2
    assert not (workdir / "hosts" / A / "jobs" / "demo").exists()


def test_a_folder_named_by_its_path_is_the_users_and_stays(workdir: Path, tmp_path: Path) -> None:
    mine = tmp_path / "shared" / "ckpt"
    make_run(workdir, "demo-1", "demo", [])
    _start(workdir, "demo-1", str(mine))
    assert _said_dir(workdir, "demo-1") == str(mine)
    _ended(workdir, "demo-1")
    assert prune(workdir, keep=0)["checkpoints"] == []
    assert (mine / "step").read_text() == "7\n"


@pytest.mark.parametrize("bad", ["../other-job", "a/../../x", ""])
def test_a_relative_folder_never_leaves_the_jobs_own(workdir: Path, bad: str) -> None:
    make_run(workdir, "demo-1", "demo", [])
    task = {"name": "worker:0", "command": "true", "env": {}, "checkpoint_dir": bad}
    reply = call(workdir, "start", host=A, run_id="demo-1", tasks=[task], grace=1)
    assert reply["ok"] is False, reply
    assert not (workdir / "hosts" / A / "jobs").exists()


def test_the_folder_rides_in_the_recorded_env_for_a_keepers_restart(workdir: Path) -> None:
    make_run(workdir, "demo-1", "demo", [])
    _start(workdir, "demo-1", "ckpt")
    _ended(workdir, "demo-1")
    spec = workdir / "hosts" / A / "runs" / "demo-1" / "tasks" / "worker-0" / "spec.json"
    assert "TFDEPLOY_CHECKPOINT_DIR" in spec.read_text()
    assert os.stat(spec).st_mode & 0o077 == 0


def test_the_inventory_key_names_a_folder_of_the_job_or_of_the_user(tmp_path: Path) -> None:
    from deployer.config.inventory import load_inventory
    from deployer.core.errors import InventoryError
    from tests.support.helpers import JOB, load, write_toml

    one_host = JOB + '[[hosts]]\naddress = "10.0.0.1"\ntasks = [{ role = "chief" }]\n'
    assert load(tmp_path, one_host).job.checkpoint_dir is None
    with_key = one_host.replace("[[hosts]]", 'checkpoint_dir = "ckpt"\n[[hosts]]', 1)
    assert load(tmp_path, with_key).job.checkpoint_dir == "ckpt"
    for bad in ('"../elsewhere"', '"a/../../b"', '""', '"x\\ny"'):
        text = one_host.replace("[[hosts]]", f"checkpoint_dir = {bad}\n[[hosts]]", 1)
        with pytest.raises(InventoryError, match="checkpoint_dir"):
            load_inventory(write_toml(tmp_path, text))
