"""Each convention's variables per task (config/frameworks.py): Keras 3, JAX and torchrun's, from
the same hosts and tasks a TensorFlow job plans TF_CONFIG from; bad combinations refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.config.inventory import load_inventory
from deployer.config.plan import make_plan
from deployer.core.errors import InventoryError

HOSTS = """
[[hosts]]
address = "10.0.0.1"
tasks = [{ role = "chief" }, { role = "worker" }]

[[hosts]]
address = "10.0.0.2"
tasks = [{ role = "worker", count = 2 }]
"""


def _plan(tmp_path: Path, job: str, hosts: str = HOSTS):  # type: ignore[no-untyped-def]
    (tmp_path / "code").mkdir(exist_ok=True)
    inventory = tmp_path / "inv.toml"
    inventory.write_text(
        f'[job]\nname = "j"\ncode = "code"\ncommand = "python3 t.py"\n{job}\n{hosts}'
    )
    return make_plan(load_inventory(inventory))


def _env(plan, name):  # type: ignore[no-untyped-def]
    return next(t for t in plan.tasks if t.name == name).env


def test_torch_ranks_are_the_chief_then_the_workers_with_local_ranks_per_host(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path, 'framework = "torch"')
    ranks = {t.name: _env(plan, t.name) for t in plan.tasks}
    assert [ranks[n]["RANK"] for n in ("chief:0", "worker:0", "worker:1", "worker:2")] == [
        "0",
        "1",
        "2",
        "3",
    ]
    assert {e["MASTER_ADDR"] + ":" + e["MASTER_PORT"] for e in ranks.values()} == {"10.0.0.1:2222"}
    assert {e["WORLD_SIZE"] for e in ranks.values()} == {"4"}
    assert [ranks[n]["LOCAL_RANK"] for n in ("worker:1", "worker:2")] == ["0", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in ranks.values()} == {"2"}
    assert not any("TF_CONFIG" in e for e in ranks.values())


def test_keras_gets_every_address_with_the_coordinator_first(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 'framework = "keras"')
    env = _env(plan, "worker:2")
    assert env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == (
        "10.0.0.1:2222,10.0.0.1:2223,10.0.0.2:2222,10.0.0.2:2223"
    )
    assert (env["KERAS_DISTRIBUTION_NUM_PROCESSES"], env["KERAS_DISTRIBUTION_PROCESS_ID"]) == (
        "4",
        "3",
    )


def test_jax_gets_the_coordinator_the_count_and_its_id(tmp_path: Path) -> None:
    env = _env(_plan(tmp_path, 'framework = "jax"'), "worker:0")
    assert env["JAX_COORDINATOR_ADDRESS"] == "10.0.0.1:2222"
    assert (env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]) == ("4", "1")


def test_tensorflow_stays_the_default_and_unchanged(tmp_path: Path) -> None:
    env = _env(_plan(tmp_path, ""), "worker:0")
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert "RANK" not in env and "JAX_PROCESS_ID" not in env


def test_a_ps_has_no_rank_unless_its_role_stays_tensorflow(tmp_path: Path) -> None:
    hosts = HOSTS + '\n[[hosts]]\naddress = "10.0.0.3"\ntasks = [{ role = "evaluator" }]\n'
    with pytest.raises(InventoryError) as caught:
        _plan(tmp_path, 'framework = "torch"', hosts)
    assert caught.value.key == "job.framework" and "evaluator" in caught.value.message
    plan = _plan(
        tmp_path, 'framework = "torch"\nrole_frameworks = { evaluator = "tensorflow" }', hosts
    )
    evaluator = _env(plan, "evaluator:0")
    assert "TF_CONFIG" in evaluator and "RANK" not in evaluator
    assert _env(plan, "worker:2")["WORLD_SIZE"] == "4"


def test_a_ranks_variable_in_the_inventorys_env_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        _plan(tmp_path, 'framework = "torch"\nenv = { RANK = "3" }')
    assert caught.value.key == "job.env.RANK"


def test_an_unknown_framework_names_the_four(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        _plan(tmp_path, 'framework = "pytorch"')
    assert "torch" in caught.value.message and "keras" in caught.value.message
