"""Preflight's framework rule (up/frameworkrule.py), a framework job's TensorFlow default, and the
failure report's hint for a script under the wrong convention (watch/convention.py)."""

from __future__ import annotations

import json
from pathlib import Path

from deployer.config.frameworks import Framework
from deployer.config.inventory import load_inventory
from deployer.config.plan import Plan, make_plan
from deployer.up import frameworkrule
from deployer.watch.convention import convention_hint
from tests.support.aws import cli

HOSTS = """
[[hosts]]
address = "10.0.0.1"
tasks = [{ role = "worker" }]

[[hosts]]
address = "10.0.0.2"
tasks = [{ role = "worker" }]
"""
TORCH = {"torch": "2.13.0+cpu"}
KERAS = {"keras": "3.15.1", "jax": "0.10.2", "jaxlib": "0.10.2"}


def _plan(tmp_path: Path, job: str) -> Plan:
    (tmp_path / "code").mkdir(exist_ok=True)
    inventory = tmp_path / "inv.toml"
    inventory.write_text(
        f'[job]\nname = "j"\ncode = "code"\ncommand = "python3 t.py"\n{job}\n{HOSTS}'
    )
    return make_plan(load_inventory(inventory))


def _facts(h1: dict[str, str], h2: dict[str, str]) -> dict[str, dict[str, object]]:
    return {"10.0.0.1": {"frameworks": h1}, "10.0.0.2": {"frameworks": h2}}


def test_a_framework_job_needs_no_tensorflow_unless_a_role_reads_tf_config(
    tmp_path: Path,
) -> None:
    assert _plan(tmp_path, "").job.require_tensorflow
    assert not _plan(tmp_path, 'framework = "torch"').job.require_tensorflow
    mixed = 'framework = "torch"\nrole_frameworks = { evaluator = "tensorflow" }'
    assert _plan(tmp_path, mixed).job.require_tensorflow
    said = 'framework = "torch"\nrequire_tensorflow = true'
    assert _plan(tmp_path, said).job.require_tensorflow


def test_a_missing_framework_is_named_per_host_with_its_python(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 'framework = "keras"')
    found = frameworkrule.problems(plan, _facts(KERAS, {"keras": "3.15.1"}))
    assert [(p.host, p.cause) for p in found] == [
        ("10.0.0.2", 'jax is not installed for python3 (worker:1 reads framework = "keras")'),
        ("10.0.0.2", 'jaxlib is not installed for python3 (worker:1 reads framework = "keras")'),
    ]
    assert frameworkrule.problems(plan, _facts(KERAS, KERAS)) == []


def test_two_versions_of_a_framework_across_hosts_are_refused(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 'framework = "torch"')
    found = frameworkrule.problems(plan, _facts(TORCH, {"torch": "2.12.0"}))
    assert [(p.host, p.cause) for p in found] == [
        ("10.0.0.1", "torch 2.13.0+cpu"),
        ("10.0.0.2", "torch 2.12.0"),
    ]


def test_tensorflow_jobs_and_venv_tasks_are_left_to_their_own_checks(tmp_path: Path) -> None:
    assert frameworkrule.problems(_plan(tmp_path, ""), _facts({}, {})) == []
    in_venv = 'framework = "torch"\nrequirements = ["torch"]'
    assert frameworkrule.problems(_plan(tmp_path, in_venv), _facts({}, {})) == []


def test_a_torch_script_under_tf_config_gets_the_framework_key_as_hint() -> None:
    tail = [
        "Traceback (most recent call last):",
        "ValueError: Error initializing torch.distributed using env:// rendezvous: "
        "environment variable RANK expected, but not set",
    ]
    hint = convention_hint(tail, Framework.TENSORFLOW)
    assert hint is not None and 'set [job] framework = "torch"' in hint
    assert convention_hint(tail, Framework.TORCH) is None  # its own convention: no hint
    keras = ["ValueError: coordinator_address should be defined."]
    hint = convention_hint(keras, Framework.TENSORFLOW)
    assert hint is not None and 'framework = "keras" or framework = "jax"' in hint
    assert convention_hint(["ValueError: loss is nan"], Framework.TENSORFLOW) is None


def test_plan_json_and_plan_print_each_ranks_variables(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    inventory = tmp_path / "inv.toml"
    inventory.write_text(
        '[job]\nname = "j"\ncode = "code"\ncommand = "python3 t.py"\nframework = "torch"\n'
        '[[hosts]]\naddress = "10.0.0.1"\ntasks = [{ role = "worker", count = 2 }]\n'
        '[[hosts]]\naddress = "10.0.0.2"\ntasks = [{ role = "worker" }]\n'
    )
    code, out, err = cli("plan", "--json", str(inventory))
    assert code == 0, err
    envs = {f"{t['role']}:{t['index']}": t["env"] for t in json.loads(out)["tasks"]}
    assert envs["worker:1"] | {"CUDA_VISIBLE_DEVICES": "", "TFDEPLOY_TASK": "worker:1"} == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "2222",
        "RANK": "1",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "TFDEPLOY_TASK": "worker:1",
    }
    assert "TF_CONFIG" not in envs["worker:2"] and envs["worker:2"]["LOCAL_RANK"] == "0"
    code, out, err = cli("plan", str(inventory))
    assert code == 0, err
    assert "torch variables per task" in out and "TF_CONFIG" not in out
    assert "worker:2     MASTER_ADDR=10.0.0.1 MASTER_PORT=2222 RANK=2 WORLD_SIZE=3" in out
