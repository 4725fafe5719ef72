"""TensorFlow itself must read every TF_CONFIG we generate the way we mean it.

One subprocess imports TensorFlow once and resolves all TF_CONFIGs it gets as JSON on stdin with
`tf.distribute.cluster_resolver.TFConfigClusterResolver`, so pytest's own process stays light.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import JOB, plan

pytestmark = pytest.mark.slow  # TensorFlow's import: seconds of CPU per test

PYTHON = sys.executable  # `starts_tf` skips its tests where it has no TensorFlow

RESOLVE = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf

results = []
for config in json.load(sys.stdin):
    os.environ["TF_CONFIG"] = config
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    try:
        master = resolver.master()
    except ValueError:  # a task outside the cluster has no address
        master = None
    results.append({
        "cluster": resolver.cluster_spec().as_dict(),
        "task_type": resolver.task_type,
        "task_id": resolver.task_id,
        "master": master,
    })
json.dump(results, sys.stdout)
"""

LAYOUTS = {
    "pss": """
        [[hosts]]
        address = "h1"
        tf_address = "10.0.0.1"
        gpus = 2
        tasks = [{ role = "chief" }, { role = "worker" }]
        [[hosts]]
        address = "h2"
        tf_address = "10.0.0.2"
        tasks = [{ role = "worker", count = 2 }, { role = "ps", count = 2 }]
        """,
    "mwms": """
        [[hosts]]
        address = "a"
        tasks = [{ role = "worker" }]
        [[hosts]]
        address = "b"
        port = 5000
        tasks = [{ role = "worker" }]
        [[hosts]]
        address = "c"
        tasks = [{ role = "worker" }]
        """,
    "evaluator": """
        [[hosts]]
        address = "a"
        tasks = [{ role = "chief" }, { role = "evaluator" }, { role = "worker" }]
        [[hosts]]
        address = "b"
        tasks = [{ role = "ps" }]
        """,
    "multi-task-host": """
        [[hosts]]
        address = "127.0.0.1"
        port = 20000
        tasks = [
          { role = "worker", count = 3 },
          { role = "ps" },
          { role = "chief" },
          { role = "worker" },
        ]
        """,
}


def expected_cluster(p: object) -> dict[str, list[str]]:
    """What TF's ClusterSpec.as_dict() gives: role -> list of host:port (our cluster dict)."""
    return {role: list(addrs) for role, addrs in p.cluster.items()}  # type: ignore[attr-defined]


@pytest.mark.starts_tf
def test_tensorflow_resolves_every_generated_tf_config(tmp_path: Path) -> None:
    cases = []
    for name, hosts in LAYOUTS.items():
        directory = tmp_path / name
        directory.mkdir()
        p = plan(directory, JOB + hosts)
        cases.extend((name, p, task) for task in p.tasks)
    assert len(cases) == 6 + 3 + 4 + 6

    result = subprocess.run(
        [PYTHON, "-c", RESOLVE],
        input=json.dumps([task.env["TF_CONFIG"] for _, _, task in cases]),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = json.loads(result.stdout)
    assert len(resolved) == len(cases)

    for (name, p, task), got in zip(cases, resolved, strict=True):
        where = f"{name} {task.name}"
        assert (got["task_type"], got["task_id"]) == (task.role, task.index), where
        if task.port is not None:  # the resolver's own address is this task's slot
            assert got["cluster"] == expected_cluster(p), where
            assert "evaluator" not in got["cluster"], where
            assert got["master"] == f"{task.address}:{task.port}", where
            assert got["cluster"][task.role][task.index] == f"{task.address}:{task.port}", where
        else:  # the evaluator: its own cluster, alone, at port 0
            assert task.role == "evaluator", where
            assert got["cluster"] == {"evaluator": [f"{task.address}:0"]}, where
            assert got["master"] == "", where  # a one-task cluster: TF's local master, no gRPC


def test_layouts_are_what_the_test_claims(tmp_path: Path) -> None:
    """Pins the clusters fed to TensorFlow, so the resolver test checks meaningful layouts."""
    clusters = {}
    for name, hosts in LAYOUTS.items():
        directory = tmp_path / name
        directory.mkdir()
        clusters[name] = plan(directory, JOB + hosts).cluster
    assert clusters == {
        "pss": {
            "chief": ["10.0.0.1:2222"],
            "worker": ["10.0.0.1:2223", "10.0.0.2:2222", "10.0.0.2:2223"],
            "ps": ["10.0.0.2:2224", "10.0.0.2:2225"],
        },
        "mwms": {"worker": ["a:2222", "b:5000", "c:2222"]},
        "evaluator": {"chief": ["a:2222"], "worker": ["a:2223"], "ps": ["b:2222"]},
        "multi-task-host": {
            "chief": ["127.0.0.1:20004"],
            "worker": ["127.0.0.1:20000", "127.0.0.1:20001", "127.0.0.1:20002", "127.0.0.1:20005"],
            "ps": ["127.0.0.1:20003"],
        },
    }


BUILD_ON_EVALUATOR = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf

old, new = json.load(sys.stdin)
os.environ["TF_CONFIG"] = old  # before tfdeploy listed the evaluator in its own TF_CONFIG
try:
    tf.distribute.MultiWorkerMirroredStrategy()
    print("old: built")
except KeyError as e:
    print(f"old: KeyError {e}")
os.environ["TF_CONFIG"] = new
strategy = tf.distribute.MultiWorkerMirroredStrategy()
print(f"new: {strategy.num_replicas_in_sync} replica on {strategy.extended.worker_devices[0]}")
time.sleep(1)  # a health check of the peers would dial them now
"""

TF_VENVS = {
    "tf2.21": PYTHON,
    "tf2.15": "/opt/tfdeploy/venv-tf215/bin/python",  # scripts/install.sh; Estimator's last TF
}


@pytest.mark.starts_tf
@pytest.mark.parametrize("python", TF_VENVS.values(), ids=TF_VENVS.keys())
def test_the_evaluators_tf_config_builds_mwms_and_dials_no_task(
    tmp_path: Path, python: str
) -> None:
    """The one-script style builds MultiWorkerMirroredStrategy in every role, the evaluator too:
    with its planned TF_CONFIG it builds (1 replica) and opens no connection to the training
    tasks, whose ports listen here; without its entry TF raises KeyError: 'evaluator'."""
    if not Path(python).is_file():
        pytest.skip(f"{python} is missing: scripts/install.sh installs it")
    listeners = [socket.create_server((f"127.0.0.{i}", 0)) for i in (1, 2)]
    try:
        ports = [s.getsockname()[1] for s in listeners]
        tasks = ['{ role = "worker" }', '{ role = "worker" }, { role = "evaluator" }']
        hosts = "".join(
            f'[[hosts]]\naddress = "127.0.0.{i}"\nport = {port}\ntasks = [{t}]\n'
            for i, port, t in zip((1, 2), ports, tasks, strict=True)
        )
        p = plan(tmp_path, JOB + hosts)
        new = p.task("evaluator:0").env["TF_CONFIG"]
        assert json.loads(new)["cluster"] == {"evaluator": ["127.0.0.2:0"]}
        old = json.dumps({"cluster": p.cluster, "task": {"type": "evaluator", "index": 0}})
        result = subprocess.run(
            [python, "-c", BUILD_ON_EVALUATOR],
            input=json.dumps([old, new]),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.splitlines() == [
            "old: KeyError 'evaluator'",
            "new: 1 replica on /job:evaluator/replica:0/task:0/device:CPU:0",
        ], result.stderr[-3000:]
        for listener in listeners:
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):  # nothing connected to a training task's port
                listener.accept()
    finally:
        for listener in listeners:
            listener.close()
