"""The cluster conventions a task can read: TensorFlow's TF_CONFIG, Keras 3's distribution
variables, JAX's coordinator and torchrun's variables (docs/frameworks.md).

A job names its convention with `framework` (per role with `role_frameworks`); the plan gives
each task the variables of its convention and nothing of the others. Outside TensorFlow the
roles are ranks: one process per task, the chief (if any) rank 0 and then the workers in plan
order, rank 0 the coordinator whose TF port the others dial.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class Framework(enum.StrEnum):
    TENSORFLOW = "tensorflow"  # TF_CONFIG, as tf.distribute reads it
    KERAS = "keras"  # keras.distribution.initialize() (Keras 3, the JAX backend)
    JAX = "jax"  # jax.distributed.initialize()
    TORCH = "torch"  # torch.distributed's env:// (torchrun's variables)


RANK_ROLES = ("chief", "worker")  # the roles a rank convention accepts, rank 0 first
# Every variable a convention sets (the inventory's env may not set them: the plan does).
KERAS_VARIABLES = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)
# jax.distributed.initialize() reads JAX_COORDINATOR_ADDRESS itself (jax 0.10); the count and
# the id it reads only from a cluster it detects (Slurm, Open MPI, k8s), so the script passes
# int(os.environ["JAX_NUM_PROCESSES"]) and int(os.environ["JAX_PROCESS_ID"]).
JAX_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
TORCH_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)
VARIABLES = {
    Framework.TENSORFLOW: ("TF_CONFIG",),
    Framework.KERAS: KERAS_VARIABLES,
    Framework.JAX: JAX_VARIABLES,
    Framework.TORCH: TORCH_VARIABLES,
}


@dataclass(frozen=True)
class Rank:
    """One task's place among the ranks of its convention."""

    rank: int
    world: int
    local_rank: int  # among the ranks on its host
    local_world: int
    coordinator: tuple[str, int]  # rank 0's address and port
    addresses: str  # every rank's HOST:PORT, comma-separated, rank 0 first (one shared string)


def variables(framework: Framework, rank: Rank) -> dict[str, str]:
    """The variables a task of a rank convention is started with."""
    address, port = rank.coordinator
    coordinator = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    if framework == Framework.KERAS:
        return dict(
            zip(KERAS_VARIABLES, (rank.addresses, str(rank.world), str(rank.rank)), strict=True)
        )
    if framework == Framework.JAX:
        return dict(zip(JAX_VARIABLES, (coordinator, str(rank.world), str(rank.rank)), strict=True))
    assert framework == Framework.TORCH
    values = (address, port, rank.rank, rank.world, rank.local_rank, rank.local_world)
    return dict(zip(TORCH_VARIABLES, map(str, values), strict=True))


def ranks(members: Sequence[tuple[str, str, int]]) -> list[Rank]:
    """Ranks for (host, address, port) in rank order: rank 0 first, local ranks per host."""
    if not members:
        return []
    addresses = ",".join(f"[{a}]:{p}" if ":" in a else f"{a}:{p}" for _, a, p in members)
    per_host: dict[str, int] = {}
    local: list[int] = []
    for host, _, _ in members:
        local.append(per_host.get(host, 0))
        per_host[host] = local[-1] + 1
    coordinator = (members[0][1], members[0][2])
    return [
        Rank(
            rank=i,
            world=len(members),
            local_rank=local[i],
            local_world=per_host[host],
            coordinator=coordinator,
            addresses=addresses,
        )
        for i, (host, _, _) in enumerate(members)
    ]
