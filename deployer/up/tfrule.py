"""The TensorFlow rule, in one place: every task's TensorFlow is known before anything starts,
and one check says which tasks would run which version.

A task runs in one of three places, and each says its TensorFlow differently:

- the host's python (no requirements, no image): the hello's `tensorflow`;
- a venv of the job's requirements: the `env` op's answer once built; before that (`check`,
  preflight of `up`) the resolved wheels say it (a tensorflow wheel among them), or with
  `system_site_packages` and no such wheel, the base python's, which the hello read;
- a container image: the throwaway container preflight runs (remote/imageop.py) reads it from
  the image's python.

Before, preflight compared the hosts without a venv or image, environment.py compared the venv
hosts among themselves, and images were not compared at all: with `role_requirements` or a
host's own `requirements` a job could run two TensorFlow versions without a word, and the
host-python tasks of a host where some task used requirements were not checked at all.

The rule: every task has TensorFlow (unless `require_tensorflow = false`, per job, or
`job.setup` may install it), and every task has the same version (unless
`allow_mixed_tensorflow = true`, which the user sets knowing the versions talk to each other).
A task whose TensorFlow is not known yet (an image still to be sent, a venv the hosts install
from their own index) is left to the second pass, after the install and before any start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deployer.config.model import Job, WheelsFrom
from deployer.config.plan import Plan, Task
from deployer.config.roles import SIDECAR
from deployer.core.errors import HostError, HostsFailed
from deployer.core.text import join_names
from deployer.up.environment import Environments, requirements_of
from deployer.up.images import Images, task_image
from remote.protocol import HelloReply

# Wheel names (normalized, as wheel files spell them) that are TensorFlow.
_TF_WHEELS = ("tensorflow", "tensorflow_cpu", "tensorflow_gpu", "tf_nightly", "tensorflow_intel")


@dataclass(frozen=True)
class TaskTensorflow:
    """The TensorFlow one task would import: `version` None is none at all."""

    task: str
    host: str
    where: str  # "python3", "venv 1a2b3c4d5e6f", "image localhost/x:1"
    version: str | None

    def said(self) -> str:
        return f"{self.task}@{self.host} ({self.where})"


def tasks_needing_tensorflow(plan: Plan) -> list[Task]:
    """Every task but the TensorBoard sidecar (TensorBoard runs without TensorFlow)."""
    return [t for t in plan.tasks if t.role != SIDECAR.name]


def known_versions(
    plan: Plan,
    facts: Mapping[str, HelloReply],
    environments: Environments,
    images: Images,
    installed: Mapping[str, Mapping[str, str | None]] | None = None,
) -> list[TaskTensorflow]:
    """Each task's TensorFlow as far as it is known now; a task not known yet is absent.
    `installed`: host -> venv path -> the env op's TensorFlow (after the install)."""
    hosts = {h.name: h for h in plan.hosts}
    found = []
    for task in tasks_needing_tensorflow(plan):
        host = hosts[task.host]
        image = task_image(plan, task)
        if image is not None:
            reply = images.checked.get(task.host, {}).get(image)
            if reply is not None and reply.get("tried"):
                found.append(_of(task, f"image {image}", reply.get("tensorflow")))
            continue
        requirements = requirements_of(plan.job, host, task)
        if requirements is None:
            found.append(_of(task, host.python, _host_tensorflow(facts, task.host)))
            continue
        venv = _venv_version(plan.job, task, environments, facts, installed)
        if venv is not None:
            found.append(venv)
    return found


def _venv_version(
    job: Job,
    task: Task,
    environments: Environments,
    facts: Mapping[str, HelloReply],
    installed: Mapping[str, Mapping[str, str | None]] | None,
) -> TaskTensorflow | None:
    venv = environments.runtime(task).venv
    if installed is not None and venv is not None and venv in installed.get(task.host, {}):
        return _of(task, f"venv {venv}", installed[task.host][venv])
    env = environments.env_of(task)
    if env is None:
        return None
    where = f"venv {env.hash[:12]}"
    house = env.wheelhouse
    if house is None or job.wheels_from is WheelsFrom.HOSTS:
        return None  # the hosts' own index decides: known after the install
    wheel = next((w for w in house.wheels if w.name.lower() in _TF_WHEELS), None)
    if wheel is not None:
        return _of(task, where, wheel.version)
    if job.system_site_packages:
        return _of(
            task,
            f"{where} over {env.identity.interpreter.path}",
            _host_tensorflow(facts, task.host),
        )
    return _of(task, where, None)


def _of(task: Task, where: str, version: object) -> TaskTensorflow:
    return TaskTensorflow(task.name, task.host, where, str(version) if version else None)


def check(job: Job, found: Sequence[TaskTensorflow]) -> list[str]:
    """The rule on the tasks known so far; raises HostsFailed naming every task that breaks it.
    What to say when it holds (with a mix allowed: which tasks run which version)."""
    groups = _grouped(found)
    if job.require_tensorflow and not job.setup:
        missing = [
            HostError(
                host,
                f"TensorFlow is not installed for {where} ({join_names(tasks)})",
                hint=MISSING_HINT,
            )
            for (host, where, version), tasks in groups.items()
            if version is None
        ]
        if missing:
            raise HostsFailed(missing)
    by_version: dict[str, list[TaskTensorflow]] = {}
    for t in found:
        if t.version is not None:
            by_version.setdefault(t.version, []).append(t)
    if len(by_version) > 1 and not job.allow_mixed_tensorflow:
        raise HostsFailed(
            [
                HostError(
                    host, f"TensorFlow {version} for {join_names(tasks)} ({where})", hint=MIXED_HINT
                )
                for (host, where, version), tasks in groups.items()
                if version is not None
            ],
            what="hosts disagree on the TensorFlow version: the tasks would run "
            + ", ".join(sorted(by_version)),
        )
    if len(by_version) > 1:
        return [f"mixed TensorFlow (allow_mixed_tensorflow = true): {_versions(by_version)}"]
    return []


MISSING_HINT = (
    "add tensorflow (or tensorflow-cpu) to the job's `requirements` (the controller sends its "
    "wheels, so offline hosts get it too), set system_site_packages = true over a python that "
    "holds it, or require_tensorflow = false for a job that does not use TensorFlow"
)
MIXED_HINT = (
    "pin one TensorFlow version in every requirements file and image (and the hosts' pythons), "
    "or set allow_mixed_tensorflow = true in [job] if these versions work together"
)


def _grouped(
    found: Sequence[TaskTensorflow],
) -> dict[tuple[str, str, str | None], list[str]]:
    """(host, where, version) -> its tasks, in host order."""
    groups: dict[tuple[str, str, str | None], list[str]] = {}
    for t in sorted(found, key=lambda t: (t.host, t.where, t.task)):
        groups.setdefault((t.host, t.where, t.version), []).append(t.task)
    return groups


def _versions(by_version: Mapping[str, Sequence[TaskTensorflow]]) -> str:
    return "; ".join(
        f"{v} on {join_names([t.said() for t in ts])}" for v, ts in sorted(by_version.items())
    )


def summary(found: Sequence[TaskTensorflow]) -> str:
    """`tensorflow 2.21.0` (several: joined with /; none known: -)."""
    versions = sorted({t.version for t in found if t.version is not None})
    return f"tensorflow {'/'.join(versions) or '-'}"


def _host_tensorflow(facts: Mapping[str, HelloReply], host: str) -> str | None:
    """The TensorFlow version the host's python holds, as its hello said (None: none, or no
    hello from it)."""
    hello = facts.get(host)
    return hello["tensorflow"] if hello is not None else None
