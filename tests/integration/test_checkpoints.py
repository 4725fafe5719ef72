"""[job] checkpoint_dir on the lab: a run that died early leaves its checkpoint in the job's
own folder on each host, and the next `up` of the job resumes from it instead of starting at
step 0 (issue 59: it started at epoch 1, its checkpoint left in the dead run's folder).

The task is TF-shaped (tests/support/standin.py; no TensorFlow: the subject is where tfdeploy
keeps the checkpoint): it reads TF_CONFIG, binds its port, saves a step counter into
TFDEPLOY_CHECKPOINT_DIR after each step and resumes from it, as examples/digits/mwms.py does
with a real checkpoint there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.lab.base import wait_until
from tests.support import standin
from tests.support.faults import tfdeploy

pytestmark = pytest.mark.lab

STEPS = 30


def _step(lab: Lab, host: Any, job: str, task: str) -> int:
    """A task's saved step in the job's own checkpoint folder on its host."""
    return standin.step_on(lab, host, "", task, folder=f"~/.tfdeploy/hosts/*/jobs/{job}/ckpt")


def test_the_next_run_of_a_job_resumes_from_the_checkpoint_of_one_that_died(
    lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    h1, h2 = lab.hosts[:2]
    code = tmp_path / "code"
    code.mkdir()
    standin.write(code)
    job = {"name": "ckptjob", "command": f"{lab.python} {standin.NAME} {STEPS}"}
    inventory = lab_inventory(
        [[{"role": "worker"}]] * 2, code=code, job=job | {"checkpoint_dir": "ckpt"}
    )
    state = tmp_path / "state"
    first = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    assert "checkpoints: TFDEPLOY_CHECKPOINT_DIR is job 'ckptjob''s own folder" in first.stdout
    found = re.search(r"\(run (\S+)\)$", first.stdout, re.MULTILINE)
    assert found, first.stdout
    wait_until("worker:1 to pass step 5", lambda: _step(lab, h2, "ckptjob", "worker-1") >= 5, 60)
    tfdeploy("down", found.group(1), state=state, check_rc=0)  # the run dies early
    died = tfdeploy("logs", found.group(1), state=state, check_rc=0).stdout
    saved = {h.name: _step(lab, h, "ckptjob", f"worker-{i}") for i, h in enumerate((h1, h2))}

    second = tfdeploy("up", str(inventory), state=state, check_rc=0, timeout=180)
    for i, host in enumerate((h1, h2)):
        resumed = re.search(
            rf"worker:{i}@\S+ \| worker {i} attempt 0 resumed from step (\d+)", second.stdout
        )
        assert resumed and int(resumed.group(1)) >= saved[host.name] > 0, second.stdout
        assert f"worker {i} done at step {STEPS}" in second.stdout
    folders = set(re.findall(r"checkpoints in (\S+)", died + second.stdout))
    assert len(folders) == 2, folders  # one per host, the same in both runs
    for host in (h1, h2):
        assert not lab.leftovers(host, 10), lab.leftovers(host)
