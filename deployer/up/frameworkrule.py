"""Preflight's framework rule: a task of `framework = "torch"`, `"jax"` or `"keras"` finds its
framework in the python it runs with, at one version on every host (docs/frameworks.md).

It stands beside the TensorFlow rule (preflight's `require_tensorflow` check, which the 47
branch moves into one TensorFlow module of its own) and is kept as small: the hello says the
distributions the host's python has (remote/agent.py `frameworks`, from their dist-info,
nothing imported).
Checked here: the tasks that run the host's python (no requirements, no image). A task in a
venv or an image is not checked yet: its framework shows at its import.
"""

from __future__ import annotations

from collections.abc import Mapping

from deployer.config.frameworks import Framework
from deployer.config.plan import Plan, Task
from deployer.core.errors import HostError
from deployer.up.environment import requirements_of
from deployer.up.images import task_image

# The distributions each convention's script imports: Keras 3's distribution runs on JAX.
NEEDS: dict[Framework, tuple[str, ...]] = {
    Framework.TORCH: ("torch",),
    Framework.JAX: ("jax", "jaxlib"),
    Framework.KERAS: ("keras", "jax", "jaxlib"),
}


def host_python_tasks(plan: Plan) -> list[Task]:
    """The rank tasks that run the host's python: the hello's facts are theirs."""
    hosts = {h.name: h for h in plan.hosts}
    return [
        t
        for t in plan.tasks
        if t.framework in NEEDS
        and task_image(plan, t) is None
        and requirements_of(plan.job, hosts[t.host], t) is None
    ]


def problems(plan: Plan, facts: Mapping[str, Mapping[str, object]]) -> list[HostError]:
    """A framework missing for a task's python, or two versions of one across the hosts."""
    found: list[HostError] = []
    versions: dict[str, dict[str, str]] = {}  # distribution -> host -> version
    hosts = {h.name: h for h in plan.hosts}
    for task in host_python_tasks(plan):
        have: Mapping[str, str] = facts.get(task.host, {}).get("frameworks") or {}  # type: ignore[assignment]
        for dist in NEEDS[task.framework]:
            if dist in have:
                versions.setdefault(dist, {})[task.host] = have[dist]
                continue
            found.append(
                HostError(
                    task.host,
                    f"{dist} is not installed for {hosts[task.host].python} ({task.name} reads "
                    f'framework = "{task.framework}")',
                    hint=f"install {dist} in the host's python, set the host's `python` to one "
                    "that has it, or add it to the job's requirements",
                )
            )
    for dist, by_host in sorted(versions.items()):
        if len(set(by_host.values())) > 1:
            found += [
                HostError(host, f"{dist} {version}", hint="one version on every host")
                for host, version in sorted(by_host.items())
            ]
    return found
