"""Preflight's framework rule: a task of `framework = "torch"`, `"jax"` or `"keras"` finds its
framework's distributions (its record's `packages`, config/frameworks.py) in the python it runs
with, at one version for every task (docs/frameworks.md).

It stands beside the TensorFlow rule (tfrule.py) and reads a task's distributions from the same
sources, where they say them:

- the host's python (no requirements, no image): the hello's `frameworks` (remote/agent.py,
  from their dist-info, nothing imported); checked at preflight;
- a venv of the job's requirements, once resolved: its resolved wheels, or with
  `system_site_packages` and no such wheel, the base python's, which the hello read
  (`problems` with the job's `Environments`).

Not known, so not checked (the framework shows at its import): a venv the hosts install from
their own index (`wheels_from = "hosts"`: the env op answers only its TensorFlow), and a task in
an image (the trial container reads only the image's TensorFlow).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from deployer.config.frameworks import RECORDS
from deployer.config.model import WheelsFrom
from deployer.config.plan import Plan, Task
from deployer.core.errors import HostError
from deployer.up.environment import Environments, requirements_of
from deployer.up.images import task_image
from remote.protocol import HelloReply


@dataclass(frozen=True)
class TaskPackages:
    """The framework distributions one task's python would import: name -> version."""

    task: Task
    where: str  # "python3", "venv 1a2b3c4d5e6f"
    have: Mapping[str, str]
    hint: str  # where a missing one is to come from


def known_packages(
    plan: Plan,
    facts: Mapping[str, HelloReply],
    environments: Environments | None = None,
) -> list[TaskPackages]:
    """Each rank task's distributions as far as they are known now (a task not known yet is
    absent): the host-python tasks' from the hellos, with `environments` (resolved) the venv
    tasks' from their wheels."""
    hosts = {h.name: h for h in plan.hosts}
    found = []
    for task in plan.tasks:
        if not RECORDS[task.framework].packages or task_image(plan, task) is not None:
            continue
        host = hosts[task.host]
        hello = facts.get(task.host)
        said = hello.get("frameworks", {}) if hello is not None else {}
        base = {_normalized(d): v for d, v in said.items()}
        if requirements_of(plan.job, host, task) is None:
            found.append(TaskPackages(task, host.python, base, _HOST_HINT))
            continue
        env = environments.env_of(task) if environments is not None else None
        if env is None or env.wheelhouse is None or plan.job.wheels_from is WheelsFrom.HOSTS:
            continue  # the hosts' own index decides: known at the import
        wheels = {_normalized(w.name): w.version for w in env.wheelhouse.wheels}
        where = f"venv {env.hash[:12]}"
        if plan.job.system_site_packages:
            wheels = {**base, **wheels}
            where += f" over {env.identity.interpreter.path}"
        found.append(TaskPackages(task, where, wheels, _VENV_HINT))
    return found


def problems(
    plan: Plan,
    facts: Mapping[str, HelloReply],
    environments: Environments | None = None,
) -> list[HostError]:
    """A framework missing for a task's python, or two versions of one across the tasks."""
    found: list[HostError] = []
    versions: dict[str, dict[tuple[str, str], str]] = {}  # distribution -> (host, where) -> version
    for known in known_packages(plan, facts, environments):
        task = known.task
        for dist in RECORDS[task.framework].packages:
            version = known.have.get(_normalized(dist))
            if version is not None:
                versions.setdefault(dist, {})[(task.host, known.where)] = version
                continue
            found.append(
                HostError(
                    task.host,
                    f"{dist} is not installed for {known.where} ({task.name} reads "
                    f'framework = "{task.framework}")',
                    hint=known.hint.format(dist=dist),
                )
            )
    pythons = {h.name: h.python for h in plan.hosts}
    for dist, by_place in sorted(versions.items()):
        if len(set(by_place.values())) > 1:
            found += [
                HostError(
                    host,
                    f"{dist} {version}" + ("" if where == pythons[host] else f" ({where})"),
                    hint="one version on every host",
                )
                for (host, where), version in sorted(by_place.items())
            ]
    return found


_HOST_HINT = (
    "install {dist} in the host's python, set the host's `python` to one that has it, or add it "
    "to the job's requirements"
)
_VENV_HINT = (
    "add {dist} to the requirements this task's venv is made of (the job's, its role's or its "
    "host's), or set system_site_packages = true over a python that has it"
)


def _normalized(name: str) -> str:
    """A distribution's name as wheel and .dist-info names spell it: lower case, `_` for each
    run of `-`, `_`, `.` (remote/envop.py `normalized`)."""
    return re.sub(r"[-_.]+", "_", name).lower()
