"""The roles table: everything tfdeploy knows about what a chief, worker, ps or evaluator is.

Plan, network check, start order, board, watch and the renderers read a task's role here and
nowhere else, so a new role (or a changed rule) is one row. Why each rule holds is in
../shared/TF_NOTES.md and docs/architecture.md ("Adding a role").
"""

from __future__ import annotations

from dataclasses import dataclass

BUILTIN_SERVER = "tfdeploy:server"  # a command the agent runs itself: a bare tf.distribute.Server


@dataclass(frozen=True)
class Role:
    name: str
    in_cluster: bool  # listed in the cluster dict of every task's TF_CONFIG
    # The job ends when every awaited task has exited (chief and workers run the training loop).
    awaited: bool
    # A server the others depend on: its failure fails the job even though it is never
    # awaited, it starts before them, and `up` waits until it listens on its port.
    serves: bool
    start_wave: int  # tasks start in waves, lowest first; each wave's servers listen first
    # Whom a task of this role opens TF connections to, with ps tasks in the job and without
    # (the network check tries exactly these).
    dials_with_ps: tuple[str, ...] = ()
    dials_without_ps: tuple[str, ...] = ()
    default_command: str | None = None  # when neither the task, the role nor the job names one
    implicit_gpus: bool = True  # takes part in splitting a host's unnamed GPUs
    restartable_alone: bool = False  # on_failure = "restart" may start it again on its own
    at_most: int | None = None  # per job
    # Ends by itself once the awaited tasks are done (an evaluator's last evaluation): `up`
    # gives it job.evaluator_grace before stopping it, instead of stopping it with the rest.
    finishes_after: bool = False
    # Its TF_CONFIG's cluster dict lists it alone, `{"evaluator": ["TF_ADDRESS:0"]}`, and no other
    # task's lists it. TensorFlow counts an evaluator as "its own cluster or its own partition of
    # a cluster": MultiWorkerMirroredStrategy() built on it reads cluster_spec["evaluator"]
    # (KeyError: 'evaluator' without it). Alone, because an eager MWMS there health-checks every
    # task its dict names (GetStatus at start and every 30 s, "aborting collectives" once one is
    # down) and the evaluator needs none of them; port 0, because it has no TF port: TF then
    # serves its own gRPC on a free port, or nothing in graph mode (Estimator). Measured with TF
    # 2.15.1 and 2.21.0 (docs/inventory.md, "Planning rules").
    lists_only_itself: bool = False


CHIEF = Role(
    "chief",
    in_cluster=True,
    awaited=True,
    serves=False,
    start_wave=2,
    dials_with_ps=("ps", "worker"),
    dials_without_ps=("chief", "worker"),
    at_most=1,
)
WORKER = Role(
    "worker",
    in_cluster=True,
    awaited=True,
    serves=False,
    start_wave=1,
    dials_with_ps=("ps",),
    dials_without_ps=("chief", "worker"),
    restartable_alone=True,
)
PS = Role(
    "ps",
    in_cluster=True,
    awaited=False,
    serves=True,
    start_wave=0,
    default_command=BUILTIN_SERVER,
    implicit_gpus=False,
    restartable_alone=True,
)
EVALUATOR = Role(
    "evaluator",
    in_cluster=False,  # a PSS chief whose cluster dict lists an evaluator waits for it forever
    awaited=False,
    serves=False,
    start_wave=2,
    finishes_after=True,
    lists_only_itself=True,
)
# Not a TF role: TensorBoard beside a task ([job.tensorboard]); in no cluster, never awaited.
SIDECAR = Role("tensorboard", in_cluster=False, awaited=False, serves=False, start_wave=2)

TF_ROLES = {r.name: r for r in (CHIEF, WORKER, PS, EVALUATOR)}  # what an inventory may name
ROLES = {**TF_ROLES, SIDECAR.name: SIDECAR}
ROLE_NAMES = tuple(TF_ROLES)
CLUSTER_ROLES = tuple(name for name, r in TF_ROLES.items() if r.in_cluster)
AWAITED_ROLES = tuple(name for name, r in TF_ROLES.items() if r.awaited)
# Where a tunnel or TensorBoard goes unless told: the first of these tasks the job has.
LEAD_TASKS = tuple(f"{name}:0" for name in AWAITED_ROLES)  # chief:0, else worker:0


def role(name: str) -> Role:
    return ROLES[name]


def has_port(name: str) -> bool:
    """Tasks in the cluster dict get a TF port; an evaluator serves nothing and gets none."""
    return ROLES[name].in_cluster
