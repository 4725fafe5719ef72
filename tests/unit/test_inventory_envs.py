"""The environment's inventory keys (issue 41): requirements (job, host, role),
system_site_packages, wheels_from; their defaults and their mistakes."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config.inventory import load_inventory
from deployer.config.model import WheelsFrom
from deployer.core.errors import ExitStatus, InventoryError
from deployer.up.environment import requirements_of, uses_requirements
from tests.support.helpers import JOB, load, plan, write_toml

TWO_HOSTS = """
[[hosts]]
address = "10.0.0.1"
tasks = [{ role = "chief" }, { role = "evaluator" }]

[[hosts]]
address = "10.0.0.2"
requirements = ["attrs==23.1"]
tasks = [{ role = "worker" }]
"""


def test_defaults_no_environment(tmp_path: Path) -> None:
    job = load(tmp_path, JOB + TWO_HOSTS.replace('requirements = ["attrs==23.1"]', "")).job
    assert job.requirements is None and job.role_requirements == {}
    assert job.system_site_packages is False and job.wheels_from is WheelsFrom.CONTROLLER


def test_job_host_and_role_requirements(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "requirements.txt").write_text("six\n")
    (tmp_path / "code" / "eval.txt").write_text("attrs\n")
    text = (
        JOB
        + 'requirements = "requirements.txt"\nsystem_site_packages = true\n'
        + 'wheels_from = "hosts"\nrole_requirements = { evaluator = "eval.txt" }\n'
        + TWO_HOSTS
    )
    the_plan = plan(tmp_path, text)
    job, (h1, h2) = the_plan.job, the_plan.hosts
    assert job.system_site_packages is True and job.wheels_from is WheelsFrom.HOSTS
    assert h1.requirements == "requirements.txt" and h2.requirements == ("attrs==23.1",)
    by_role = {
        t.role: requirements_of(job, the_plan.hosts[0], t) for t in the_plan.tasks_on(h1.name)
    }
    assert by_role == {"chief": "requirements.txt", "evaluator": "eval.txt"}
    assert uses_requirements(the_plan) == {h1.name, h2.name}


@pytest.mark.parametrize(
    ("extra", "key", "said"),
    [
        ('requirements = "missing.txt"\n', "job.requirements", "is not a file"),
        ("requirements = 3\n", "job.requirements", "a string or a list of strings"),
        ("requirements = [1]\n", "job.requirements[0]", "expected a string"),
        ('wheels_from = "pypi"\n', "job.wheels_from", "'controller' or 'hosts'"),
        ('role_requirements = { boss = ["six"] }\n', "job.role_requirements.boss", "roles"),
        ('system_site_packages = "yes"\n', "job.system_site_packages", "true or false"),
    ],
)
def test_mistakes_are_inventory_errors(tmp_path: Path, extra: str, key: str, said: str) -> None:
    path = write_toml(tmp_path, JOB + extra + TWO_HOSTS)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert info.value.exit_status == ExitStatus.USAGE
    assert f": {key}: " in str(info.value)
    assert said in str(info.value)
