"""The cluster conventions a task can read: TensorFlow's TF_CONFIG, Keras 3's distribution
variables, JAX's coordinator and torchrun's variables (docs/frameworks.md).

A job names its convention with `framework` (per role with `role_frameworks`); the plan gives
each task the variables of its convention and nothing of the others. Outside TensorFlow the
roles are ranks: one process per task, the chief (if any) rank 0 and then the workers in plan
order, rank 0 the coordinator whose TF port the others dial.

Each convention is one record here (`RECORDS`): its variables and their values per rank (the
plan), the distributions its script imports (preflight's framework rule, up/frameworkrule.py)
and the words its initialisation dies of without its variables (the failure report's hint,
watch/convention.py). Those read the record; none spells a framework again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class Framework(enum.StrEnum):
    TENSORFLOW = "tensorflow"  # TF_CONFIG, as tf.distribute reads it
    KERAS = "keras"  # keras.distribution.initialize() (Keras 3, the JAX backend)
    JAX = "jax"  # jax.distributed.initialize()
    TORCH = "torch"  # torch.distributed's env:// (torchrun's variables)


RANK_ROLES = ("chief", "worker")  # the roles a rank convention accepts, rank 0 first


@dataclass(frozen=True)
class Rank:
    """One task's place among the ranks of its convention."""

    rank: int
    world: int
    local_rank: int  # among the ranks on its host
    local_world: int
    coordinator: tuple[str, int]  # rank 0's address and port
    addresses: str  # every rank's HOST:PORT, comma-separated, rank 0 first (one shared string)

    @property
    def coordinator_address(self) -> str:
        """Rank 0's HOST:PORT ([HOST]:PORT for an IPv6 address)."""
        address, port = self.coordinator
        return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True)
class FrameworkRecord:
    """One convention, whole: what the plan sets, what preflight looks for, what its script says
    when it was given another convention's variables."""

    name: Framework
    # Every variable it sets per task (the inventory's env may not set them: the plan does).
    variables: tuple[str, ...]
    # Their values for a rank, in `variables`' order; None: not a rank convention (TensorFlow:
    # the plan writes TF_CONFIG from the cluster, config/plan.py).
    values: Callable[[Rank], tuple[object, ...]] | None
    # The distributions its script imports, as the hello's dist-info (remote/hostfacts.py
    # FRAMEWORK_DISTRIBUTIONS) and wheel names spell them. TensorFlow's, in any of its several
    # distributions, are the TensorFlow rule's (up/tfrule.py).
    packages: tuple[str, ...]
    # What its initialisation says when its variables are missing: in a task's output, the sign
    # that the script wanted this convention (measured with torch 2.13, jax 0.10.2, keras 3.15.1).
    signs: tuple[str, ...]

    @property
    def by_rank(self) -> bool:
        """A rank convention: one process per task, chief and workers only (RANK_ROLES)."""
        return self.values is not None

    def env(self, rank: Rank) -> dict[str, str]:
        """The variables a task of this rank convention is started with."""
        assert self.values is not None, f"{self.name} has no ranks"
        return dict(zip(self.variables, map(str, self.values(rank)), strict=True))


# In the order the wrong-convention hint tries their signs: the rank conventions' own words
# before a mention of TF_CONFIG.
RECORDS: dict[Framework, FrameworkRecord] = {
    r.name: r
    for r in (
        FrameworkRecord(
            Framework.TORCH,
            variables=(
                "MASTER_ADDR",
                "MASTER_PORT",
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
            ),
            values=lambda r: (*r.coordinator, r.rank, r.world, r.local_rank, r.local_world),
            packages=("torch",),
            signs=("using env:// rendezvous", "MASTER_ADDR"),
        ),
        FrameworkRecord(
            Framework.KERAS,
            variables=(
                "KERAS_DISTRIBUTION_JOB_ADDRESSES",
                "KERAS_DISTRIBUTION_NUM_PROCESSES",
                "KERAS_DISTRIBUTION_PROCESS_ID",
            ),
            values=lambda r: (r.addresses, r.world, r.rank),
            packages=("keras", "jax", "jaxlib"),  # Keras 3's distribution runs on JAX
            # keras.distribution.initialize() says what jax.distributed.initialize() says.
            signs=("coordinator_address should be defined", "KERAS_DISTRIBUTION_"),
        ),
        # jax.distributed.initialize() reads JAX_COORDINATOR_ADDRESS itself (jax 0.10); the count
        # and the id it reads only from a cluster it detects (Slurm, Open MPI, k8s), so the
        # script passes int(os.environ["JAX_NUM_PROCESSES"]) and int(os.environ["JAX_PROCESS_ID"]).
        FrameworkRecord(
            Framework.JAX,
            variables=("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"),
            values=lambda r: (r.coordinator_address, r.world, r.rank),
            packages=("jax", "jaxlib"),
            signs=("coordinator_address should be defined",),
        ),
        FrameworkRecord(
            Framework.TENSORFLOW,
            variables=("TF_CONFIG",),
            values=None,
            packages=(),
            # A script reading os.environ["TF_CONFIG"] where it was not set; the bare name is no
            # sign (a torch script that prints its environment says it and failed otherwise).
            signs=("KeyError: 'TF_CONFIG'",),
        ),
    )
}

# The failure report's hint for a task whose output shows one of another convention's signs:
# `framework` the task's, `choices` the settings that would give it what it looked for.
WRONG_CONVENTION_HINT = (
    "the script looks for the variables of another cluster convention than this task's "
    '("{framework}"): set [job] {choices} (or role_frameworks for its role; docs/frameworks.md)'
)


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
