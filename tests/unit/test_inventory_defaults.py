"""Every inventory default is written once, as the model's dataclass defaults (config/model.py),
and the parser reads them from there: a minimal inventory parses to exactly those values, so a
default changed in the model is the default of every inventory."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from deployer.config.model import Host, Job, SSHSettings, TaskSpec, TensorBoard
from tests.support.helpers import load

MINIMAL = """
[job]
name = "j"
code = "code"

[[hosts]]
address = "10.0.0.1"
tasks = [{ role = "chief" }]
"""
# Not defaults: where the entry is in the file (messages), and what roles.py gives each role.
NOT_DEFAULTS = {"key", "role_commands"}


def defaults(cls: type[Any]) -> dict[str, Any]:
    """The model's default of each field that has one."""
    found = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            found[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            found[f.name] = f.default_factory()
    return found


def required(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - set(defaults(cls))


def test_every_key_an_inventory_may_leave_out_has_its_default_in_the_model() -> None:
    # What an inventory must write, or gets from elsewhere: the job's name and code, the roles'
    # commands (roles.py); a host's address, name and tasks, its port, python and workdir (the
    # job's) and its ssh table (the inventory's [ssh], itself SSHSettings' defaults).
    assert required(Job) == {"name", "code", "role_commands"}
    assert required(Host) == {
        *("name", "address", "tf_address", "tasks", "ssh"),
        *("port", "python", "workdir"),
    }
    assert required(TaskSpec) == {"role"}
    assert required(TensorBoard) == {"logdir"}
    assert required(SSHSettings) == set()


def assert_defaults(
    parsed: object, cls: type[Any], *, besides: frozenset[str] = frozenset()
) -> None:
    for name, default in defaults(cls).items():
        if name not in NOT_DEFAULTS | besides:
            assert getattr(parsed, name) == default, f"{cls.__name__}.{name}"


def test_a_minimal_inventory_gets_every_default_of_the_model(tmp_path: Path) -> None:
    inv = load(tmp_path, MINIMAL)
    host = inv.hosts[0]
    assert_defaults(inv.job, Job)
    assert_defaults(host, Host)
    assert_defaults(host.tasks[0], TaskSpec)
    assert_defaults(host.ssh, SSHSettings)
    job_defaults = defaults(Job)
    assert (host.port, host.python, host.workdir) == (
        job_defaults["port"],
        job_defaults["python"],
        job_defaults["workdir"],
    )


def test_a_tensorboard_table_with_only_its_logdir_gets_the_models_defaults(
    tmp_path: Path,
) -> None:
    inv = load(
        tmp_path,
        MINIMAL.replace('code = "code"\n', 'code = "code"\ntensorboard = { logdir = "tb" }\n'),
    )
    assert inv.job.tensorboard is not None
    assert_defaults(inv.job.tensorboard, TensorBoard)
    assert_defaults(inv.job, Job, besides={"tensorboard"})
