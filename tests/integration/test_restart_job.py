"""on_failure = "restart-job" with real TensorFlow on the lab: a 3-worker MWMS job loses a
worker to SIGKILL mid-training, is restarted as a whole by the run's keeper (the attached `up`
is its client), every worker resumes from the newest epoch all of them saved, and it ends 0.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.faults import EXAMPLES, TF_ENV, Up, final_states, pids_of

pytestmark = [pytest.mark.lab, pytest.mark.starts_tf, pytest.mark.slow]

STEPS_PER_EPOCH = 22  # 1,437 training digits in global batches of 64


def test_a_killed_mwms_worker_restarts_the_job_from_its_checkpoint(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    h1, h2, h3 = lab.hosts[:3]
    inventory = lab_inventory(
        [[{"role": "worker"}]] * 3,
        code=EXAMPLES,
        job={
            "name": "resume",
            "command": f"{lab.python} mwms.py --epochs 10",
            "env": TF_ENV,
            "on_failure": "restart-job",
            "restart_backoff": 1,
            "stop_grace": 2,
        },
    )
    up = Up(inventory, state=tmp_path / "state")
    try:
        up.wait_for(rf"worker:1@{h2.name} \| epoch 3 loss", timeout=240)
        [victim] = pids_of(lab, h2, "mwms.py")
        lab.run(h2, ["kill", "-KILL", str(victim)])
        up.wait_for(r"\[attempt 1\] \| .*resumed from", timeout=240, count=3)
        # attempt 0 is gone: one training process per host, each of attempt 1
        for host in (h1, h2, h3):
            assert len(pids_of(lab, host, "mwms.py")) == 1
        assert up.finish(timeout=300) == 0, up.report()
    finally:
        if up.proc.poll() is None:  # a failed wait: stop it, so the lab is left clean
            up.proc.send_signal(signal.SIGINT)
            up.finish(timeout=60)

    out = up.stdout
    assert f"is kept by its keeper on {h1.name}" in out  # the keeper restarted it, not this up
    assert f"worker:1@{h2.name} killed by signal 9: restarting the whole job (restart 1 of 3" in out
    resumed = re.findall(
        r"\[attempt 1\] \| worker:\d: resumed from \S+ after epoch (\d+) \(step (\d+)\)", out
    )
    assert len(resumed) == 3, out
    epochs = {int(e) for e, _ in resumed}
    assert len(epochs) == 1 and min(epochs) >= 3  # all from the same checkpoint, not from 0
    [epoch] = epochs
    assert {int(s) for _, s in resumed} == {epoch * STEPS_PER_EPOCH}
    # the step counter goes on from the checkpoint: the next epoch's line, not step 22
    first_after = re.search(rf"\[attempt 1\] \| epoch {epoch + 1} loss \S+ step (\d+)", out)
    assert first_after and int(first_after.group(1)) == (epoch + 1) * STEPS_PER_EPOCH, out
    accuracies = re.findall(r"\[attempt 1\] \| test_accuracy=([0-9.]+)", out)
    assert len(accuracies) == 3 and min(map(float, accuracies)) >= 0.9, out
    states = final_states(inventory, up.run_id(), tmp_path, hosts=3)
    assert all(t["exit_code"] == 0 and t["restarts"] == 1 for t in states.values()), states
