"""The programs people already have, run by `tfdeploy up` on the lab unchanged but for their data
(issue 26): each against real TensorFlow, each also checking (`clean_lab`) that no process or TF
port is left on any lab host. docs/tensorflow.md lists them with these
tests; the TF1 how-to program is tests/integration/test_lifecycle.py's
`test_tf1_style_script_gets_its_flags_from_placeholders`.

Checkpoints that a chief writes and an evaluator reads need storage both see: `shared_dir` is a
directory outside the hosts' private /root, /tmp and home, so every lab host sees it at one path
(like NFS or EFS).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.gpus import FAKE, uuid
from tests.support.lab_cli import EXAMPLES, TF_ENV, accuracies, tfdeploy

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PYTHON_TF215 = "/opt/tfdeploy/venv-tf215/bin/python"  # scripts/install.sh: tensorflow-cpu 2.15.1


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """One directory every lab host sees at the same path (shared storage for checkpoints)."""
    path = Path(tempfile.mkdtemp(prefix="tfdeploy-seed-", dir="/var/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tf_configs(output: str) -> dict[str, dict[str, Any]]:
    """The TF_CONFIG each task printed at start (its env banner): what it really received."""
    found = re.findall(r"^(\S+@\S+)\s+\| tfdeploy-env TF_CONFIG=(\{.*\}) CUDA", output, re.M)
    return {label: json.loads(config) for label, config in found}


def tf215() -> str:
    if not Path(PYTHON_TF215).is_file():
        pytest.skip(f"{PYTHON_TF215} is missing: scripts/install.sh installs it")
    return PYTHON_TF215


@pytest.mark.starts_tf
def test_estimator_tutorial_with_an_evaluator_on_tensorflow_2_15(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, shared_dir: Path
) -> None:
    """TF's multi-worker Estimator tutorial: two workers train under MWMS, the evaluator (the
    same program) evaluates the chief's checkpoints in the shared model_dir until max_steps."""
    lab, python = clean_lab, tf215()
    h1, h2, h3 = lab.hosts[:3]
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}], [{"role": "evaluator"}]],
        code=EXAMPLES,
        job={
            "name": "estimator",
            "python": python,  # the hosts' TensorFlow is 2.15.1: preflight reads it from here
            "command": f"{python} estimator_mwms.py --model-dir {shared_dir} --max-steps 300",
            "env": TF_ENV,
        },
    )
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    assert "preflight ok: python 3.11" in out and "tensorflow 2.15.1" in out
    configs = tf_configs(out)
    workers = [f"{h.address}:{lab.tf_port(h)}" for h in (h1, h2)]
    for i, h in enumerate((h1, h2)):
        assert configs[f"worker:{i}@{h.name}"]["cluster"] == {"worker": workers}
    assert configs[f"evaluator:0@{h3.name}"] == {
        "cluster": {"evaluator": [f"{h3.address}:0"]},
        "task": {"type": "evaluator", "index": 0},
    }
    evaluations = re.findall(
        rf"^evaluator:0@{h3.name}\s+\| INFO:tensorflow:Saving dict for global step (\d+): "
        r"accuracy = ([0-9.]+)",
        out,
        re.M,
    )
    assert evaluations, out[-3000:]
    step, accuracy = evaluations[-1]
    assert step == "300", evaluations  # the chief's last checkpoint, read from the shared dir
    assert float(accuracy) >= 0.8, evaluations
    for label in (f"worker:0@{h1.name}", f"worker:1@{h2.name}", f"evaluator:0@{h3.name}"):
        task = label.split("@")[0]
        assert re.search(
            rf"^{re.escape(label)}\s+\| {task}: train_and_evaluate returned$", out, re.M
        )
    assert "KeyError" not in out and "but the evaluator failed" not in out
    assert "job succeeded: worker:0 and worker:1 exited 0; stopping the rest" in out
    assert (shared_dir / "model.ckpt-300.index").is_file()  # written by the chief (worker:0)
    assert any((shared_dir / "eval").iterdir())  # the evaluator's summaries


@pytest.mark.needs_tf(reason="preflight compares the TensorFlow versions the hosts have")
@pytest.mark.names_tf(reason="`check` only: preflight reads the versions, no task starts")
def test_hosts_on_tensorflow_2_15_and_2_21_are_refused_by_preflight(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab, python = clean_lab, tf215()
    h1, h2 = lab.hosts[:2]
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=EXAMPLES,
        job={"name": "mixed", "command": "python3 mwms.py"},
        per_host={h2.name: {"python": python}},
    )
    result = tfdeploy("check", str(inventory), state=tmp_path / "state", check_rc=3)
    err = " ".join(result.stderr.split())
    assert "hosts disagree on the TensorFlow version" in err, result.stderr
    assert f"{h1.name}: TensorFlow 2.21.0" in err and f"{h2.name}: TensorFlow 2.15.1" in err


@pytest.mark.starts_tf
def test_mwms_script_in_every_role_with_an_evaluator(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, shared_dir: Path
) -> None:
    """One script for all roles: the evaluator builds MultiWorkerMirroredStrategy too (it
    raised KeyError: 'evaluator' before), then evaluates the chief's checkpoints."""
    lab = clean_lab
    h1, h2, h3 = lab.hosts[:3]
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}], [{"role": "evaluator"}]],
        code=EXAMPLES,
        job={
            "name": "mwms-eval",
            "command": f"{lab.python} mwms.py --epochs 5",
            "env": TF_ENV | {"CHECKPOINT_DIR": str(shared_dir)},
        },
    )
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    evaluator = f"evaluator:0@{h3.name}"
    assert tf_configs(out)[evaluator]["cluster"] == {"evaluator": [f"{h3.address}:0"]}
    assert f"{evaluator} | evaluator:0: 1 replicas in sync" in out
    assert re.search(rf"^{evaluator}\s+\| evaluator:0: ckpt-5 \(epoch 5\): accuracy", out, re.M)
    got = accuracies(out)
    assert got.keys() == {f"worker:0@{h1.name}", f"worker:1@{h2.name}", evaluator}
    assert min(got.values()) >= 0.9, got
    # Its own cluster alone: no health check of the workers (GetStatus) from the evaluator
    assert "seems down" not in out and "Cluster check alive failed" not in out
    assert "job succeeded: worker:0 and worker:1 exited 0; stopping the rest" in out


@pytest.mark.starts_tf
def test_pss_script_in_every_role_with_an_evaluator(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, shared_dir: Path
) -> None:
    """One script for the chief, the ps and the side-car evaluator (workers: tfdeploy:server,
    the same Server(...).join() as the script's): the chief does not wait for the evaluator."""
    lab = clean_lab
    h1, h2, h3 = lab.hosts[:3]
    command = f"{lab.python} pss.py --epochs 4 --steps-per-epoch 40"
    inventory = lab_inventory(
        [
            [{"role": "chief"}],
            [{"role": "worker"}, {"role": "ps"}],
            [{"role": "worker"}, {"role": "evaluator"}],
        ],
        code=EXAMPLES,
        job={
            "name": "pss-eval",
            "command": command,
            "role_commands": {"ps": command, "worker": "tfdeploy:server"},
            "env": TF_ENV | {"CHECKPOINT_DIR": str(shared_dir)},
            "stop_grace": 3,
        },
    )
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    configs = tf_configs(out)
    chief, evaluator = f"chief:0@{h1.name}", f"evaluator:0@{h3.name}"
    assert "evaluator" not in configs[chief]["cluster"]  # else the chief waits for it forever
    assert configs[evaluator]["cluster"] == {"evaluator": [f"{h3.address}:0"]}
    assert f"ps:0@{h2.name} | ps:0: serving" in out  # the script's own ps branch
    for index, host in enumerate((h2, h3)):  # the built-in server, TensorFlow's, in its slot
        port = configs[chief]["cluster"]["worker"][index].rsplit(":")[1]
        line = f"worker:{index}@{host.name} | tfdeploy:server worker:{index} serving on port {port}"
        assert line in out, out
    assert re.search(rf"^{evaluator}\s+\| evaluator:0: ckpt-4 \(epoch 4\): accuracy", out, re.M)
    got = accuracies(out)
    assert got.keys() == {chief, evaluator}
    assert min(got.values()) >= 0.9, got
    for server in (f"ps:0@{h2.name}", f"worker:0@{h2.name}", f"worker:1@{h3.name}"):
        assert re.search(rf"{re.escape(server)} pid \d+ exited \(stopped by tfdeploy\)", out)
    assert "job succeeded: chief:0 exited 0; stopping the rest" in out


@pytest.mark.starts_tf
@pytest.mark.isolated  # the nvidia-smi stand-in goes into a host's private /root/bin
def test_mirrored_strategy_tasks_share_a_host_by_gpu_masks(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Two MirroredStrategy processes on one 4-GPU host, each on its own half of the GPUs. The
    host's nvidia-smi is tests/fakes/nvidia-smi (a stand-in: the lab has no GPUs) and TF, finding
    no GPU, mirrors over one CPU device per GPU of its mask (mirrored.py)."""
    lab = clean_lab
    host = lab.hosts[0]
    gpus = "".join(f"{i}, {uuid(i)}, NVIDIA A10G, 23028, 0, 0\n" for i in range(4))
    install = [
        "mkdir -p /root/bin",
        f"printf %s {shlex.quote(FAKE.read_text())} > /root/bin/nvidia-smi",
        "chmod +x /root/bin/nvidia-smi",
        "printf '' > /root/bin/nvidia-smi.apps.csv",
        f"printf %s {shlex.quote(gpus)} > /root/bin/nvidia-smi.gpus.csv",
    ]
    done = lab.run(host, " && ".join(install))
    assert done.returncode == 0, done.stderr
    try:
        inventory = lab_inventory(
            [[{"role": "worker", "count": 2}]],
            code=EXAMPLES,
            job={"name": "mirrored", "command": f"{lab.python} mirrored.py --epochs 5"},
            per_host={host.name: {"gpus": 4}},
        )
        out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    finally:
        lab.run(host, "rm -rf /root/bin")
    for i, mask in enumerate(("0,1", "2,3")):
        label = f"worker:{i}@{host.name}"
        assert f"{label} | tfdeploy-env TF_CONFIG=" in out
        assert f"CUDA_VISIBLE_DEVICES={mask} TFDEPLOY_TASK=worker:{i}" in out
        stand_ins = str(mask.split(","))
        stand_in = f"{label} | worker:{i}: no GPU visible: 2 CPU devices stand in for GPUs "
        assert f"{stand_in}{stand_ins}" in out
        assert re.search(rf"^{label}\s+\| worker:{i}: 2 replicas: \S+CPU:0, \S+CPU:1$", out, re.M)
    got = accuracies(out)
    assert got.keys() == {f"worker:0@{host.name}", f"worker:1@{host.name}"}
    assert min(got.values()) >= 0.9, got
