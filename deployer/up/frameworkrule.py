"""Preflight's framework rule: a task of `framework = "torch"`, `"jax"` or `"keras"` finds its
framework's distributions (its record's `packages`, config/frameworks.py) in the python it runs
with, at one version for every task (docs/frameworks.md).

It stands beside the TensorFlow rule (tfrule.py) and reads a task's distributions from the same
sources, where they say them, none of them importing a framework:

- the host's python (no requirements, no image): the hello's `frameworks` (remote/agent.py,
  from their dist-info); checked at preflight;
- a venv of the job's requirements: once resolved, its resolved wheels, or with
  `system_site_packages` and no such wheel, the base python's, which the hello read (checked at
  preflight); once installed, what the `env` op read in the venv (remote/envop.py), which is
  how a venv the hosts install from their own index (`wheels_from = "hosts"`) is known at all:
  checked after the install, before anything starts;
- a task in an image: what the image's trial container read from the tasks' python there
  (remote/containers.py `trial`), at preflight for an image the hosts have or pull, after the
  load for one sent from here (`image_from = "controller"`). A Python in the image without
  importlib.metadata (3.7 and older) reads none: such a task is not checked.

A task whose distributions are not known yet is absent from `known_packages`; prepare.py runs
the rule at preflight and again after the install (and the images' load) on every task known
by then.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from deployer.config.frameworks import RECORDS
from deployer.config.model import Job, WheelsFrom
from deployer.config.plan import Plan, Task
from deployer.core.errors import HostError
from deployer.up.environment import Environments, requirements_of
from deployer.up.images import Images, task_image
from remote.protocol import HelloReply

# host -> venv path -> the distributions the env op found in it (its reply's `frameworks`)
Installed = Mapping[str, Mapping[str, Mapping[str, str]]]


@dataclass(frozen=True)
class TaskPackages:
    """The framework distributions one task's python would import: name -> version."""

    task: Task
    where: str  # "python3", "venv 1a2b3c4d5e6f", "venv /home/u/.tfdeploy/envs/...", "image x:1"
    have: Mapping[str, str]
    hint: str  # where a missing one is to come from


def known_packages(
    plan: Plan,
    facts: Mapping[str, HelloReply],
    environments: Environments | None = None,
    images: Images | None = None,
    installed: Installed | None = None,
) -> list[TaskPackages]:
    """Each rank task's distributions as far as they are known now (a task not known yet is
    absent): the host-python tasks' from the hellos; with `environments` (resolved) the venv
    tasks' from their wheels, with `installed` (after the install) from what their venvs
    answered; with `images` (checked or loaded) the image tasks' from their trial containers."""
    hosts = {h.name: h for h in plan.hosts}
    found = []
    for task in plan.tasks:
        if not RECORDS[task.framework].packages:
            continue
        hello = facts.get(task.host)
        said = hello.get("frameworks", {}) if hello is not None else {}
        base = _normalized_keys(said)
        image = task_image(plan, task)
        if image is not None:
            known = _in_image(task, image, images)
        elif requirements_of(plan.job, hosts[task.host], task) is None:
            known = TaskPackages(task, hosts[task.host].python, base, _HOST_HINT)
        else:
            known = _in_venv(plan.job, task, base, environments, installed)
        if known is not None:
            found.append(known)
    return found


def _in_image(task: Task, image: str, images: Images | None) -> TaskPackages | None:
    """What the image's trial container read on the task's host; None before it ran there
    (an image sent from here is tried after its load) or where its Python read none."""
    reply = images.checked.get(task.host, {}).get(image) if images is not None else None
    if reply is None or not reply.get("tried") or "frameworks" not in reply:
        return None
    return TaskPackages(task, f"image {image}", _normalized_keys(reply["frameworks"]), _IMAGE_HINT)


def _in_venv(
    job: Job,
    task: Task,
    base: Mapping[str, str],
    environments: Environments | None,
    installed: Installed | None,
) -> TaskPackages | None:
    """The venv's answer once installed; before, its resolved wheels (over the base python's
    with system_site_packages); None while the hosts' own index decides."""
    if environments is None:
        return None
    venv = environments.runtime(task).venv
    answered = (installed or {}).get(task.host, {})
    if venv is not None and venv in answered:
        return TaskPackages(task, f"venv {venv}", _normalized_keys(answered[venv]), _VENV_HINT)
    env = environments.env_of(task)
    if env is None or env.wheelhouse is None or job.wheels_from is WheelsFrom.HOSTS:
        return None  # the hosts' own index decides: known after the install
    wheels = {_normalized(w.name): w.version for w in env.wheelhouse.wheels}
    where = f"venv {env.hash[:12]}"
    if job.system_site_packages:
        wheels = {**base, **wheels}
        where += f" over {env.identity.interpreter.path}"
    return TaskPackages(task, where, wheels, _VENV_HINT)


def problems(
    plan: Plan,
    facts: Mapping[str, HelloReply],
    environments: Environments | None = None,
    images: Images | None = None,
    installed: Installed | None = None,
) -> list[HostError]:
    """A framework missing for a task's python, or two versions of one across the tasks, among
    the tasks known now (`known_packages`)."""
    found: list[HostError] = []
    versions: dict[str, dict[tuple[str, str], str]] = {}  # distribution -> (host, where) -> version
    for known in known_packages(plan, facts, environments, images, installed):
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
_IMAGE_HINT = (
    "install {dist} in the image, for the python the task's command names (else its python3), "
    "or run the task in an image that has it"
)


def _normalized_keys(said: Mapping[str, str]) -> dict[str, str]:
    return {_normalized(d): v for d, v in said.items()}


def _normalized(name: str) -> str:
    """A distribution's name as wheel and .dist-info names spell it: lower case, `_` for each
    run of `-`, `_`, `.` (remote/envop.py `normalized`)."""
    return re.sub(r"[-_.]+", "_", name).lower()
