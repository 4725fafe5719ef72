"""Preflight's framework rule (up/frameworkrule.py), a framework job's TensorFlow default, and the
failure report's hint for a script under the wrong convention (watch/convention.py): both read
each framework's record (config/frameworks.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from deployer.config.frameworks import RECORDS, WRONG_CONVENTION_HINT, Framework
from deployer.config.inventory import load_inventory
from deployer.config.plan import Plan, Task, make_plan
from deployer.envs.wheelhouse import Wheel
from deployer.up import frameworkrule
from deployer.up.environment import Environments
from deployer.watch.convention import convention_hint
from remote import hostfacts
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


class _Resolved(Environments):
    """Every requirements task's venv resolved to `files` (a wheelhouse of wheel file names)."""

    def __init__(self, plan: Plan, files: list[str]) -> None:
        super().__init__(plan)
        wheels = tuple(Wheel(f, "0" * 64, 1) for f in files)
        self.env = SimpleNamespace(
            hash="1a2b3c4d5e6f7a8b",
            wheelhouse=SimpleNamespace(wheels=wheels),
            identity=SimpleNamespace(interpreter=SimpleNamespace(path="/usr/bin/python3")),
        )

    def env_of(self, task: Task) -> SimpleNamespace:  # type: ignore[override]
        return self.env


JAX_WHEELS = ["jax-0.10.2-py3-none-any.whl", "jaxlib-0.10.2-cp311-cp311-manylinux_x86_64.whl"]


def test_a_venv_task_is_checked_on_its_resolved_wheels(tmp_path: Path) -> None:
    in_venv = 'framework = "keras"\nrequirements = ["keras"]'
    plan = _plan(tmp_path, in_venv)
    resolved = _Resolved(plan, JAX_WHEELS)
    found = frameworkrule.problems(plan, _facts(KERAS, KERAS), resolved)
    assert [(p.host, p.cause) for p in found] == [
        (
            "10.0.0.1",
            'keras is not installed for venv 1a2b3c4d5e6f (worker:0 reads framework = "keras")',
        ),
        (
            "10.0.0.2",
            'keras is not installed for venv 1a2b3c4d5e6f (worker:1 reads framework = "keras")',
        ),
    ]
    assert "requirements" in (found[0].hint or "") and "keras" in (found[0].hint or "")
    resolved = _Resolved(plan, ["keras-3.15.1-py3-none-any.whl", *JAX_WHEELS])
    assert frameworkrule.problems(plan, _facts({}, {}), resolved) == []
    # Without the environments (preflight, before they are resolved): not known yet.
    assert frameworkrule.problems(plan, _facts({}, {})) == []


def test_a_venv_over_system_site_packages_counts_the_base_pythons(tmp_path: Path) -> None:
    shared = 'framework = "keras"\nrequirements = ["jax"]\nsystem_site_packages = true'
    plan = _plan(tmp_path, shared)
    resolved = _Resolved(plan, JAX_WHEELS)
    found = frameworkrule.problems(plan, _facts(KERAS, {"keras": "3.14.0"}), resolved)
    where = "venv 1a2b3c4d5e6f over /usr/bin/python3"
    assert [(p.host, p.cause) for p in found] == [
        ("10.0.0.1", f"keras 3.15.1 ({where})"),
        ("10.0.0.2", f"keras 3.14.0 ({where})"),
    ]


def test_a_venv_from_the_hosts_index_and_an_image_are_not_known_before_the_import(
    tmp_path: Path,
) -> None:
    from_hosts = 'framework = "torch"\nrequirements = ["torch"]\nwheels_from = "hosts"'
    plan = _plan(tmp_path, from_hosts)
    assert frameworkrule.known_packages(plan, _facts({}, {}), _Resolved(plan, [])) == []
    in_image = 'framework = "torch"\nimage = "localhost/x:1"'
    plan = _plan(tmp_path, in_image)
    assert frameworkrule.known_packages(plan, _facts({}, {}), _Resolved(plan, [])) == []


def test_the_hello_reads_every_distribution_a_record_needs() -> None:
    needed = {d for r in RECORDS.values() for d in r.packages}
    assert needed == set(hostfacts.FRAMEWORK_DISTRIBUTIONS)


def test_each_rank_conventions_signs_name_it_in_the_hint() -> None:
    for r in RECORDS.values():
        assert r.signs and r.by_rank == (r.name != Framework.TENSORFLOW)
        for words in r.signs:
            others = [
                f
                for f in Framework
                if f not in {g.name for g in RECORDS.values() if words in g.signs}
            ]
            hint = convention_hint([f"ValueError: {words}"], others[0])
            assert hint is not None and f'framework = "{r.name}"' in hint
    said = convention_hint(["RuntimeError: MASTER_ADDR expected"], Framework.JAX)
    choices = 'framework = "torch"'
    assert said == WRONG_CONVENTION_HINT.format(framework="jax", choices=choices)


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
