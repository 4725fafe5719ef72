"""TensorFlow's own rules for a cluster, said before anything runs (docs/tensorflow.md).

tfdeploy cannot see which strategy a script builds, so `job.strategy` says it, and "auto" (the
default) reads the layout: a job without ps tasks is MultiWorkerMirroredStrategy style, a job
with ps tasks ParameterServerStrategy style. A rule whose breach TensorFlow itself fails on is an
InventoryError (the hint names the opt-out); one that only makes TF's behaviour undefined or
wastes hardware is a warning. Pure: the plan applies them, and preflight applies the device-count
rule again once `gpus = "auto"` hosts have counted their GPUs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

from deployer.config.model import Strategy
from deployer.core.errors import InventoryError
from deployer.core.text import join_names


class TaskLike(Protocol):
    """What the rules read of a planned task (config.plan.Task has it)."""

    @property
    def role(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...


_ALL_REDUCE_ROLES = ("chief", "worker")


def effective(strategy: Strategy, roles: Collection[str]) -> Strategy:
    """The strategy the rules apply: "auto" read from the layout."""
    if strategy != Strategy.AUTO:
        return strategy
    return Strategy.PSS if "ps" in roles else Strategy.MWMS


def check(strategy: Strategy, roles: Sequence[str], file: str) -> None:
    """The rules TensorFlow itself fails on; raises InventoryError."""
    if strategy == Strategy.PSS and "chief" not in roles:
        raise InventoryError(
            file,
            "job.strategy",
            'strategy = "pss" needs a chief: ParameterServerStrategy\'s coordinator (the task '
            "that runs the training function) is the chief, and the job has none",
            hint='add { role = "chief" } to a host, or set strategy = "tf1" for TF1 '
            "between-graph replication (worker 0 leads)",
        )


def warnings(
    strategy: Strategy, tasks: Sequence[TaskLike], unknown_hosts: Collection[str] = ()
) -> list[str]:
    """The rules whose breach TensorFlow does not refuse: undefined behaviour, idle GPUs.

    Tasks on `unknown_hosts` (`gpus = "auto"` before preflight counted them) are left out of
    the device-count rule: preflight applies it once the counts are known.
    """
    kind = effective(strategy, {t.role for t in tasks})
    said: list[str] = []
    if kind == Strategy.MWMS:
        said += unequal_devices([t for t in tasks if t.host not in unknown_hosts])
    chiefless = not any(t.role == "chief" for t in tasks)
    if kind == Strategy.PSS and strategy == Strategy.AUTO and chiefless:
        said.append(
            "the job has ps tasks but no chief: ParameterServerStrategy needs a chief (its "
            'coordinator); a TF1 between-graph job needs none (set strategy = "tf1" to say so)'
        )
    if kind == Strategy.PSS:
        given = [t for t in tasks if t.role == "ps" and t.gpus]
        if given:
            said.append(
                f"ps tasks given GPUs ({_devices(given)}): a parameter server only holds "
                "variables, and ParameterServerStrategy places them on its CPU"
            )
    return said


def unequal_devices(tasks: Iterable[TaskLike]) -> list[str]:
    """MultiWorkerMirroredStrategy: "all workers need to use the same number of devices,
    otherwise the behavior is undefined" (the docstring of TF's MWMS all-reduce). A task
    without GPUs uses one device, its CPU."""
    members = [t for t in tasks if t.role in _ALL_REDUCE_ROLES]
    counts = {_device_count(t) for t in members}
    if len(counts) < 2:
        return []
    return [
        "MultiWorkerMirroredStrategy needs the same number of devices on every worker (and "
        f"the chief), or TF's behaviour is undefined: {_devices(members)}"
    ]


def _device_count(task: TaskLike) -> int:
    return len(task.gpus) or 1


def _devices(tasks: Iterable[TaskLike]) -> str:
    """'worker:0 3 GPUs, worker:1 1 GPU, chief:0 CPU'; tasks of equal count folded."""
    groups: dict[str, list[str]] = {}
    for t in tasks:
        n = len(t.gpus)
        groups.setdefault(f"{n} GPU{'s' if n != 1 else ''}" if n else "CPU", []).append(t.name)
    return "; ".join(f"{join_names(names)}: {what}" for what, names in groups.items())
